"""An OTLP/HTTP sink on loopback for the tracing benchmarks: it reads every export, counts
its bytes and answers 200, as a collector would, in a process of its own.

``python -m bench.otlp_sink --port N``; ``traced(port)`` starts one for a benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.common import free_port, wait_until


class _Sink(BaseHTTPRequestHandler):
    received = 0

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        _Sink.received += len(self.rfile.read(length))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


def _answers(port: int) -> bool:
    import socket

    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


@contextlib.contextmanager
def otlp_sink() -> Iterator[str]:
    """A sink process on a free loopback port; yields its base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.otlp_sink", "--port", str(port)])
    try:
        wait_until(lambda: _answers(port), 10, "the OTLP sink")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.otlp_sink", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    ThreadingHTTPServer(("127.0.0.1", args.port), _Sink).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
