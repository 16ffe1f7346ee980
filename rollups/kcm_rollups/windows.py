"""Rollup resolutions and time ranges: durations, epoch-aligned windows, and ranges widened to whole windows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from kcm_common.errors import UserError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
LONGEST_DURATION_S = 36500 * 86400   # beyond a century `now - duration` leaves what dates can hold
_DURATION = re.compile(r"(\d+)([smhd])")
EARLIEST_TIME = datetime(1970, 1, 1, tzinfo=timezone.utc)  # Kafka timestamps are milliseconds since the epoch
LATEST_TIME = datetime(9000, 1, 1, tzinfo=timezone.utc)  # a range widened to whole windows must stay a date
# Epoch seconds below this (1973-03-03) are refused: a number that short is a date or a year written without dashes
# (`20261129`, `2026`), and read as seconds it would reach back to 1970 and replace every window since.
EARLIEST_EPOCH_S = 100_000_000


@dataclass(frozen=True, order=True)
class Resolution:
    """A window size in seconds and its label (`1m`, `1h`) as written in the `resolution` column."""

    seconds: int
    label: str


def parse_duration(text: str, what: str = "duration") -> int:
    """`90s`, `5m`, `1h`, `2d` (or a combination such as `1h30m`) as whole seconds; raises UserError."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise UserError(f"{what} {text!r} is not a duration such as 30s, 5m, 1h or 1d")
    seconds = sum(int(number) * _UNITS[unit] for number, unit in parts)
    if seconds <= 0:
        raise UserError(f"{what} {text!r} must be longer than zero")
    if seconds > LONGEST_DURATION_S:
        raise UserError(f"{what} {text!r} is longer than a century ({LONGEST_DURATION_S // 86400}d)")
    return seconds


def label(seconds: int) -> str:
    """The shortest label for a window size: 60 -> `1m`, 3600 -> `1h`, 90 -> `90s`."""
    for unit in ("d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def parse_resolutions(text: str) -> tuple[Resolution, ...]:
    """`1m,1h` into resolutions, finest first; each must be a whole multiple of the one before (it is merged from it)."""
    sizes = sorted({parse_duration(part, "resolution") for part in text.split(",") if part.strip()})
    if not sizes:
        raise UserError("--resolution needs at least one window size, e.g. 1m,1h")
    for finer, coarser in zip(sizes, sizes[1:]):
        if coarser % finer:
            raise UserError(f"resolution {label(coarser)} is not a whole multiple of {label(finer)}; "
                            "each coarser window is merged from the finer ones")
    if 86400 % sizes[-1] and sizes[-1] % 86400:
        raise UserError(f"resolution {label(sizes[-1])} does not divide a day; use one that does (e.g. 1m, 5m, 1h, 1d)")
    return tuple(Resolution(size, label(size)) for size in sizes)


def align_down(seconds: float, size: int) -> int:
    """The start of the epoch-aligned window of `size` seconds holding `seconds`."""
    return int(seconds // size) * size


def widen(start: float, end: float, size: int) -> tuple[int, int]:
    """[start, end) widened to whole windows of `size` seconds, so no window is cut by the range."""
    return align_down(start, size), -align_down(-end, size)


def parse_time(text: str, what: str = "time") -> datetime:
    """ISO 8601 (a zone-less time is UTC; also the basic format, `20261129`) or epoch seconds (from EARLIEST_EPOCH_S),
    as an aware UTC datetime; raises UserError naming `what` (the option it was given to)."""
    value = text.strip()
    moment: datetime | None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        try:
            seconds = float(value)
        except ValueError:
            raise UserError(f"{what} {text!r} is neither ISO 8601 (2026-01-31T10:00:00Z) nor epoch seconds") from None
        try:
            moment = datetime.fromtimestamp(seconds, tz=timezone.utc)
        except (ValueError, OverflowError, OSError):  # NaN, or beyond what dates hold
            moment = None
        if moment is not None and EARLIEST_TIME <= moment and seconds < EARLIEST_EPOCH_S:
            raise UserError(f"{what} {text!r} read as epoch seconds is {moment:%Y-%m-%dT%H:%M:%SZ}: write a date in "
                            "ISO 8601 (2026-01-31 or 2026-01-31T10:00:00Z), or epoch seconds in full (date +%s)")
    else:
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        try:
            moment = moment.astimezone(timezone.utc)
        except OverflowError:  # year 1 or 9999 moved past what dates hold: outside the range below either way
            moment = None
    if moment is None or not EARLIEST_TIME <= moment < LATEST_TIME:
        raise UserError(f"{what} {text!r} is outside {EARLIEST_TIME:%Y-%m-%d} to {LATEST_TIME:%Y-%m-%d}: Kafka "
                        "timestamps count from 1970, and windows beyond must still be dates")
    return moment
