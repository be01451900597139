"""The egress proxy: runs in its own container beside a tool with an ``egress`` list, the one
way out of the tool's internal network. Standard library only (it runs in
``runyard/base``, with the rules of ``runyard.domain.egress`` shipped beside it).

It speaks HTTP proxy: ``CONNECT host:port`` (TLS and any TCP) and absolute-form requests
(``GET http://host:port/path``, plain HTTP). Each connection is decided by the rules against
the address its host resolves to, and connected to exactly that address (no second lookup
a name could change in between). Every allowed and refused connection prints one JSON line
on stdout with its byte counts, when it ends; the runner turns them into run events.
Everything a tool sends is hostile: the request head is capped, connections are capped and
time out when idle.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import signal
import socket
import sys
import time
from typing import Any

from runyard.domain.egress import EgressRule, decide, parse_rule, unlisted

PORT = 3128
MAX_HEAD = 16 * 1024
MAX_CONNECTIONS = 64
IDLE_SECONDS = 60.0
CHUNK = 64 * 1024


class Connection:
    """One proxied connection's facts, printed as one event line when it ends."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.address = ""
        self.refused: str | None = None
        self.bytes_out = 0
        self.bytes_in = 0
        self.started = time.monotonic()

    def event(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "address": self.address,
            "allowed": self.refused is None,
            "reason": self.refused,
            "bytes_out": self.bytes_out,
            "bytes_in": self.bytes_in,
            "seconds": round(time.monotonic() - self.started, 3),
        }


# The runner records the first 500 connections of an attempt: printing many more only
# fills the log.
MAX_LINES = 1000
_printed = [0]


def emit(event: dict[str, Any]) -> None:
    """One event line on stdout (the runner reads the container's log), up to ``MAX_LINES``."""
    if _printed[0] >= MAX_LINES:
        return
    _printed[0] += 1
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def read_target(head: bytes) -> tuple[str, int, bytes | None]:
    """The host, port and (absolute-form HTTP) the request to send on, from a request head;
    ValueError if it is neither CONNECT nor an absolute http URL."""
    first, _, rest = head.partition(b"\r\n")
    parts = first.decode("latin-1").split(" ")
    if len(parts) != 3:
        raise ValueError("not an HTTP request line")
    method, target, version = parts
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        return _checked(host.strip("[]")), int(port), None
    if not target.startswith("http://"):
        raise ValueError("only CONNECT and absolute http:// requests are proxied")
    authority, _, path = target[len("http://") :].partition("/")
    host, colon, port = authority.rpartition(":")
    if not colon or "]" in port:
        host, port = authority, "80"
    # Origin form: the path (always at least "/") and the query, never the authority again.
    request = f"{method} /{path} {version}\r\n".encode("latin-1") + rest
    return _checked(host.strip("[]")), int(port), request


def _checked(host: str) -> str:
    """A host name of a length DNS allows (it goes into events and their reasons)."""
    if not host or len(host) > 253:
        raise ValueError("no host, or a host name longer than DNS allows")
    return host


async def resolve(host: str, port: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The first address ``host`` resolves to (an address is itself)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return ipaddress.ip_address(infos[0][4][0])


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: Any) -> None:
    """Copy until EOF or silence, counting bytes through ``count``."""
    try:
        while True:
            data = await asyncio.wait_for(reader.read(CHUNK), IDLE_SECONDS)
            if not data:
                break
            count(len(data))
            writer.write(data)
            await writer.drain()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


class Proxy:
    """The listener: one task per client connection, at most ``MAX_CONNECTIONS`` at once."""

    def __init__(self, rules: list[EgressRule]) -> None:
        self.rules = rules
        self.slots = asyncio.Semaphore(MAX_CONNECTIONS)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with self.slots:
            try:
                await self._handle(reader, writer)
            finally:
                writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_SECONDS)
            host, port, request = read_target(head[:MAX_HEAD])
        except (
            ValueError,
            OSError,
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            return
        conn = Connection(host.lower(), port)
        # An unlisted host is refused before any lookup: no name of the tool's leaves.
        conn.refused = unlisted(self.rules, host, port)
        if conn.refused is None:
            try:
                address = await resolve(host, port)
                conn.address = str(address)
                conn.refused = decide(self.rules, host, port, address)
            except (OSError, ValueError) as exc:
                conn.refused = f"{host} does not resolve: {exc}"
        if conn.refused is not None:
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            emit(conn.event())
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(conn.address, port), IDLE_SECONDS
            )
        except (OSError, TimeoutError) as exc:
            conn.refused = f"cannot connect: {exc}"
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            emit(conn.event())
            return
        if request is None:
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        else:
            up_writer.write(request)
            conn.bytes_out += len(request)

        def sent(n: int) -> None:
            conn.bytes_out += n

        def received(n: int) -> None:
            conn.bytes_in += n

        try:
            await asyncio.gather(pipe(reader, up_writer, sent), pipe(up_reader, writer, received))
        finally:
            emit(conn.event())


async def serve(rules: list[EgressRule], port: int = PORT) -> None:
    """Serve until SIGTERM; open connections are cut and their events printed."""
    proxy = Proxy(rules)
    server = await asyncio.start_server(proxy.handle, "0.0.0.0", port, limit=MAX_HEAD)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    emit({"listening": port})
    async with server:
        await stop.wait()
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    """Read the rules from ``RUNYARD_EGRESS_RULES`` (a JSON list) and serve."""
    rules = [parse_rule(text) for text in json.loads(os.environ["RUNYARD_EGRESS_RULES"])]
    asyncio.run(serve(rules))


if __name__ == "__main__":
    main()
