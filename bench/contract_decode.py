"""Contract codec decode cost per content-encoding, as a ratio to decoding the same record uncompressed.

Usage: .venv/bin/python bench/contract_decode.py [ITERATIONS]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from kcm_common import contract  # noqa: E402
from payloads import client_metrics  # noqa: E402


def records_per_second(value: bytes, headers: list[tuple[str, bytes]], iterations: int) -> float:
    started = time.perf_counter()
    for _ in range(iterations):
        contract.decode(value, headers)
    return iterations / (time.perf_counter() - started)


def main() -> None:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    metrics = client_metrics()
    scope = metrics.resource_metrics[0].scope_metrics[0]
    for index in range(60):  # about the size of a librdkafka push with metrics "*"
        scope.metrics.add(name=f"org.apache.kafka.producer.extra.{index}").gauge.data_points.add(as_double=index)
    attributes = {"client_id": "bench", "client_instance_id": "5b1a6e0e-8f51-4c5e-9d7b-2f4f1c0e9a11"}
    baseline = records_per_second(*contract.encode(metrics, attributes=attributes), iterations)
    print(f"payload: {metrics.ByteSize()} bytes, {iterations} decodes each")
    print(f"none (baseline): {baseline:,.0f} records/s")
    for encoding in ("gzip", "snappy", "lz4", "zstd"):
        rate = records_per_second(*contract.encode(metrics, attributes=attributes, content_encoding=encoding),
                                  iterations)
        print(f"{encoding}: {rate:,.0f} records/s, ratio to none {rate / baseline:.2f}")
    json_rate = records_per_second(*contract.encode(metrics, attributes=attributes,
                                                    content_type=contract.CONTENT_TYPE_JSON), iterations // 10)
    print(f"json: {json_rate:,.0f} records/s, ratio to protobuf {json_rate / baseline:.2f}")


if __name__ == "__main__":
    main()
