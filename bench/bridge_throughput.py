"""Bridge throughput against the raw confluent-kafka poll() ceiling of the same topic, measured in the same run.

Fills a topic with real librdkafka telemetry pushes (captured through the sandbox, then replayed with distinct
client instance ids), then consumes it: once with a bare confluent-kafka consume() loop, then with the bridge
(each consumer backend, and with delta → cumulative) exporting to an acknowledging OTLP/gRPC receiver in another
process. Each run is its own process, so CPU and peak RSS are the run's own.
Usage: .venv/bin/python bench/bridge_throughput.py [RECORDS]   (default 100000)
"""

from __future__ import annotations

import multiprocessing
import resource
import sys
import threading
import time
from concurrent import futures

import confluent_kafka

TOPIC = "bench-metrics"
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


def fill(bootstrap: str, pushes: list[tuple[bytes, list[tuple[str, bytes]]]], records: int) -> int:
    """Write `records` records cycling the captured pushes; returns the value bytes written."""
    from kcm_common.kafka import KafkaSettings, ensure_topic

    ensure_topic(KafkaSettings(bootstrap), TOPIC, partitions=1)
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                                         "batch.num.messages": 1000, "queue.buffering.max.messages": 200000})
    written = 0
    for i in range(records):
        value, headers = pushes[i % len(pushes)]
        instance = f"00000000-0000-4000-8000-{i % INSTANCES:012d}"
        headers = [(k, instance.encode() if k == "client_instance_id" else v) for k, v in headers]
        while True:
            try:
                producer.produce(TOPIC, key=instance.encode(), value=value, headers=headers)
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
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def ceiling(bootstrap: str, records: int, out: multiprocessing.Queue) -> None:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ceiling",
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                         "session.timeout.ms": 6000})
    consumer.subscribe([TOPIC])
    seen, started, cpu0 = 0, None, 0.0
    while seen < records:
        messages = consumer.consume(500, 1.0)
        if messages and started is None:
            started, (cpu0, _) = time.perf_counter(), _usage()
        seen += sum(1 for m in messages if m.error() is None)
    elapsed = time.perf_counter() - started
    cpu, rss = _usage()
    consumer.close()
    out.put({"name": "confluent-kafka poll() ceiling", "seconds": elapsed, "records": seen, "points": 0,
             "cpu_s": cpu - cpu0, "rss_kb": rss})


def bridge_run(bootstrap: str, endpoint: str, records: int, backend: str, cumulative: bool,
               out: multiprocessing.Queue) -> None:
    import logging

    from kcm_bridge import config as bridge_config
    from kcm_bridge.pipeline import Bridge

    logging.basicConfig(level=logging.WARNING)
    group = f"bench-{backend}-{'cumulative' if cumulative else 'delta'}"
    config = bridge_config.load(env={}, endpoints=[endpoint], insecure=True, overrides={
        ("kafka", "bootstrap_servers"): bootstrap, ("kafka", "topics"): [TOPIC], ("kafka", "group_id"): group,
        ("kafka", "client"): backend, ("temporality", "delta_to_cumulative"): cumulative,
        # Tansu holds each JoinGroup for half the session timeout.
        ("kafka", "properties"): {"session.timeout.ms": "6000"}})
    bridge = Bridge(config)
    thread = threading.Thread(target=bridge.run, daemon=True)
    thread.start()
    metrics = bridge.metrics
    started, cpu0 = None, 0.0
    while True:
        consumed = metrics.value(metrics.records)
        if consumed and started is None:
            started, (cpu0, _) = time.perf_counter(), _usage()
        if consumed >= records and metrics.value(metrics.inflight_bytes) == 0 and bridge._tracker.pending() == 0:
            break
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    cpu, rss = _usage()
    points = metrics.value(metrics.points)
    bridge.stop()
    thread.join(60)
    out.put({"name": f"bridge {backend}{' + delta→cumulative' if cumulative else ''}", "seconds": elapsed,
             "records": consumed, "points": points, "cpu_s": cpu - cpu0, "rss_kb": rss})


def _in_process(target, *args) -> dict:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=target, args=(*args, out))
    process.start()
    result = out.get(timeout=900)
    process.join(60)
    return result


def main() -> None:
    from kcm_sandbox.broker import EmbeddedBroker

    records = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    pushes = capture_pushes()
    context = multiprocessing.get_context("spawn")
    with EmbeddedBroker() as broker:
        written = fill(broker.bootstrap, pushes, records)
        print(f"topic: {records} records from {len(pushes)} real librdkafka pushes, "
              f"{written / records:.0f} bytes/record on average")
        ports, stop = context.Queue(), context.Event()
        collector = context.Process(target=receiver, args=(ports, stop))
        collector.start()
        endpoint = f"127.0.0.1:{ports.get(timeout=30)}"
        try:
            results = [_in_process(ceiling, broker.bootstrap, records)]
            for backend, cumulative in (("confluent-kafka", False), ("kafka-python", False),
                                        ("confluent-kafka", True)):
                results.append(_in_process(bridge_run, broker.bootstrap, endpoint, records, backend, cumulative))
        finally:
            stop.set()
            collector.join(10)
    top = results[0]["records"] / results[0]["seconds"]
    print(f"{'run':42} {'records/s':>10} {'points/s':>10} {'CPU µs/rec':>11} {'peak RSS MiB':>13} {'of ceiling':>11}")
    for result in results:
        rate = result["records"] / result["seconds"]
        print(f"{result['name']:42} {rate:>10,.0f} {result['points'] / result['seconds']:>10,.0f} "
              f"{result['cpu_s'] / result['records'] * 1e6:>11.1f} {result['rss_kb'] / 1024:>13.0f} "
              f"{rate / top:>11.2f}")


if __name__ == "__main__":
    main()
