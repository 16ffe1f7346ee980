"""Exponential backoff with jitter up to a cap: OTLP export retries and the bridge's Kafka health checks."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

# The longest timeout, interval or idle time any kcm setting may ask for: longer means nothing, and keeps
# `now + value` within what clocks and dates hold.
LONGEST_WAIT_S = 365 * 86400


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter up to a cap (an OTLP server's RetryInfo delay overrides it, within the cap)."""

    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.2


def backoff_s(attempt: int, retry: RetryPolicy, rng: random.Random) -> float:
    """Exponential backoff with jitter, capped; `attempt` counts from 1 and may grow without bound (days of outage)."""
    base = retry.initial_backoff_s
    if retry.multiplier > 1 and 0 < base < retry.max_backoff_s:
        # The cap is reached after this many steps; past them the power is never computed (it would overflow).
        steps_to_cap = math.log(retry.max_backoff_s / base, retry.multiplier)
        base = retry.max_backoff_s if attempt - 1 >= steps_to_cap else base * retry.multiplier ** (attempt - 1)
    return min(retry.max_backoff_s, base) * (1 - retry.jitter * rng.random())


def wait_unless(seconds: float, gave_up: Callable[[], bool]) -> bool:
    """Sleep `seconds` in short steps; True when the caller gave up on pending work meanwhile."""
    end = time.monotonic() + seconds
    while (remaining := end - time.monotonic()) > 0:
        if gave_up():
            return True
        time.sleep(min(remaining, 0.1))
    return gave_up()
