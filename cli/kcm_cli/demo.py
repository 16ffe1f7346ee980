"""`kcm demo`: the whole pipeline on one machine with real clients, shown live or summarised as JSON lines."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from kcm_cli.arguments import path, seconds
from kcm_common.errors import UserError

HELP = "run the whole pipeline on this machine with real clients"
DESCRIPTION = ("Start the sandbox (embedded broker + KIP-714 gateway + receiver), apply the example subscriptions, "
               "run real librdkafka (and, with Java, kafka-clients) producers and consumers, bridge their telemetry "
               "to an embedded OTLP collector and show every client instance's latest metrics. Everything it "
               "started is stopped when it ends or on Ctrl-C.")


def _seconds(text: str) -> float:
    value = seconds(text)
    if value > 86400:
        raise argparse.ArgumentTypeError(f"must be between 0 and 86400 seconds, not {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=_seconds, default=60.0, metavar="SECONDS",
                        help="how long the clients run once started (default: %(default)s)")
    parser.add_argument("--output", choices=("live", "jsonl"), default="live",
                        help="live: a table redrawn as pushes arrive; jsonl: one JSON object per client instance "
                             "at the end, with every metric's last value (default: %(default)s)")
    parser.add_argument("--rollup", action="store_true",
                        help="at the end, run the Spark rollup over the collected telemetry and print its top rows")
    parser.add_argument("--java", choices=("auto", "yes", "no"), default="auto",
                        help="Java clients and the Java receiver plugin: auto uses them when `java` and the built "
                             "receiver are here (default: %(default)s)")
    parser.add_argument("--subscriptions", type=path, metavar="DIR",
                        help="ClientMetricsSubscription YAML to apply (default: examples/demo in the repository)")


def run(args: argparse.Namespace) -> int:
    from kcm_demo.run import DemoOptions, default_workdir, run_demo

    options = DemoOptions(duration_s=args.duration, output=args.output, rollup=args.rollup, java=args.java)
    if args.subscriptions is not None:
        options.subscriptions = args.subscriptions
    interrupted = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: interrupted.set())
    try:
        return run_demo(options, sys.stdout, default_workdir(), interrupted)
    except OSError as exc:
        raise UserError(f"the demo could not start: {exc}") from exc
