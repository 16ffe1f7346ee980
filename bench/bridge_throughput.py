"""Bridge throughput against the raw confluent-kafka poll() ceiling of the same topic, measured in the same run.

Fills a topic with real librdkafka telemetry pushes (captured through the sandbox, then replayed with distinct
client instance ids), then consumes it: with a bare confluent-kafka poll() loop (the baseline the ratio is
against), a bare consume() loop (batches of 500, the fastest way to read) and a poll() loop that also reads each
record's headers (as the bridge must), then with the bridge
(each consumer backend, with delta → cumulative, and without gzip) exporting to an acknowledging OTLP/gRPC receiver
in another process. Each run is its own process, so CPU and peak RSS are the run's own. A last run reads a second
topic a tenth as large (ten times with --tenfold): the bridge's peak memory should not grow with the backlog.
Usage: .venv/bin/python bench/bridge_throughput.py [RECORDS] [--tenfold]   (default 100000)
"""

from __future__ import annotations

import multiprocessing
import re
import resource
import sys
import threading
import time
from concurrent import futures

import confluent_kafka

TOPIC = "bench-metrics"
OTHER_TOPIC = "bench-metrics-other"
INSTANCES = 1000
_EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


def capture_pushes(seconds: float = 4.0) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    """Real pushes of a busy librdkafka producer, as the sandbox's receiver wrote them."""
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    from kcm_common.kafka import KafkaSettings, ensure_topic
    from kcm_sandbox.runner import Sandbox, SandboxOptions

    with Sandbox(SandboxOptions(listen=("127.0.0.1", 0))) as sandbox:
        admin = KafkaAdminClient(bootstrap_servers=sandbox.bootstrap)
        admin.alter_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, "all",
                                            configs={"metrics": "*", "interval.ms": "100"})], raise_on_unknown=False)
        admin.close()
        ensure_topic(KafkaSettings(sandbox.bootstrap), "traffic")
        producer = confluent_kafka.Producer({"bootstrap.servers": sandbox.bootstrap, "linger.ms": 5})
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            producer.produce("traffic", b"x" * 100)
            producer.poll(0.01)
        producer.flush(5)
        del producer
        reader = confluent_kafka.Consumer({"bootstrap.servers": sandbox.bootstrap, "group.id": "capture"})
        reader.assign([confluent_kafka.TopicPartition(sandbox.options.topic, 0, confluent_kafka.OFFSET_BEGINNING)])
        pushes, deadline = [], time.monotonic() + 10
        while len(pushes) < 200 and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is not None and message.error() is None:
                pushes.append((message.value(), message.headers() or []))
        reader.close()
    if not pushes:
        raise SystemExit("no telemetry pushes were captured")
    return pushes


def fill(bootstrap: str, topic: str, pushes: list[tuple[bytes, list[tuple[str, bytes]]]], records: int) -> int:
    """Write `records` records cycling the captured pushes; returns the value bytes written."""
    from kcm_common.kafka import KafkaSettings, ensure_topic

    ensure_topic(KafkaSettings(bootstrap), topic, partitions=1)
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                                         "batch.num.messages": 1000, "queue.buffering.max.messages": 200000})
    written = 0
    for i in range(records):
        value, headers = pushes[i % len(pushes)]
        instance = f"00000000-0000-4000-8000-{i % INSTANCES:012d}"
        headers = [(k, instance.encode() if k == "client_instance_id" else v) for k, v in headers]
        while True:
            try:
                producer.produce(topic, key=instance.encode(), value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
        written += len(value)
        producer.poll(0)
    if producer.flush(120) != 0:
        raise SystemExit("records were left unsent")
    return written


def receiver(port_out: multiprocessing.Queue, stop: multiprocessing.Event) -> None:
    """An OTLP/gRPC receiver that acknowledges every Export without decoding it."""
    import grpc

    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.metrics.v1.MetricsService",
        {"Export": grpc.unary_unary_rpc_method_handler(lambda request, context: b"")})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port_out.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    stop.wait()
    server.stop(0)


def _usage() -> tuple[float, int]:
    """(CPU seconds, peak RSS KiB) of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # ru_maxrss survives exec on Linux, so a spawned run would report at least its parent's peak; VmHWM is its own.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            peak = next((int(line.split()[1]) for line in status if line.startswith("VmHWM:")), usage.ru_maxrss)
    except OSError:
        peak = usage.ru_maxrss
    return usage.ru_utime + usage.ru_stime, peak


def ceiling(bootstrap: str, records: int, mode: str, out: multiprocessing.Queue) -> None:
    """A bare consumer reading every record's value: one poll() per record (the issue's baseline), consume() in
    batches of 500 (the fastest confluent-kafka reads), or poll() also reading each record's headers, which the
    bridge must (the floor of any consumer that needs them: confluent-kafka builds a Python object per header)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-ceiling-{mode}",
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                         "session.timeout.ms": 6000})
    consumer.subscribe([TOPIC])
    seen, size, started, cpu0 = 0, 0, None, 0.0
    while seen < records:
        messages = consumer.consume(500, 1.0) if mode == "consume" else [m for m in [consumer.poll(1.0)] if m]
        if messages and started is None:
            started, (cpu0, _) = time.perf_counter(), _usage()
        for message in messages:
            if message.error() is None:
                seen += 1
                size += len(message.value())
                if mode == "headers":
                    size += len(message.headers() or ())
    elapsed = time.perf_counter() - started
    cpu, rss = _usage()
    consumer.close()
    name = "confluent-kafka poll() + headers()" if mode == "headers" else f"confluent-kafka {mode}() ceiling"
    out.put({"name": name, "seconds": elapsed, "records": seen, "points": 0,
             "cpu_s": cpu - cpu0, "rss_kb": rss})


def bridge_run(bootstrap: str, endpoint: str, topic: str, records: int, run: dict, out: multiprocessing.Queue) -> None:
    import logging

    from kcm_bridge import config as bridge_config
    from kcm_bridge.pipeline import Bridge, tune_interpreter

    logging.basicConfig(level=logging.WARNING)
    config = bridge_config.load(env={}, overrides={
        ("kafka", "bootstrap_servers"): bootstrap, ("kafka", "topics"): [topic],
        ("kafka", "group_id"): "bench-" + "-".join(re.findall(r"[a-z0-9]+", f"{topic} {run['name']}")),
        ("kafka", "client"): run["backend"],
        ("temporality", "delta_to_cumulative"): run.get("cumulative", False),
        ("endpoints",): [{"endpoint": endpoint, "insecure": True, "compression": run.get("compression", "gzip")}],
        # Tansu holds each JoinGroup for half the session timeout.
        ("kafka", "properties"): {"session.timeout.ms": "6000"}})
    tune_interpreter()   # as `kcm bridge` does
    bridge = Bridge(config)
    thread = threading.Thread(target=bridge.run, daemon=True)
    thread.start()
    metrics = bridge.metrics
    started, base, cpu0 = None, 0.0, 0.0
    while True:
        consumed = metrics.value(metrics.records)
        if consumed and started is None:
            started, base, (cpu0, _) = time.perf_counter(), consumed, _usage()
        if consumed >= records and metrics.value(metrics.inflight_bytes) == 0 and bridge._tracker.pending() == 0:
            break
        time.sleep(0.05)  # each look collects the whole registry: rarely, so the bridge keeps the CPU
    elapsed = time.perf_counter() - started
    cpu, rss = _usage()
    points = metrics.value(metrics.points) * (consumed - base) / consumed   # the timed records' share
    bridge.stop()
    thread.join(60)
    out.put({"name": f"bridge {run['name']}", "seconds": elapsed, "records": consumed - base, "points": points,
             "cpu_s": cpu - cpu0, "rss_kb": rss})


def _in_process(target, *args) -> dict:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=target, args=(*args, out))
    process.start()
    result = out.get(timeout=900)
    process.join(60)
    return result


RUNS = (
    {"name": "confluent-kafka", "backend": "confluent-kafka"},
    {"name": "kafka-python", "backend": "kafka-python"},
    {"name": "confluent-kafka + delta→cumulative", "backend": "confluent-kafka", "cumulative": True},
    {"name": "confluent-kafka, no gzip", "backend": "confluent-kafka", "compression": "none"},
)


def main() -> None:
    from kcm_sandbox.broker import EmbeddedBroker

    arguments = [a for a in sys.argv[1:] if not a.startswith("--")]
    records = int(arguments[0]) if arguments else 100_000
    # The memory check reads a second topic a tenth as large, or with --tenfold ten times as large (slow to fill).
    other = records * 10 if "--tenfold" in sys.argv else records // 10
    pushes = capture_pushes()
    context = multiprocessing.get_context("spawn")
    with EmbeddedBroker() as broker:
        written = fill(broker.bootstrap, TOPIC, pushes, records)
        fill(broker.bootstrap, OTHER_TOPIC, pushes, other)
        print(f"topic: {records} records from {len(pushes)} real librdkafka pushes, "
              f"{written / records:.0f} bytes/record on average")
        ports, stop = context.Queue(), context.Event()
        collector = context.Process(target=receiver, args=(ports, stop))
        collector.start()
        endpoint = f"127.0.0.1:{ports.get(timeout=30)}"
        try:
            results = [_in_process(ceiling, broker.bootstrap, records, mode)
                       for mode in ("poll", "consume", "headers")]
            bridges = [_in_process(bridge_run, broker.bootstrap, endpoint, TOPIC, records, run) for run in RUNS]
            results += bridges
            # The same bridge over another backlog: its peak memory should not depend on the backlog.
            second = _in_process(bridge_run, broker.bootstrap, endpoint, OTHER_TOPIC, other, RUNS[0])
        finally:
            stop.set()
            collector.join(10)
    polled, consumed = (result["records"] / result["seconds"] for result in results[:2])
    print(f"{'run':42} {'records/s':>10} {'points/s':>10} {'CPU µs/rec':>11} {'peak RSS MiB':>13} "
          f"{'of poll()':>10} {'of consume()':>13}")
    for result in results:
        rate = result["records"] / result["seconds"]
        print(f"{result['name']:42} {rate:>10,.0f} {result['points'] / result['seconds']:>10,.0f} "
              f"{result['cpu_s'] / result['records'] * 1e6:>11.1f} {result['rss_kb'] / 1024:>13.0f} "
              f"{rate / polled:>10.2f} {rate / consumed:>13.2f}")
    backlogs = sorted([(records, bridges[0]), (other, second)], key=lambda pair: pair[0])
    print(f"peak RSS of {bridges[0]['name']}: " + ", ".join(
        f"{result['rss_kb'] / 1024:.0f} MiB with a {count} record backlog ({result['records'] / result['seconds']:,.0f}"
        f" records/s)" for count, result in backlogs))


if __name__ == "__main__":
    main()
