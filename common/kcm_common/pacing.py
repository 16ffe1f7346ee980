"""Log lines about one kind of event at most once per period, counting the ones held back in between: a stream of
corrupt records, a dead-letter topic that refuses every write, or clients reconnecting to a gateway whose broker is
gone, must not flood the log (metrics count each)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class PacedLog:
    """`paced(message, *args)` logs at most once per `period_s`; the next line says how many were held back."""

    def __init__(self, logger: logging.Logger, level: int, period_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger, self._level, self._period_s, self._clock = logger, level, period_s, clock
        self._lock = threading.Lock()   # called from the consuming thread and from producer callbacks
        self._next = float("-inf")
        self._held_back = 0

    def __call__(self, message: str, *args: object) -> None:
        with self._lock:
            now = self._clock()
            if now < self._next:
                self._held_back += 1
                return
            held_back, self._held_back = self._held_back, 0
            self._next = now + self._period_s
        if held_back:
            message += f" ({held_back} more like it in the last {self._period_s:g}s)"
        self._logger.log(self._level, message, *args)
