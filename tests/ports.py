"""Loopback ports for servers a test starts later (a child process, a sandbox brought up mid-test)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def reserved_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port nothing else can take while the block runs: bound with SO_REUSEADDR and not listening, so connecting
    to it is refused, and a server started meanwhile (Python's, kopf's, Tansu's: all set SO_REUSEADDR) can listen on
    it. A port merely seen free can be taken by any connection's local end before the server binds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        yield sock.getsockname()[1]
