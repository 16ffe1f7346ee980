"""The `kcm` command: one entry point, a subcommand per component."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from kcm_cli import tail
from kcm_cli import sandbox


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kcm",
        description="Kafka client telemetry (KIP-714) for Kubernetes: see inside every producer and consumer.",
    )
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="log verbosity on stderr (default: %(default)s)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    tail_parser = commands.add_parser(
        "tail", help="print decoded client metrics from the metrics topic",
        description="Consume the metrics topic (contract v1) and print decoded client metrics.")
    tail.add_arguments(tail_parser)
    tail_parser.set_defaults(run=tail.run)

    sandbox_parser = commands.add_parser(
        "sandbox", help="run a local KIP-714-capable Kafka endpoint",
        description="Run an embedded Kafka-compatible broker behind a KIP-714 gateway: real clients push telemetry "
                    "to it, CLIENT_METRICS subscriptions are honoured, and every accepted push is written to the "
                    "metrics topic (contract v1).")
    sandbox.add_arguments(sandbox_parser)
    sandbox_parser.set_defaults(run=sandbox.run)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "DEBUG":
        # kafka-python narrates every connection at INFO; kcm reports what matters itself.
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
