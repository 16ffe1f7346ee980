"""The bridge's own Prometheus metrics and its /metrics, /healthz and /readyz endpoint."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kcm_common.contract import DECODE_REASONS


# The reason given to a record that decoded but could not be prepared for export (an input nobody foresaw).
UNPROCESSABLE = "unprocessable"

EXPORT_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                          float("inf"))


class BridgeMetrics:
    """Counters the pipeline updates; one registry per bridge so several can run in one process (tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.records = Counter("kcm_bridge_records_consumed", "Records consumed", registry=r)
        self.bytes = Counter("kcm_bridge_bytes_consumed", "Record value bytes consumed", registry=r)
        self.decode_failures = Counter("kcm_bridge_decode_failures", "Undecodable records", ["reason"], registry=r)
        # Every reason from 0: Prometheus's increase() cannot count the jump that creates a series, so a first burst
        # of a reason would never show in an alert.
        for reason in (*DECODE_REASONS, UNPROCESSABLE):
            self.decode_failures.labels(reason)
        self.dead_lettered = Counter("kcm_bridge_dead_lettered", "Records written to the dead-letter topic",
                                     registry=r)
        self.dead_letter_failures = Counter("kcm_bridge_dead_letter_failures",
                                            "Failed dead-letter writes (each is retried with backoff)", registry=r)
        self.points = Counter("kcm_bridge_points_exported", "Data points delivered", ["endpoint"], registry=r)
        self.rejected = Counter("kcm_bridge_points_rejected", "Data points an endpoint rejected (partial success)",
                                ["endpoint"], registry=r)
        # Retries with backoff reach minutes: the default buckets end at 10 s, where every retried export landed.
        self.export_seconds = Histogram("kcm_bridge_export_seconds", "Export latency including retries",
                                        ["endpoint"], registry=r, buckets=EXPORT_SECONDS_BUCKETS)
        self.export_failures = Counter("kcm_bridge_export_failures", "Failed export attempts", ["endpoint", "code"],
                                       registry=r)
        self.retries = Counter("kcm_bridge_export_retries", "Export attempts beyond the first", ["endpoint"],
                               registry=r)
        self.inflight_bytes = Gauge("kcm_bridge_inflight_bytes", "Bytes consumed but not yet exported", registry=r)
        self.paused = Gauge("kcm_bridge_paused", "1 while fetching is paused for back-pressure", registry=r)
        self.committed = Gauge("kcm_bridge_committed_offset", "Last committed offset", ["topic", "partition"],
                               registry=r)
        self.lag = Gauge("kcm_bridge_lag", "Records of the partition not yet exported or dead-lettered: its high "
                         "watermark minus the offset the bridge would commit", ["topic", "partition"], registry=r)

    def value(self, counter: Counter | Gauge, **labels: str) -> float:
        """The current value of a metric (summed over unlisted labels), for tests and logs."""
        name = counter._name  # noqa: SLF001 (prometheus_client keeps the base name here)
        total = 0.0
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name in (name, name + "_total") and all(sample.labels.get(k) == v
                                                                  for k, v in labels.items()):
                    total += sample.value
        return total


def serve(metrics: BridgeMetrics, host: str, port: int, ready: Callable[[], bool],
          problem: Callable[[], str | None] = lambda: None) -> ThreadingHTTPServer:
    """Serve /metrics, /healthz (503 with `problem()` when it names one, as a bridge whose loop is stuck) and /readyz
    (`ready()`) on a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server name)
            if self.path == "/metrics":
                self._answer(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                wrong = problem()
                self._answer(200, b"ok\n") if wrong is None else self._answer(503, f"{wrong}\n".encode())
            elif self.path == "/readyz":
                ok = ready()
                self._answer(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
            else:
                self._answer(404, b"not found\n")

        def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass  # scrapes every few seconds would drown the bridge's own log

    class Server(ThreadingHTTPServer):
        # ThreadingHTTPServer is IPv4 only: `::` (every interface, IPv6 too) or `::1` need the other family.
        address_family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET

    server = Server((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="kcm-bridge-metrics", daemon=True).start()
    return server
