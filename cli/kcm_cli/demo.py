"""`kcm demo`: the whole pipeline on one machine with real clients, shown live or summarised as JSON lines."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import threading

from kcm_cli.arguments import path, seconds_up_to
from kcm_cli.signals import on_stop_signals
from kcm_common.errors import UserError

# What `kcm_rollups` imports from the 'rollup' extra.
_ROLLUP_MODULES = ("pyspark", "pyarrow", "pandas", "datasketches")

HELP = "run the whole pipeline on this machine with real clients"
DESCRIPTION = ("Start the sandbox (embedded broker + KIP-714 gateway + receiver), apply the example subscriptions, "
               "run real librdkafka (and, with Java, kafka-clients) producers and consumers, bridge their telemetry "
               "to an embedded OTLP collector and show every client instance's latest metrics. Everything it "
               "started is stopped when it ends or on Ctrl-C.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=seconds_up_to(86400, "a day"), default=60.0, metavar="SECONDS",
                        help="how long the clients run once started, at most 86400 (default: %(default)g)")
    parser.add_argument("--output", choices=("live", "jsonl"), default="live",
                        help="live: a table redrawn as pushes arrive; jsonl: one JSON object per client instance "
                             "at the end, with every metric's last value (default: %(default)s)")
    parser.add_argument("--rollup", action="store_true",
                        help="at the end, run the Spark rollup over the collected telemetry and print its top rows "
                             "(needs the 'rollup' extra besides 'demo')")
    parser.add_argument("--java", choices=("auto", "yes", "no"), default="auto",
                        help="Java clients and the Java receiver plugin: auto uses them when `java` and the built "
                             "receiver are here (default: %(default)s)")
    parser.add_argument("--subscriptions", type=path, metavar="DIR",
                        help="ClientMetricsSubscription YAML to apply (default: the demo's own, a copy of examples/demo)")


def run(args: argparse.Namespace) -> int:
    # The demo starts processes while its embedded collector's gRPC threads run; gRPC's fork handlers would only
    # print "skipping fork() handlers" (nothing in the children uses this process's gRPC). Read at gRPC's import.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    if args.rollup:
        # Checked before the clients run, not after: the 'demo' extra does not install Spark.
        missing = next((name for name in _ROLLUP_MODULES if importlib.util.find_spec(name) is None), None)
        if missing is not None:
            raise UserError(f"--rollup needs the 'rollup' extra (missing module {missing}): pip install 'kcm[rollup]'")
    from kcm_demo.run import DemoOptions, default_workdir, run_demo

    options = DemoOptions(duration_s=args.duration, output=args.output, rollup=args.rollup, java=args.java)
    if args.subscriptions is not None:
        options.subscriptions = args.subscriptions
    interrupted = threading.Event()
    on_stop_signals(lambda _: interrupted.set())
    try:
        return run_demo(options, sys.stdout, default_workdir(), interrupted)
    except OSError as exc:
        raise UserError(f"the demo could not start: {exc}") from exc
