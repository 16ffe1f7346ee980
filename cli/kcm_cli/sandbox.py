"""`kcm sandbox`: run the local KIP-714 endpoint until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import socket
import threading
from typing import TYPE_CHECKING

from kcm_cli.arguments import path, topic
from kcm_cli.signals import on_stop_signals
from kcm_common.errors import UserError
from kcm_common.kafka import KafkaSettings, KafkaUnavailableError, check_reachable
from kcm_common.names import DEFAULT_METRICS_TOPIC

if TYPE_CHECKING:
    from kcm_sandbox.runner import SandboxOptions

# How long --upstream gets to answer as a Kafka broker before start-up gives up.
_UPSTREAM_PROBE_S = 5.0
_HEALTH_CHECK_S = 1.0  # how often the broker and Java receiver are checked for having died

log = logging.getLogger("kcm.sandbox")

HELP = "run a local KIP-714-capable Kafka endpoint"
DESCRIPTION = ("Run an embedded Kafka-compatible broker behind a KIP-714 gateway: real clients push telemetry to it, "
               "CLIENT_METRICS subscriptions are honoured, and every accepted push is written to the metrics topic "
               "(contract v1).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="127.0.0.1:9092", metavar="HOST:PORT",
                        help="where clients connect: the bootstrap address (default: %(default)s; port 0 picks one)")
    parser.add_argument("--topic", default=DEFAULT_METRICS_TOPIC, type=topic, help="metrics topic the receiver writes (default: %(default)s)")
    parser.add_argument("--partitions", type=int, default=1, help="partitions of the metrics topic if it is created (default: %(default)s)")
    parser.add_argument("--compression", default="zstd,lz4,gzip,snappy", metavar="LIST",
                        help="compression types offered to clients, in preference order (default: %(default)s)")
    parser.add_argument("--telemetry-max-bytes", type=int, metavar="N",
                        help="largest push accepted, in bytes (telemetry.max.bytes; default: Kafka's, 1048576)")
    parser.add_argument("--connections-max-idle-ms", type=int, metavar="MS",
                        help="close a connection idle this long, or this slow to send one request "
                             "(connections.max.idle.ms; default: Kafka's, 600000)")
    parser.add_argument("--state", type=path, metavar="FILE",
                        help="JSON file keeping CLIENT_METRICS subscriptions across restarts")
    parser.add_argument("--receiver", choices=("python", "java"), default="python",
                        help="what writes accepted pushes to the metrics topic: the built-in Python receiver, or "
                             "kcm's Java broker plugin hosted in a JVM as a broker hosts it (needs java; "
                             "default: %(default)s)")
    parser.add_argument("--receiver-api", choices=("3.8", "4.2"),
                        help="with --receiver java: call the plugin as Kafka 3.8-4.1 (ClientTelemetry) or 4.2+ "
                             "(ClientTelemetryExporterProvider) brokers do (default: 4.2)")
    parser.add_argument("--upstream", metavar="HOST:PORT",
                        help="use this running broker instead of starting the embedded one; it must advertise "
                             "the --listen address")


def options_from(args: argparse.Namespace) -> SandboxOptions:
    """The sandbox options the flags ask for; raises UserError naming the bad flag."""
    from kcm_sandbox.runner import SandboxOptions, compression_ids, parse_address

    listen = parse_address(args.listen, "--listen")
    try:
        socket.getaddrinfo(listen[0], listen[1], type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise UserError(f"--listen host {listen[0]!r} cannot be resolved on this machine; "
                        "use an address such as 127.0.0.1") from None
    if args.receiver_api is not None and args.receiver != "java":
        raise UserError("--receiver-api applies to the Java receiver only: add --receiver java")
    upstream = parse_address(args.upstream, "--upstream") if args.upstream else None
    options = SandboxOptions(listen=listen, topic=args.topic, partitions=args.partitions,
                             compression=compression_ids(args.compression), state=args.state, upstream=upstream,
                             receiver=args.receiver, receiver_api=args.receiver_api or "4.2")
    if args.telemetry_max_bytes is not None:
        options.telemetry_max_bytes = args.telemetry_max_bytes
    if args.connections_max_idle_ms is not None:
        options.connections_max_idle_ms = args.connections_max_idle_ms
    options.validate()  # the cheap checks first, then the ones that wait on the network or a build
    if upstream is not None:
        try:
            check_reachable(KafkaSettings(args.upstream), _UPSTREAM_PROBE_S)
        except KafkaUnavailableError as exc:  # said as the option the user gave, not as a client's Kafka
            raise KafkaUnavailableError(f"--upstream: {exc}") from None
    if args.receiver == "java":
        from kcm_sandbox.java_receiver import ensure_built

        ensure_built()  # before anything starts: no java, or a failed build, is one line and nothing to clean up
    return options


def run(args: argparse.Namespace) -> int:
    """Start the sandbox, print its bootstrap address, and stop everything on SIGINT/SIGTERM."""
    stop = threading.Event()
    from kcm_sandbox.runner import Sandbox

    sandbox = Sandbox(options_from(args))
    on_stop_signals(lambda _: stop.set())  # once the options are good: nothing else changes before that
    sandbox.start()
    try:
        print(f"kcm sandbox: bootstrap {sandbox.bootstrap} (metrics topic {sandbox.options.topic}); "
              "Ctrl-C stops it", flush=True)
        while not stop.wait(_HEALTH_CHECK_S):
            if problem := sandbox.problem():  # serving on without it would only refuse every client
                log.error("%s; stopping", problem)
                return 1
        log.info("stopping")
    finally:
        sandbox.stop()
    return 0
