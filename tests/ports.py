"""Loopback ports for servers a test starts later (a child process, a sandbox brought up mid-test)."""

from __future__ import annotations

import socket
import threading
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


class CountingProxy:
    """A loopback TCP proxy that counts the bytes its clients send (servers hide what compression saved)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._server.getsockname()[1]}"
        self.sent = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream)
            threading.Thread(target=self._pipe, args=(downstream, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, downstream, False), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket, count: bool) -> None:
        try:
            while data := source.recv(65536):
                if count:
                    with self._lock:
                        self.sent += len(data)
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()
