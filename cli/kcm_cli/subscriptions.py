"""`kcm subscriptions list | describe NAME | apply -f FILE... | delete NAME`: CLIENT_METRICS without Kubernetes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from kcm_cli.arguments import kafka_connection
from kcm_common.errors import UserError
from kcm_common.terminal import printable

HELP = "list, describe, apply or delete CLIENT_METRICS subscriptions"
DESCRIPTION = ("Manage KIP-714 client metrics subscriptions directly in Kafka with the operator's reconcile core: "
               "apply ClientMetricsSubscription YAML (validated against the CRD first), list and describe every "
               "subscription in the cluster, delete one.")
_ACTIONS = ("list", "describe", "apply", "delete")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    connection = argparse.ArgumentParser(add_help=False)
    kafka_connection(connection, servers="Kafka bootstrap servers")
    for option in ("--bootstrap-server", "--command-config"):
        # kubectl takes its options before its verb; these are the action's (hidden here: no second place to look).
        parser.add_argument(option, action=_AfterTheAction, help=argparse.SUPPRESS)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", parents=[connection], help="every subscription in the cluster")
    listing.add_argument("-o", "--output", choices=("table", "json"), default="table",
                         help="a table, or JSON (default: %(default)s)")
    describe = actions.add_parser("describe", parents=[connection], help="one subscription's configs")
    describe.add_argument("name", help="the subscription (CLIENT_METRICS resource) name")
    describe.add_argument("-o", "--output", choices=("text", "json"), default="text",
                          help="its configs as text, or JSON (default: %(default)s)")
    apply = actions.add_parser("apply", parents=[connection],
                               help="make Kafka hold the subscriptions that YAML files define")
    apply.add_argument("-f", "--filename", action="append", required=True, metavar="FILE|DIR",
                       help="ClientMetricsSubscription YAML (multi-document) or a directory of it; repeatable")
    apply.add_argument("-R", "--recursive", action="store_true", help="read directories recursively")
    apply.add_argument("--dry-run", action="store_true", help="print what would change (Kafka still validates)")
    delete = actions.add_parser("delete", parents=[connection], help="remove a subscription from Kafka")
    delete.add_argument("name", help="the subscription (CLIENT_METRICS resource) name")
    delete.add_argument("--dry-run", action="store_true", help="print what would be removed")
    delete.add_argument("--ignore-not-found", action="store_true", help="succeed when it does not exist")


class _AfterTheAction(argparse.Action):
    """An action's option given before the action: say where it goes (argparse took its value for the action)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string} goes after the action: {parser.prog} list|describe|apply|delete "
                     f"{option_string} …")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run one action; raises UserError for bad input or an unreachable cluster."""
    from kcm_common.kafka import KafkaSettings
    from kcm_operator.admin import SubscriptionAdmin
    from kcm_operator.apply import apply_files, delete_subscription

    out = out or sys.stdout
    settings = KafkaSettings.from_cli(args.bootstrap_server, args.command_config)
    if args.action == "apply":
        suffix = " (dry run)" if args.dry_run else ""
        for change in apply_files(settings, args.filename, args.dry_run, args.recursive):
            print(printable(change.describe()) + suffix, file=out)   # names are anyone's text
        return 0
    admin = SubscriptionAdmin(settings)
    try:
        if args.action == "list":
            _print_list(admin.describe(admin.list_names()), args.output, out)
        elif args.action == "describe":
            configs = admin.describe([args.name]).get(args.name) or {}
            if not configs:
                raise UserError(f"subscription {args.name!r} does not exist on {settings.describe()}")
            _print_describe(args.name, configs, args.output, out)
        else:
            change = delete_subscription(admin, args.name, args.dry_run)
            if change.action == "unchanged" and not args.ignore_not_found:
                raise UserError(f"subscription {args.name!r} does not exist on {settings.describe()}")
            print(printable(change.describe()) + (" (dry run)" if args.dry_run else ""), file=out)
    finally:
        admin.close()
    return 0


def _print_list(subscriptions: dict[str, dict[str, str]], output: str, out: TextIO) -> None:
    if output == "json":
        print(json.dumps(subscriptions, indent=2, sort_keys=True), file=out)
        return
    rows = [("NAME", "INTERVAL_MS", "METRICS", "MATCH")]
    # Names and values are whoever altered the configs': control characters shown escaped, as kcm tail does.
    rows += [tuple(map(printable, (name, configs.get("interval.ms", "300000 (default)"), configs.get("metrics") or "-",
                                   configs.get("match") or "(every client)")))
             for name, configs in sorted(subscriptions.items())]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3], file=out)


def _print_describe(name: str, configs: dict[str, str], output: str, out: TextIO) -> None:
    if output == "json":
        print(json.dumps({"name": name, "configs": configs}, indent=2, sort_keys=True), file=out)
        return
    print(f"Name:         {printable(name)}", file=out)
    print(f"Interval ms:  {printable(configs.get('interval.ms', '300000 (default)'))}", file=out)
    print("Metrics:      " + printable(configs.get("metrics") or "(none)"), file=out)
    print("Match:        " + printable(configs.get("match") or "(every client)"), file=out)
