"""argparse value types the subcommands share (a bad value is one line naming the option, exit code 2)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from kcm_common.names import topic_problem
from kcm_common.retry import LONGEST_WAIT_S


def _seconds(text: str, fits: Callable[[float], bool], wanted: str, longest: float = LONGEST_WAIT_S,
             longest_name: str = "a year") -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or not fits(value) or value > longest:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds {wanted}, at most {longest:.10g} "
                                         f"({longest_name}), not {text}")
    return value


def path(text: str) -> Path:
    """A file or directory path; an empty one is refused (Path('') would quietly mean the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("needs a value, not an empty string")
    return Path(text)


def topic(text: str) -> str:
    """A name Kafka accepts for a topic."""
    problem = topic_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def seconds(text: str) -> float:
    """A finite number of seconds above zero (`nan`, `inf` and negatives are refused)."""
    return _seconds(text, lambda value: value > 0, "above 0")


def seconds_up_to(longest: float, longest_name: str) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds above 0, at most `longest` (named, e.g. "a day")."""
    return lambda text: _seconds(text, lambda value: value > 0, "above 0", longest, longest_name)


def seconds_from(minimum: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds of at least `minimum`."""
    return lambda text: _seconds(text, lambda value: value >= minimum, f"of at least {minimum:g}")


def kafka_connection(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, required: bool = True,
                     servers: str = "Kafka bootstrap servers holding the metrics topic",
                     properties: str = "client properties file for TLS/SASL (security.protocol, sasl.mechanism, ...)"
                     ) -> None:
    """`--bootstrap-server` and `--command-config`, as every subcommand that talks to Kafka spells them."""
    parser.add_argument("--bootstrap-server", required=required, metavar="HOST:PORT[,HOST:PORT]", help=servers)
    parser.add_argument("--command-config", metavar="FILE", help=properties)
