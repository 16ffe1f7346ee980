"""Model-based test of `kcm demo` against docs/demo.md (and README's demo section), without the real pipeline.

Modelled, with seeded random inputs plus directed edges:
- the Options table: `--duration` (above 0, at most 86400, default 60), `--output live|jsonl` (live), `--rollup`
  (off; needs the 'rollup' extra, checked before the demo starts), `--java auto|yes|no` (auto: Java when `java` and
  the built receiver are both here; yes fails without them), `--subscriptions DIR` (default: the demo's own copy of
  examples/demo), run through `kcm_cli.main.main` up to the pipeline start (kcm_demo.run._run, a recorder); a bad
  value is exit 2, one line on stderr naming the option, no traceback, nothing started;
- the live table (kcm_demo.view.fleet_table over a kcm_demo.fleet.Fleet fed OTLP exports): one row per client
  instance with the documented columns; where the table does not fit, no frame, the source dropped (and its address
  named in the title) when every client pushes from one address, rebalances dropped when no client has a count, the
  software shortened to its name, client ids never cut; '-' for a client without a rebalance count;
- the jsonl summary (`--output jsonl`, the demo's own writer with the pipeline's parts replaced): one standard JSON
  object per client instance with identity, push count, the broker-side attributes and every metric's last value
  (delta sums accumulated, NaN and infinities as null);
- the working directory: $KCM_DEMO_DIR, else build/demo in a checkout, else a new temporary kcm-demo-… directory.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from rich.console import Console

import kcm_demo
from kcm_demo.fleet import Fleet
from kcm_demo.view import fleet_table

SEEDS = range(714, 714 + 12)
DAY_S = 86400                                   # docs/demo.md Options: --duration at most 86400
ROLLUP_MODULES = ("pyspark", "pyarrow")         # what the 'rollup' extra installs (pyproject's extras)
SECOND_NS = 1_000_000_000

# docs/demo.md: the live view's columns, in the order the docs (and README's example) list them.
FULL_COLUMNS = ["client id", "software", "source", "produce ms", "queue ms", "fetch ms", "rebalances", "age s",
                "metrics", "pushes"]
NUMBER_COLUMNS = ["produce ms", "queue ms", "fetch ms", "rebalances", "age s", "metrics", "pushes"]
# KIP-714's metric names behind the documented headings (produce request latency, record queue time, consumer fetch
# latency, rebalances): librdkafka's and kafka-clients' names for produce latency.
PRODUCE_LATENCY = ("org.apache.kafka.producer.request.latency.avg",
                   "org.apache.kafka.producer.node.request.latency.avg")
QUEUE_TIME = "org.apache.kafka.producer.record.queue.time.avg"
FETCH_LATENCY = "org.apache.kafka.consumer.fetch.manager.fetch.latency.avg"
REBALANCES = "org.apache.kafka.consumer.coordinator.rebalance.total"
# docs/contract.md: the attributes only the broker side (the receiver) adds.
BROKER_ATTRIBUTES = ("principal", "listener_name", "security_protocol", "broker_id", "cluster_id")
FRAME = set("│┃┏┓┗┛┡┩└┘╭╮╰╯┳┻╇┼━")


# --- a random fleet and its reference model ----------------------------------------------------------------------

@dataclass
class ModelClient:
    """What the docs say the demo shows of one client instance, kept beside the pushes that tell it."""

    instance_id: str
    client_id: str
    software: str
    version: str
    address: str
    port: str | None
    broker: dict[str, str]
    kind: str                                   # producer, consumer, java-consumer
    values: dict[str, float | None] = field(default_factory=dict)   # every metric's last value (deltas summed)
    headline: dict[str, float] = field(default_factory=dict)
    delta_totals: dict[str, float] = field(default_factory=dict)
    pushes: int = 0
    last_push_s: float = 0.0

    @property
    def source(self) -> str:
        return f"{self.address}:{self.port}" if self.port else self.address


def _metric(name: str, kind: str, value: float, time_ns: int) -> metrics_pb2.Metric:
    metric = metrics_pb2.Metric(name=name)
    if kind == "gauge":
        metric.gauge.data_points.add(as_double=value, time_unix_nano=time_ns)
    else:
        metric.sum.aggregation_temporality = (metrics_pb2.AGGREGATION_TEMPORALITY_DELTA if kind == "delta"
                                              else metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE)
        metric.sum.is_monotonic = True
        if math.isfinite(value) and value == int(value):
            metric.sum.data_points.add(as_int=int(value), time_unix_nano=time_ns)
        else:
            metric.sum.data_points.add(as_double=value, time_unix_nano=time_ns)
    return metric


def _headline_value(rng: random.Random) -> float:
    """A value as the README shows them: a count, a two-decimal average, or a larger one shown whole."""
    return rng.choice([float(rng.randrange(0, 200)), rng.randrange(1, 9999) / 100,
                       rng.randrange(1000, 99999) + rng.choice([0.1, 0.2, 0.3, 0.4, 0.6, 0.8]),
                       float(rng.randrange(1000, 3_000_000))])


def random_fleet(rng: random.Random, one_address: bool | None = None, rebalances: bool | None = None,
                 exports: list | None = None) -> tuple[Fleet, list[ModelClient], float]:
    """A fleet fed random pushes of random clients (each export also added to `exports`), the model of each
    client, and the view's clock."""
    one_address = rng.random() < 0.5 if one_address is None else one_address
    rebalances = rng.random() < 0.5 if rebalances is None else rebalances
    shared = rng.choice(["127.0.0.1", "10.0.3.17", "192.168.100.200"])
    id_pool = ["payments-producer", "orders-consumer", "inventory-java-consumer", "a", "x" * rng.randrange(10, 45),
               f"app-{rng.randrange(1000)}-producer"]
    clients: list[ModelClient] = []
    for index in range(rng.randint(1, 7)):
        kind = rng.choice(["producer", "consumer", "java-consumer"])
        software = ("apache-kafka-java" if kind == "java-consumer"
                    else rng.choice(["confluent-kafka-python", "librdkafka", "apache-kafka-java", "kgo"]))
        address = shared if one_address else f"10.{index}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        broker_keys = rng.sample(BROKER_ATTRIBUTES, rng.randint(0, len(BROKER_ATTRIBUTES)))
        clients.append(ModelClient(
            instance_id=f"{rng.getrandbits(64):016x}-{index}", client_id=rng.choice(id_pool), software=software,
            version=rng.choice(["2.6.1", "3.9.0", "4.1.0-rc1"]), address=address,
            port=rng.choice([None, str(rng.randrange(1024, 65536))]),
            broker={key: f"{key}-{rng.randrange(100)}" for key in broker_keys}, kind=kind))
    if not one_address and len(clients) == 1:
        clients.append(_from_elsewhere(clients[0], rng))
    if rebalances and not any(c.kind == "java-consumer" for c in clients):
        clients[0].kind = "java-consumer"

    # Which metrics each client sends: (name, kind), the headline ones by its role.
    sends: dict[str, list[tuple[str, str]]] = {}
    for client in clients:
        metrics = []
        if client.kind == "producer":
            if rng.random() < 0.8:
                metrics.append((rng.choice(PRODUCE_LATENCY), "gauge"))
            if rng.random() < 0.8:
                metrics.append((QUEUE_TIME, "gauge"))
        else:
            if rng.random() < 0.8:
                metrics.append((FETCH_LATENCY, "gauge"))
            if client.kind == "java-consumer" and rebalances:
                metrics.append((REBALANCES, "cumulative"))
        for n in range(rng.randrange(0, 4)):
            metrics.append((f"org.apache.kafka.client.other{n}.{rng.randrange(100)}",
                            rng.choice(["gauge", "delta", "cumulative"])))
        if not metrics:
            metrics.append(("org.apache.kafka.client.connection.creation.total", "delta"))
        sends[client.instance_id] = metrics

    # Pushes 5 s apart per client, interleaved across clients, each received later than the one before.
    order = [client for client in clients for _ in range(rng.randint(1, 4))]
    rng.shuffle(order)
    fleet, received_s, push_number = Fleet(), 1_000.0, {c.instance_id: 0 for c in clients}
    for client in order:
        push_number[client.instance_id] += 1
        time_ns = 1_700_000_000 * SECOND_NS + push_number[client.instance_id] * 5 * SECOND_NS
        metrics = sends[client.instance_id]
        chosen = [m for m in metrics if rng.random() < 0.7] or [metrics[0]]
        built = []
        for offset_ms, (name, kind) in enumerate(chosen):
            if name == REBALANCES:
                value = float(client.headline.get("rebalances", 0) + rng.randrange(0, 3))
            elif name in (QUEUE_TIME, FETCH_LATENCY, *PRODUCE_LATENCY):
                value = _headline_value(rng)
            else:
                value = rng.choice([float(rng.randrange(0, 50)), rng.uniform(-5, 5), math.nan, math.inf, -math.inf])
            spread_ns = offset_ms * 3_000_000 if client.software == "apache-kafka-java" else 0
            built.append(_metric(name, kind, value, time_ns + spread_ns))
            if kind == "delta":
                value = client.delta_totals[name] = client.delta_totals.get(name, 0.0) + value
            client.values[name] = value if math.isfinite(value) else None
            heading = {QUEUE_TIME: "queue ms", FETCH_LATENCY: "fetch ms", REBALANCES: "rebalances",
                       **{n: "produce ms" for n in PRODUCE_LATENCY}}.get(name)
            if heading:
                client.headline[heading] = value
        received_s += rng.choice([0.1, 0.4, 1.0, 2.5])
        request = _export(client, built, per_metric=client.software == "apache-kafka-java" and rng.random() < 0.7)
        fleet.ingest(request, received_s)
        if exports is not None:
            exports.append(request)
        client.pushes += 1
        client.last_push_s = received_s
    return fleet, clients, received_s + rng.choice([0.0, 0.05, 1.3, 17.0])


def _from_elsewhere(client: ModelClient, rng: random.Random) -> ModelClient:
    """Another instance of the same client from another address, so that addresses differ."""
    return ModelClient(instance_id=client.instance_id + "-b", client_id=client.client_id, software=client.software,
                       version=client.version, address=f"172.16.0.{rng.randrange(1, 255)}", port=client.port,
                       broker=dict(client.broker), kind=client.kind)


def _export(client: ModelClient, metrics: list[metrics_pb2.Metric], per_metric: bool) -> ExportMetricsServiceRequest:
    """One push as the bridge exports it; kafka-clients may put each metric in a ResourceMetrics of its own."""
    identity = {"client_instance_id": client.instance_id, "client_id": client.client_id,
                "client_software_name": client.software, "client_software_version": client.version,
                "client_source_address": client.address, "client_source_port": client.port,
                "push_interval_ms": "5000", **client.broker}
    request = ExportMetricsServiceRequest()
    for group in ([[metric] for metric in metrics] if per_metric else [metrics]):
        resource_metrics = request.resource_metrics.add()
        for key, value in identity.items():
            if value is not None:
                resource_metrics.resource.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
        resource_metrics.scope_metrics.add().metrics.extend(group)
    return request


# --- the live table ----------------------------------------------------------------------------------------------

def _render(fleet: Fleet, now_s: float, title: str, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(fleet_table(fleet, now_s, title, width=width))
    return [line.rstrip() for line in console.export_text().splitlines()]


def _number_ok(cell: str, value: float | None) -> bool:
    """README's way with numbers: '-' for none, counts whole, averages below 100 with two decimals, larger ones
    whole (thousands separators allowed)."""
    if value is None:
        return cell == "-"
    plain = cell.replace(",", "")
    if value == int(value) or abs(value) >= 100:
        return "." not in plain and abs(float(plain) - value) <= 0.5
    return len(plain.partition(".")[2]) == 2 and abs(float(plain) - value) <= 0.005 + 1e-9


def _cells(client: ModelClient, now_s: float, headings: list[str]) -> dict[str, float | None]:
    values: dict[str, float | None] = {h: client.headline.get(h) for h in headings if h in client.headline}
    return {**{h: None for h in headings}, **values, "age s": now_s - client.last_push_s,
            "metrics": float(len(client.values)), "pushes": float(client.pushes)}


def _check_numbers(row: list[str], client: ModelClient, now_s: float, columns: list[str], context: str) -> None:
    numbers = [c for c in columns if c in NUMBER_COLUMNS]
    expected = _cells(client, now_s, numbers)
    for heading, cell in zip(numbers, row[len(columns) - len(numbers):]):
        if heading == "age s":
            assert abs(float(cell) - expected[heading]) <= 0.05 + 1e-9 and cell.count(".") == 1, (context, cell)
        else:
            assert _number_ok(cell, expected[heading]), f"{context}: {heading} {cell!r} vs {expected[heading]}"


def full_width(clients: list[ModelClient], now_s: float) -> int:
    """How wide the framed table is: each column as wide as its widest cell or heading, one space either side of
    each cell, a border between and around the columns."""
    widths = []
    for column in FULL_COLUMNS:
        cells = [_full_cell(c, now_s, column) for c in clients]
        widths.append(max(len(column), *(len(cell) for cell in cells)))
    return sum(w + 2 for w in widths) + len(widths) + 1


def _full_cell(client: ModelClient, now_s: float, column: str) -> str:
    if column == "client id":
        return client.client_id
    if column == "software":
        return f"{client.software} {client.version}"
    if column == "source":
        return client.source
    value = _cells(client, now_s, NUMBER_COLUMNS)[column]
    if column == "age s":
        return f"{value:.1f}"
    return "-" if value is None else (f"{value:,.0f}" if value == int(value) or abs(value) >= 100 else f"{value:.2f}")


def compact_columns(clients: list[ModelClient]) -> list[str]:
    """The columns that tell rows apart: no source when all share an address, no rebalances when none counts."""
    one_address = len({c.address for c in clients}) == 1
    counted = any("rebalances" in c.headline for c in clients)
    return [c for c in FULL_COLUMNS if not (c == "source" and one_address) and not (c == "rebalances" and not counted)]


def compact_width(clients: list[ModelClient], now_s: float) -> int:
    """The frameless table: one space between columns, a number's heading a word per line, the software's name."""
    widths = []
    for column in compact_columns(clients):
        cells = [client.software if column == "software" else _full_cell(client, now_s, column) for client in clients]
        heading = max(column.split(), key=len) if column in NUMBER_COLUMNS else column
        widths.append(max(len(heading), *(len(cell) for cell in cells)))
    return sum(widths) + len(widths) - 1


def check_table(lines: list[str], clients: list[ModelClient], now_s: float, title: str, width: int,
                context: str) -> None:
    text = "\n".join(lines)
    natural = full_width(clients, now_s)
    assert lines[0].startswith(title), context
    if natural <= width:
        # It fits: the framed table with every documented column, software with its version.
        header = next(line for line in lines if "┃" in line)
        assert [cell.strip() for cell in header.strip("┃").split("┃")] == FULL_COLUMNS, context
        rows = [[cell.strip() for cell in line.strip("│").split("│")] for line in lines if line.startswith("│")]
        assert sorted(r[0] for r in rows) == sorted(c.client_id for c in clients), context
        _match_rows(rows, clients, context, lambda row, client: (
            row[1] == f"{client.software} {client.version}" and row[2] == client.source
            and _numbers_match(row, client, now_s, FULL_COLUMNS)))
        return
    # It does not fit: no frame, the columns that tell no rows apart dropped, the software shortened to its name.
    assert not FRAME & set(text), f"{context}: frame drawn at width {width} (table {natural})\n{text}"
    columns = compact_columns(clients)
    addresses = {c.address for c in clients}
    # The title (it may wrap), naming the address when every client shares it.
    wanted = _words(title) + (["all", "from", next(iter(addresses))] if len(addresses) == 1 else [])
    title_lines = next(k for k in range(1, len(lines)) if len(_words(" ".join(lines[:k]))) >= len(wanted))
    assert _words(" ".join(lines[:title_lines])) == wanted, f"{context}: title is not {wanted}\n{text}"
    rule = next(i for i, line in enumerate(lines) if line and set(line) <= {"─", " "})
    rows_lines = [line for line in lines[rule + 1:] if line and not line.startswith(" ")]
    assert len(rows_lines) == len(clients), f"{context}: {len(rows_lines)} rows for {len(clients)} clients\n{text}"
    if width >= max(len(c.client_id) for c in clients) + 1:
        assert sorted(line.split()[0] for line in rows_lines) == sorted(c.client_id for c in clients), \
            f"{context}: a client id cut at width {width}\n{text}"
    if compact_width(clients, now_s) > width:
        return  # narrower than even the frameless table: the docs promise no more than the above
    header_words = " ".join(lines[title_lines:rule]).split()
    assert sorted(header_words) == sorted(" ".join(columns).split()), f"{context}: headings {header_words}\n{text}"
    rows = [line.split() for line in rows_lines]
    _match_rows(rows, clients, context, lambda row, client: (
        len(row) == len(columns) and row[1] == client.software
        and ("source" not in columns or row[2] == client.source)
        and _numbers_match(row, client, now_s, columns)))


def _words(text: str) -> list[str]:
    return [word for word in text.split() if word != "·"]


def _numbers_match(row: list[str], client: ModelClient, now_s: float, columns: list[str]) -> bool:
    try:
        _check_numbers(row, client, now_s, columns, "")
    except (AssertionError, ValueError):
        return False
    return True


def _match_rows(rows: list[list[str]], clients: list[ModelClient], context: str, matches) -> None:
    """Every client instance has a row of its own (clients may share a client id)."""
    free = list(rows)
    for client in sorted(clients, key=lambda c: -len(c.headline)):
        found = next((row for row in free if row[0] == client.client_id and matches(row, client)), None)
        assert found is not None, f"{context}: no row for {client}\nrows: {free}"
        free.remove(found)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_live_table_shows_one_row_per_client_and_gives_way_as_documented(seed):
    rng = random.Random(seed)
    for case in range(12):
        fleet, clients, now_s = random_fleet(rng)
        title = rng.choice(["clients", "client instances · 3 s left"])
        natural = full_width(clients, now_s)
        compact = compact_width(clients, now_s)
        widths = {natural, natural - 1, compact, rng.randrange(40, 240), 120, 80}
        for width in sorted(w for w in widths if w >= 30):
            check_table(_render(fleet, now_s, title, width), clients, now_s, title, width,
                        f"seed {seed} case {case} width {width}")


@pytest.mark.parametrize(("one_address", "rebalances"), [(True, True), (True, False), (False, True), (False, False)])
def test_a_narrow_table_drops_exactly_the_columns_that_tell_no_rows_apart(one_address, rebalances):
    rng = random.Random(f"{one_address}-{rebalances}")
    fleet, clients, now_s = random_fleet(rng, one_address=one_address, rebalances=rebalances)
    width = full_width(clients, now_s) - 1
    lines = _render(fleet, now_s, "clients", width)
    check_table(lines, clients, now_s, "clients", width, f"one address {one_address}, rebalances {rebalances}")
    words = " ".join(lines).split()
    assert ("source" in words) is not one_address and ("rebalances" in words) is rebalances


def _one_push(fleet: Fleet, client_id: str, software: str, metrics: list[tuple[str, str, float]], now_s: float,
              address: str = "127.0.0.1") -> None:
    client = ModelClient(f"i-{client_id}", client_id, software, "2.6.1", address, "50000", {}, "")
    fleet.ingest(_export(client, [_metric(name, kind, value, SECOND_NS) for name, kind, value in metrics],
                         per_metric=False), now_s - 2)


@pytest.mark.parametrize("wide", [True, False])
def test_librdkafka_consumers_show_a_dash_for_rebalances_beside_a_java_consumers_count(wide):
    fleet, now_s = Fleet(), 50.0
    _one_push(fleet, "orders-consumer", "confluent-kafka-python", [(FETCH_LATENCY, "gauge", 12.5)], now_s)
    _one_push(fleet, "inventory-java-consumer", "apache-kafka-java",
              [(FETCH_LATENCY, "gauge", 7.0), (REBALANCES, "cumulative", 3.0)], now_s)
    _one_push(fleet, "orders-producer", "confluent-kafka-python", [(QUEUE_TIME, "gauge", 0.5)], now_s)
    lines = _render(fleet, now_s, "clients", 300 if wide else 110)
    if wide:
        rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("│").split("│")]
                                              for line in lines if line.startswith("│"))}
        column = FULL_COLUMNS.index("rebalances")
    else:
        assert not FRAME & set("".join(lines))
        rows = {line.split()[0]: line.split() for line in lines if line.startswith(("orders", "inventory"))}
        column = compact_columns([ModelClient("", "", "", "", "127.0.0.1", None, {}, "",
                                              headline={"rebalances": 3.0})]).index("rebalances")
    assert [rows[name][column] for name in ("orders-consumer", "inventory-java-consumer", "orders-producer")] == \
        ["-", "3", "-"], lines


def test_the_readme_example_fits_120_columns_without_the_shared_source():
    """README: six clients from 127.0.0.1 in a 120-column terminal: frameless, source named in the title."""
    fleet, now_s = Fleet(), 100.0
    readme = [("inventory-java-consumer", "apache-kafka-java", [(FETCH_LATENCY, 182.0), (REBALANCES, 1.0)]),
              ("inventory-java-producer", "apache-kafka-java", [(PRODUCE_LATENCY[1], 19.32), (QUEUE_TIME, 5.45)]),
              ("orders-consumer", "confluent-kafka-python", [(FETCH_LATENCY, 244.0)]),
              ("orders-producer", "confluent-kafka-python", [(PRODUCE_LATENCY[0], 2.28), (QUEUE_TIME, 0.06)]),
              ("payments-consumer", "confluent-kafka-python", [(FETCH_LATENCY, 222.0)]),
              ("payments-producer", "confluent-kafka-python", [(PRODUCE_LATENCY[0], 2.16), (QUEUE_TIME, 0.04)])]
    for index, (client_id, software, metrics) in enumerate(readme):
        client = ModelClient(f"i-{index}", client_id, software, "2.6.1", "127.0.0.1", str(50000 + index), {}, "")
        built = [_metric(name, "cumulative" if name == REBALANCES else "gauge", value, SECOND_NS)
                 for name, value in metrics]
        fleet.ingest(_export(client, built, per_metric=False), now_s - 2)
    lines = _render(fleet, now_s, "client instances · 18 OTLP exports received · 0 s left", 120)
    assert lines[0].endswith("all from 127.0.0.1") and not FRAME & set("".join(lines))
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("inventory", "orders", "payments"))}
    assert rows["inventory-java-consumer"][1:7] == ["apache-kafka-java", "-", "-", "182", "1", "2.0"]
    assert rows["orders-producer"][1:7] == ["confluent-kafka-python", "2.28", "0.06", "-", "-", "2.0"]


# --- the jsonl summary -------------------------------------------------------------------------------------------

def _strict(constant: str) -> None:
    raise ValueError(f"not standard JSON: {constant}")


@pytest.fixture
def jsonl_demo(monkeypatch, tmp_path):
    """`run_demo` with --output jsonl whose sandbox, subscriptions, bridge and clients are stand-ins and whose
    collector hands the given exports to the demo's fleet: run(exports) -> (exit code, stdout)."""
    import kcm_demo.collector
    import kcm_demo.run
    import kcm_demo.workload
    import kcm_sandbox.runner

    exports: list[ExportMetricsServiceRequest] = []

    class Sandbox:
        bootstrap = "127.0.0.1:1"

        def __init__(self, options):
            pass

        start = stop = lambda self: None

    class Collector:
        endpoint = "127.0.0.1:2"

        def __init__(self, on_export):
            self.on_export = on_export

        def start(self):
            for request in exports:
                self.on_export(request)

        def stop(self):
            pass

    class Bridge:
        check_alive = stop = lambda self: None

    class Workload:
        produced = consumed = 0

        def __init__(self, bootstrap):
            pass

        start = stop = lambda self: None
        client_ids = lambda self: []   # noqa: E731

    monkeypatch.setattr(kcm_sandbox.runner, "Sandbox", Sandbox)
    monkeypatch.setattr(kcm_demo.collector, "OtlpCollector", Collector)
    monkeypatch.setattr(kcm_demo.workload, "Workload", Workload)
    monkeypatch.setattr(kcm_demo.run, "_start_bridge", lambda *args: Bridge())
    monkeypatch.setattr(kcm_demo.run, "_apply_subscriptions", lambda *args: [])
    monkeypatch.setattr(kcm_demo.run, "_FINAL_PUSH_GRACE_S", 0.0)

    def run(requests):
        exports[:] = requests
        out = io.StringIO()
        code = kcm_demo.run.run_demo(kcm_demo.run.DemoOptions(duration_s=0.01, output="jsonl", java="no"), out,
                                     tmp_path / "work")
        return code, out.getvalue()

    return run


@pytest.mark.parametrize("seed", SEEDS)
def test_the_jsonl_summary_is_one_standard_json_object_per_client_instance(seed, jsonl_demo):
    rng = random.Random(seed)
    for case in range(6):
        exports: list[ExportMetricsServiceRequest] = []
        _, clients, _ = random_fleet(rng, exports=exports)
        code, out = jsonl_demo(exports)
        context = f"seed {seed} case {case}"
        lines = out.splitlines()
        assert code == 0 and len(lines) == len(clients), f"{context}: {out}"
        objects = [json.loads(line, parse_constant=_strict) for line in lines]
        assert all(isinstance(o, dict) for o in objects), context
        by_instance = {o["client_instance_id"]: o for o in objects}
        assert len(by_instance) == len(clients), context
        for client in clients:
            summary = by_instance[client.instance_id]
            assert (summary["client_id"], summary["client_software_name"], summary["client_software_version"]) == \
                (client.client_id, client.software, client.version), context
            assert client.source in summary.values(), f"{context}: source {client.source} not in {summary}"
            assert summary["pushes"] == client.pushes, context
            assert summary["broker"] == client.broker, context
            assert summary["metrics"].keys() == client.values.keys(), context
            for name, value in client.values.items():
                shown = summary["metrics"][name]
                assert (shown is None) if value is None else math.isclose(shown, value, rel_tol=1e-9, abs_tol=1e-9), \
                    f"{context}: {name} {shown} vs {value}"


def test_a_jsonl_run_without_any_push_prints_nothing_and_exits_0(jsonl_demo):
    assert jsonl_demo([]) == (0, "")


# --- the options ---------------------------------------------------------------------------------------------------

@pytest.fixture
def demo(monkeypatch, capsys, tmp_path):
    """`kcm demo ARGV` in this process up to the pipeline start: run(argv, java_on_path, jar_built, rollup_extra)
    -> (exit code, stderr, what the pipeline was started with or None)."""
    import importlib.util

    import kcm_cli.demo
    import kcm_demo.run
    from kcm_cli.main import main

    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: None)
    monkeypatch.setattr(kcm_cli.demo, "on_stop_signals", lambda handler: None)
    saved = {name: logging.getLogger(name).level for name in ("kafka", "py4j")}
    started: list[dict] = []

    def pipeline(options, out, workdir, interrupted, use_java, fleet, pipeline):
        started.append({"options": options, "out_is_stdout": out is sys.stdout, "workdir": workdir,
                        "use_java": use_java})

    monkeypatch.setattr(kcm_demo.run, "_run", pipeline)
    real_find_spec = importlib.util.find_spec

    def run(argv, java_on_path=False, jar_built=False, rollup_extra=True, workdir=None):
        started.clear()
        monkeypatch.setenv("KCM_DEMO_DIR", str(workdir or tmp_path / "work"))
        monkeypatch.setattr(kcm_demo.run, "java_available", lambda: java_on_path)
        monkeypatch.setattr(kcm_demo.run, "_receiver_jar_exists", lambda: jar_built)
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: (
            None if not rollup_extra and name in ROLLUP_MODULES else real_find_spec(name, *args)))
        capsys.readouterr()
        try:
            code = main(["demo", *argv])
        except SystemExit as exc:
            code = exc.code
        finally:
            monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
        _, err = capsys.readouterr()
        assert len(started) <= 1
        return code, err, (started[0] if started else None)

    yield run
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def assert_refused(code, err, names, started, context):
    """Exit code 2, one line on stderr naming each of `names`, no traceback, nothing started."""
    lines = err.strip().splitlines()
    assert code == 2, f"{context}: exit {code}, stderr {err!r}"
    assert "Traceback" not in err and len(lines) == 1, f"{context}: stderr {err!r}"
    for name in names:
        assert name in lines[0], f"{context}: {name!r} not in {lines[0]!r}"
    assert started is None, f"{context}: the pipeline started"


def _option(rng, name, value):
    return [f"{name}={value}"] if rng.random() < 0.3 else [name, value]


def draw_valid(rng, tmp_path, case):
    """A valid `kcm demo` command line, the discovery it meets, and what the docs say it starts with."""
    parts, expected = [], {"duration_s": 60.0, "output": "live", "rollup": False, "java": "auto",
                           "subscriptions": None}
    if rng.random() < 0.7:
        text = rng.choice([str(rng.randint(1, DAY_S)), f"{rng.uniform(0.001, DAY_S):.3f}", str(DAY_S), "1e3",
                           "0.5", "86400.0", "0.001", "+5"])
        parts.append(_option(rng, "--duration", text))
        expected["duration_s"] = float(text)
    if rng.random() < 0.6:
        expected["output"] = rng.choice(["live", "jsonl"])
        parts.append(_option(rng, "--output", expected["output"]))
    if rng.random() < 0.4:
        parts.append(["--rollup"])
        expected["rollup"] = True
    java_on_path, jar_built = rng.random() < 0.5, rng.random() < 0.5
    if rng.random() < 0.7:
        expected["java"] = rng.choice(["auto", "no"] + (["yes"] if java_on_path and jar_built else []))
        parts.append(_option(rng, "--java", expected["java"]))
    if rng.random() < 0.4:
        directory = tmp_path / f"subscriptions-{case}"
        shutil.copytree(Path(kcm_demo.__file__).resolve().parents[2] / "examples" / "demo", directory,
                        dirs_exist_ok=True)
        parts.append(_option(rng, "--subscriptions", str(directory)))
        expected["subscriptions"] = directory
    rng.shuffle(parts)
    use_java = expected["java"] == "yes" or (expected["java"] == "auto" and java_on_path and jar_built)
    return [arg for part in parts for arg in part], java_on_path, jar_built, expected, use_java


def _default_subscriptions_are_examples_demo(directory: Path) -> bool:
    examples = Path(kcm_demo.__file__).resolve().parents[2] / "examples" / "demo"
    mine = {p.name: p.read_text() for p in directory.iterdir() if p.suffix in (".yaml", ".yml")}
    return mine == {p.name: p.read_text() for p in examples.iterdir() if p.suffix in (".yaml", ".yml")} and mine


@pytest.mark.parametrize("seed", SEEDS)
def test_valid_options_reach_the_pipeline_typed_with_the_documented_defaults(seed, demo, tmp_path, caplog):
    rng = random.Random(seed)
    for case in range(8):
        argv, java_on_path, jar_built, expected, use_java = draw_valid(rng, tmp_path, case)
        workdir = tmp_path / f"logs-{case}"
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="kcm.demo"):
            code, err, started = demo(argv, java_on_path, jar_built, workdir=workdir)
        context = f"seed {seed}: kcm demo {' '.join(argv)} (java {java_on_path}, jar {jar_built})"
        assert code == 0 and started is not None, f"{context}: exit {code}, {err!r}"
        options = started["options"]
        assert isinstance(options.duration_s, float) and options.duration_s == expected["duration_s"], context
        assert (options.output, options.rollup, options.java) == \
            (expected["output"], expected["rollup"], expected["java"]), context
        if expected["subscriptions"] is None:
            assert _default_subscriptions_are_examples_demo(options.subscriptions), context
        else:
            assert Path(options.subscriptions) == expected["subscriptions"], context
        assert started["use_java"] is use_java, context
        assert started["out_is_stdout"] and started["workdir"] == workdir, context
        demo_lines = [r.getMessage() for r in caplog.records if r.name == "kcm.demo"]
        assert demo_lines and str(workdir) in demo_lines[0], f"{context}: first line {demo_lines[:1]}"


BAD_VALUES = {
    "--duration": ["0", "-5", "86400.001", "1e6", "nan", "inf", "-inf", "abc", "", "1,5", "60s", "0x10"],
    "--output": ["json", "LIVE", "table", ""],
    "--java": ["true", "YES", "maybe", "", "1"],
    "--subscriptions": [""],
}


@pytest.mark.parametrize("seed", SEEDS)
def test_invalid_options_are_one_line_naming_the_option_and_start_nothing(seed, demo, tmp_path):
    rng = random.Random(seed)
    for case in range(8):
        argv, java_on_path, jar_built, _, _ = draw_valid(rng, tmp_path, case)
        option = rng.choice(sorted(BAD_VALUES))
        bad = rng.choice(BAD_VALUES[option])
        position = rng.randrange(len(argv) + 1)
        while position and argv[position - 1] in BAD_VALUES:   # not between an option and its value
            position -= 1
        argv = argv[:position] + _option(rng, option, bad) + argv[position:]
        code, err, started = demo(argv, java_on_path, jar_built)
        assert_refused(code, err, [option], started, f"seed {seed}: kcm demo {argv}")


@pytest.mark.parametrize(("argv", "names"), [
    (["--duration"], ["--duration"]),
    (["--output"], ["--output"]),
    (["--durations", "5"], ["--durations"]),
    (["--java", "yes", "--subscriptions"], ["--subscriptions"]),
    (["extra"], ["extra"]),
])
def test_a_missing_value_or_an_unknown_argument_is_one_line(demo, argv, names):
    code, err, started = demo(argv)
    assert_refused(code, err, names, started, f"kcm demo {argv}")


@pytest.mark.parametrize(("java_on_path", "jar_built"), [(False, False), (True, False), (False, True)])
def test_java_yes_fails_without_java_and_the_built_receiver(demo, java_on_path, jar_built):
    code, err, started = demo(["--java", "yes"], java_on_path, jar_built)
    assert_refused(code, err, ["java"], started, f"--java yes, java {java_on_path}, jar {jar_built}")


@pytest.mark.parametrize("java", ["auto", "no"])
def test_without_java_auto_and_no_run_without_it(demo, java):
    code, err, started = demo(["--java", java], java_on_path=False, jar_built=False)
    assert code == 0 and started["use_java"] is False, err


def test_rollup_without_the_rollup_extra_is_refused_before_the_demo_starts(demo):
    code, err, started = demo(["--rollup"], rollup_extra=False)
    assert_refused(code, err, ["rollup"], started, "--rollup without the extra")
    code, _, started = demo([], rollup_extra=False)
    assert code == 0 and started is not None


def test_subscriptions_that_are_missing_unreadable_or_hold_none_are_one_line(demo, tmp_path):
    missing = tmp_path / "nowhere"
    code, err, started = demo(["--subscriptions", str(missing)])
    assert_refused(code, err, [str(missing)], started, "missing subscriptions")
    other = tmp_path / "other"
    other.mkdir()
    (other / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n")
    code, err, started = demo(["--subscriptions", str(other)])
    assert_refused(code, err, [str(other), "ClientMetricsSubscription"], started, "no subscription")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "s.yaml").write_text("kind: [ClientMetricsSubscription\n")
    code, err, started = demo(["--subscriptions", str(broken)])
    assert_refused(code, err, ["s.yaml"], started, "broken YAML")


# --- the working directory ---------------------------------------------------------------------------------------

def test_the_working_directory_is_kcm_demo_dir_when_set(monkeypatch, tmp_path):
    from kcm_demo.run import default_workdir

    rng = random.Random(3)
    for _ in range(5):
        wanted = tmp_path / f"d{rng.randrange(10**6)}" / "logs"
        monkeypatch.setenv("KCM_DEMO_DIR", str(wanted))
        assert default_workdir() == wanted


def test_the_working_directory_is_build_demo_in_a_checkout(monkeypatch):
    from kcm_demo.run import default_workdir

    checkout = Path(kcm_demo.__file__).resolve().parents[2]   # README: the demo lives in demo/kcm_demo/
    assert (checkout / "pyproject.toml").is_file() and (checkout / "examples" / "demo").is_dir()
    monkeypatch.delenv("KCM_DEMO_DIR", raising=False)
    assert default_workdir() == checkout / "build" / "demo"


def test_the_working_directory_is_a_new_kcm_demo_temporary_directory_outside_a_checkout(tmp_path):
    """An installed kcm_demo (no checkout around it) with $KCM_DEMO_DIR unset."""
    site = tmp_path / "site-packages"
    shutil.copytree(Path(kcm_demo.__file__).resolve().parent, site / "kcm_demo",
                    ignore=shutil.ignore_patterns("__pycache__"))
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "KCM_DEMO_DIR"}
    env.update(TMPDIR=str(temp), PYTHONPATH=f"{site}:{env.get('PYTHONPATH', '')}".rstrip(":"))
    script = "from kcm_demo.run import default_workdir as d; print(d()); print(d())"
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first, second = (Path(line) for line in result.stdout.split())
    for made in (first, second):
        assert made.parent == temp and made.name.startswith("kcm-demo-") and made.is_dir(), made
    assert first != second
