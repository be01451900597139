"""A loopback TCP proxy with a switch that black-holes every connection through it."""

from __future__ import annotations

import contextlib
import select
import socket
import threading


class BlackHoleProxy:
    """Forwards 127.0.0.1:``port`` to ``target``. ``black_hole()`` stops forwarding in both
    directions and leaves every socket open: the peer accepts bytes and never answers, as a
    hung pooler or a frozen server would. New connections are accepted and left unanswered.
    ``heal()`` forwards again, what waited included (as TCP retransmission would deliver it).
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._holed = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def black_hole(self) -> None:
        """Stop forwarding anything, closing nothing."""
        self._holed.set()

    def heal(self) -> None:
        """Forward again."""
        self._holed.clear()

    def close(self) -> None:
        """Close the listener and every connection."""
        self._closed.set()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._keep(client)
            if self._holed.is_set():
                continue  # accepted, never answered
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            self._keep(upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(src, dst), name="proxy-pump", daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while not self._closed.is_set():
            if self._holed.is_set():
                self._closed.wait(0.02)  # bytes pile up in the kernel's buffers meanwhile
                continue
            try:
                readable, _, _ = select.select([src], [], [], 0.05)
                if not readable or self._holed.is_set():
                    continue
                data = src.recv(65536)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except (OSError, ValueError):
                return
