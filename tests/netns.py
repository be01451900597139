"""A network namespace of a test's own, with its own resolver: only a loopback interface,
``/etc/netns/<name>/resolv.conf`` naming a name server on that loopback, and a bridge that
lets processes in it reach the test's Postgres through a Unix socket (the namespace has no
route to the host's loopback). Needs root and ``ip``."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NETNS_ETC = Path("/etc/netns")


def can_make_namespaces() -> bool:
    """Whether this process may make network namespaces (root, with ``ip``)."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


@dataclass
class Namespace:
    """A namespace; processes started in it with ``start`` are killed when it goes."""

    name: str
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *args]

    def start(self, args: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
        """Start ``args`` inside the namespace (stdout piped, text)."""
        process = subprocess.Popen(  # type: ignore[call-overload]
            self.command(args), stdout=subprocess.PIPE, text=True, **kwargs
        )
        self.processes.append(process)
        return process  # type: ignore[no-any-return]


@contextlib.contextmanager
def network_namespace(resolver_options: str = "timeout:20 attempts:1") -> Iterator[Namespace]:
    """A fresh namespace whose resolver is 127.0.0.1 (its own loopback); removed, with its
    /etc/netns folder and every process started in it, when the block ends."""
    namespace = Namespace(f"ryt-{uuid.uuid4().hex[:10]}")
    etc = NETNS_ETC / namespace.name
    try:
        subprocess.run(["ip", "netns", "add", namespace.name], check=True)
        subprocess.run(["ip", "-n", namespace.name, "link", "set", "lo", "up"], check=True)
        etc.mkdir(parents=True)
        (etc / "resolv.conf").write_text(f"nameserver 127.0.0.1\noptions {resolver_options}\n")
        yield namespace
    finally:
        for process in namespace.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)
            if process.stdout is not None:
                process.stdout.close()
        subprocess.run(["ip", "netns", "delete", namespace.name], check=False)
        shutil.rmtree(etc, ignore_errors=True)
        with contextlib.suppress(OSError):
            NETNS_ETC.rmdir()  # only if no other namespace's folder is left in it


class UnixBridge:
    """Forwards connections to a Unix socket ``<directory>/.s.PGSQL.5432`` to a TCP address:
    libpq in a namespace reaches the host's Postgres with ``host=<directory>``."""

    PORT = 5432

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self.directory = tempfile.mkdtemp(prefix="ryt-pg-")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(os.path.join(self.directory, f".s.PGSQL.{self.PORT}"))
        self._listener.listen(64)
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = [self._listener]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="unix-bridge", daemon=True).start()

    def close(self) -> None:
        """Stop forwarding and remove the socket's directory."""
        self._closed.set()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                if self._closed.is_set():
                    return
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                readable, _, _ = select.select([src], [], [], 0.2)
                if not readable:
                    continue
                data = src.recv(65536)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except (OSError, ValueError):
                return
