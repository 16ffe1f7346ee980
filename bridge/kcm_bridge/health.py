"""Whether Kafka is usable right now, and when to check again: failures are retried with backoff and reported
once per backoff period, so a broker that rejects the credentials does not flood the log."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from kcm_common.retry import RetryPolicy, backoff_s

# Reconnecting is librdkafka's and kafka-python's job; this paces the bridge's own checks and reports.
KAFKA_RETRY = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=30.0, multiplier=2.0, jitter=0.2)


class KafkaHealth:
    """Not ok until the first check succeeds; a failure makes it not ok until a later check succeeds."""

    def __init__(self, retry: RetryPolicy = KAFKA_RETRY, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self._retry = retry
        self._clock = clock
        self._rng = rng or random.Random()
        self.ok = False
        self.problem: str | None = None
        self._failures = 0
        self._next_check = clock()

    def check_due(self) -> bool:
        return not self.ok and self._clock() >= self._next_check

    def failed(self, problem: str) -> float | None:
        """Record a failure; the seconds until the next check when this opens a backoff period (report it then),
        None when one is already running (it was reported)."""
        self.problem = problem
        if not self.ok and self._clock() < self._next_check:
            return None
        self.ok = False
        self._failures += 1
        delay = backoff_s(self._failures, self._retry, self._rng)
        self._next_check = self._clock() + delay
        return delay

    def recovered(self) -> bool:
        """Mark Kafka usable; True when it was failing before (worth a log line)."""
        was_failing = self._failures > 0
        self.ok, self.problem, self._failures = True, None, 0
        return was_failing
