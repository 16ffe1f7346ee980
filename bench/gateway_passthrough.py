"""Gateway overhead: librdkafka produce throughput through the sandbox gateway vs. straight to the embedded broker.

Prints messages/second for both and their ratio (gateway / direct), measured in the same run.
Usage: .venv/bin/python bench/gateway_passthrough.py [MESSAGES]
"""

from __future__ import annotations

import sys
import time

import confluent_kafka

from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_sandbox.broker import EmbeddedBroker
from kcm_sandbox.runner import Sandbox, SandboxOptions


def produce_rate(bootstrap: str, messages: int) -> float:
    ensure_topic(KafkaSettings(bootstrap), "bench", partitions=1)
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    payload = b"x" * 200
    started = time.perf_counter()
    for _ in range(messages):
        while True:
            try:
                producer.produce("bench", payload)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(60) != 0:
        raise SystemExit("messages were left unsent")
    return messages / (time.perf_counter() - started)


def main() -> None:
    messages = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    with EmbeddedBroker() as broker:
        direct = produce_rate(broker.bootstrap, messages)
    with Sandbox(SandboxOptions(listen=("127.0.0.1", 0))) as sandbox:
        gateway = produce_rate(sandbox.bootstrap, messages)
    print(f"messages: {messages}")
    print(f"direct to broker: {direct:,.0f} msg/s")
    print(f"through gateway:  {gateway:,.0f} msg/s")
    print(f"ratio gateway/direct: {gateway / direct:.2f}")


if __name__ == "__main__":
    main()
