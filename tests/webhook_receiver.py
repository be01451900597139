"""A webhook receiver for tests: a threaded HTTP server on loopback that records every
request and answers with a status the test picks (optionally after holding the request)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook


@dataclass(frozen=True)
class Received:
    """One request as it arrived."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.time)  # wall clock, to compare with the database's

    @property
    def webhook_id(self) -> str:
        """The ``webhook-id`` header."""
        return self.headers["webhook-id"]

    def verified(self, secret: str) -> Any:
        """The body, parsed, after the library's own verifier accepted the signature."""
        return Webhook(secret).verify(self.body, self.headers)

    def run(self) -> dict[str, Any]:
        """The body as JSON."""
        return dict(json.loads(self.body))


@dataclass
class Receiver:
    """Records requests; ``status`` (and ``location``) say how to answer; while ``hold`` is
    clear, requests wait for it (``held`` counts them); requests to a path in ``silent`` are
    never answered while the receiver is open."""

    url: str
    port: int
    status: int = 200
    location: str | None = None
    received: list[Received] = field(default_factory=list)
    hold: threading.Event = field(default_factory=threading.Event)
    held: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    silent: set[str] = field(default_factory=set)
    closing: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.hold.set()

    def of_path(self, path: str) -> list[Received]:
        """What arrived at ``path``."""
        with self.lock:
            return [r for r in self.received if r.path == path]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            seen = Received(
                "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body
            )
            with receiver.lock:
                receiver.received.append(seen)
                receiver.held += 0 if receiver.hold.is_set() else 1
            receiver.hold.wait(60)
            if self.path in receiver.silent:
                receiver.closing.wait(60)
            self.send_response(receiver.status)
            if receiver.location is not None:
                self.send_header("Location", receiver.location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class _QuietServer(ThreadingHTTPServer):
    """Peers that hang up (a killed sender) are expected here: no traceback on stderr."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


@contextmanager
def receiver_on(port: int = 0, path: str = "/hook") -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 (``port`` 0: a free one) until the block ends."""
    receiver = Receiver(url="", port=port)
    server = _QuietServer(("127.0.0.1", port), _handler(receiver))
    server.daemon_threads = True
    receiver.port = server.server_address[1]
    receiver.url = f"http://127.0.0.1:{receiver.port}{path}"
    thread = threading.Thread(target=server.serve_forever, name="test-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.closing.set()
        receiver.hold.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
