"""`kcm sandbox`: run the local KIP-714 endpoint until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from kcm_sandbox.broker import BrokerError
from kcm_sandbox.store import StateFileError
from kcm_common.names import DEFAULT_METRICS_TOPIC
from kcm_sandbox.runner import (
    Sandbox,
    SandboxError,
    SandboxOptions,
    compression_ids,
    parse_address,
)
from kcm_sandbox.telemetry import DEFAULT_TELEMETRY_MAX_BYTES

log = logging.getLogger("kcm.sandbox")

HELP = "run a local KIP-714-capable Kafka endpoint"
DESCRIPTION = ("Run an embedded Kafka-compatible broker behind a KIP-714 gateway: real clients push telemetry to it, "
               "CLIENT_METRICS subscriptions are honoured, and every accepted push is written to the metrics topic "
               "(contract v1).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="127.0.0.1:9092", metavar="HOST:PORT",
                        help="where clients connect: the bootstrap address (default: %(default)s; port 0 picks one)")
    parser.add_argument("--topic", default=DEFAULT_METRICS_TOPIC, help="metrics topic the receiver writes (default: %(default)s)")
    parser.add_argument("--partitions", type=int, default=1, help="partitions of the metrics topic if it is created")
    parser.add_argument("--compression", default="zstd,lz4,gzip,snappy", metavar="LIST",
                        help="compression types offered to clients, in preference order (default: %(default)s)")
    parser.add_argument("--telemetry-max-bytes", type=int, default=DEFAULT_TELEMETRY_MAX_BYTES, metavar="N",
                        help="largest push accepted, in bytes (telemetry.max.bytes; default: %(default)s)")
    parser.add_argument("--state", type=Path, metavar="FILE",
                        help="JSON file keeping CLIENT_METRICS subscriptions across restarts")
    parser.add_argument("--upstream", metavar="HOST:PORT",
                        help="use this running broker instead of starting the embedded one; it must advertise "
                             "the --listen address")


def options_from(args: argparse.Namespace) -> SandboxOptions:
    return SandboxOptions(
        listen=parse_address(args.listen, "--listen"),
        topic=args.topic,
        partitions=args.partitions,
        compression=compression_ids(args.compression),
        telemetry_max_bytes=args.telemetry_max_bytes,
        state=args.state,
        upstream=parse_address(args.upstream, "--upstream") if args.upstream else None,
    )


def run(args: argparse.Namespace) -> int:
    """Start the sandbox, print its bootstrap address, and stop everything on SIGINT/SIGTERM."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        sandbox = Sandbox(options_from(args))
        sandbox.start()
    except (SandboxError, BrokerError, StateFileError) as exc:
        print(f"kcm sandbox: {exc}", file=sys.stderr)
        return 2
    try:
        print(f"kcm sandbox: bootstrap {sandbox.bootstrap} (metrics topic {sandbox.options.topic}); "
              "Ctrl-C stops it", flush=True)
        stop.wait()
        log.info("stopping")
    finally:
        sandbox.stop()
    return 0
