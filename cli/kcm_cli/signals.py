"""SIGINT/SIGTERM handling for the long-running commands, with no lock taken inside a signal handler.

A Python signal handler runs in the main thread between two bytecodes, possibly while that thread holds a lock: a
handler calling `threading.Event.set()` while the main thread is inside `Event.wait()` (which holds the event's lock
on its way in and out) blocks forever on that lock. So the handler does nothing; Python's C handler writes the signal
number to a wakeup socket, and a watcher thread calls `on_signal` from there.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# GNU `timeout`, and any kill of a process group, delivers one signal twice within a millisecond or so (to the child
# and to its group): the same signal again within this window is that copy, not a person asking again.
SAME_SIGNAL_S = 1.0
_wakeup: list[socket.socket] = []  # both ends, for the life of the process: a collected one closes the wakeup fd


def on_stop_signals(on_signal: Callable[[signal.Signals], None]) -> None:
    """Call `on_signal(signum)` on a watcher thread at each SIGINT/SIGTERM. Call from the main thread, once."""
    reader, writer = socket.socketpair()
    _wakeup.extend((reader, writer))
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda *_: None)  # a Python handler, so the C handler writes the wakeup byte

    def watch() -> None:
        while data := reader.recv(64):
            for signum in data:
                if signum in STOP_SIGNALS:
                    on_signal(signal.Signals(signum))

    threading.Thread(target=watch, name="kcm-signals", daemon=True).start()


class StopRequests:
    """Tells a new stop request from the copy of the last one that a process-group kill delivers."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: tuple[int, float] | None = None   # the last request's signal, and when it came

    def is_copy(self, signum: int) -> bool:
        """Whether `signum` is the last request's copy (the same signal within SAME_SIGNAL_S of it); if not, it is
        the last request from now on."""
        now = self._clock()
        if self._last is not None and self._last[0] == signum and now - self._last[1] < SAME_SIGNAL_S:
            return True
        self._last = (int(signum), now)
        return False
