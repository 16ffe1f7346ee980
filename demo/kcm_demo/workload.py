"""The demo's applications: real librdkafka producers and consumers doing visible work through the sandbox."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("kcm.demo")


@dataclass(frozen=True)
class App:
    """One demo application: a producer and a consumer group on its own topic."""

    name: str
    messages_per_second: float


APPS = (App("payments", 40.0), App("orders", 15.0))


class Workload:
    """Runs every app's producer and consumer on their own threads until `stop()`."""

    def __init__(self, bootstrap: str, apps: tuple[App, ...] = APPS, session_timeout_ms: int = 6000) -> None:
        self.bootstrap = bootstrap
        self.apps = apps
        # The embedded broker holds every JoinGroup for half the session timeout: keep joins short.
        self.session_timeout_ms = session_timeout_ms
        self.produced = 0
        self.consumed = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def client_ids(self) -> list[str]:
        return [f"{app.name}-{role}" for app in self.apps for role in ("producer", "consumer")]

    def start(self) -> None:
        for app in self.apps:
            for target in (self._produce, self._consume):
                thread = threading.Thread(target=target, args=(app,), name=f"demo-{app.name}-{target.__name__}",
                                          daemon=True)
                thread.start()
                self._threads.append(thread)

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))

    def _produce(self, app: App) -> None:
        import confluent_kafka

        producer = confluent_kafka.Producer({"bootstrap.servers": self.bootstrap, "client.id": f"{app.name}-producer",
                                             "linger.ms": 20, "log_level": 3})
        period = 1.0 / app.messages_per_second
        sequence = 0
        try:
            while not self._stop.is_set():
                try:
                    producer.produce(app.name, value=f"{app.name} event {sequence}".encode(),
                                     key=str(sequence % 8).encode(), on_delivery=self._delivered)
                    sequence += 1
                except BufferError:
                    pass
                producer.poll(0)
                self._stop.wait(period)
        finally:
            producer.flush(5)

    def _delivered(self, error: object, _message: object) -> None:
        if error is None:
            with self._lock:
                self.produced += 1

    def _consume(self, app: App) -> None:
        import confluent_kafka

        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": self.bootstrap, "client.id": f"{app.name}-consumer", "group.id": f"{app.name}-app",
            "session.timeout.ms": self.session_timeout_ms, "heartbeat.interval.ms": 1000,
            "group.protocol": "classic", "auto.offset.reset": "earliest", "log_level": 3})
        consumer.subscribe([app.name])
        try:
            while not self._stop.is_set():
                message = consumer.poll(0.2)
                if message is not None and message.error() is None:
                    with self._lock:
                        self.consumed += 1
        finally:
            consumer.close()
