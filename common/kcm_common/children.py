"""Child processes that do not outlive kcm: a SIGKILLed sandbox or demo must not leave a broker holding its port."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1


def dying_with_us() -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen: the child gets SIGKILL when this process dies (Linux), else None.

    Linux sends the signal when the *thread* that started the child ends, so it is only asked for from the main
    thread, whose end is the process's end. Elsewhere children are stopped by their owner's stop() as before.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return in_child


def own_child() -> dict[str, Any]:
    """subprocess options for a child kcm starts and stops itself: its own session, so a terminal's Ctrl-C reaches
    kcm alone, which stops the child in order (not both at once); and `dying_with_us`, so a SIGKILLed kcm leaves
    nothing running (a broker holding its port, a JVM waiting on stdin)."""
    return {"start_new_session": True, "preexec_fn": dying_with_us()}
