"""A tiny UDP name server for tests: answers A queries for the names its rules match, after
the rule's delay, or never; AAAA with no record; anything else with NXDOMAIN.

Run it where it should answer (``python -m tests.dns_stub --rule slow=1:127.0.0.1
--rule never=-``): a rule ``PREFIX=DELAY:ADDRESS`` applies to names whose first label starts
with PREFIX; ``PREFIX=-`` never answers. It prints ``ready`` once it listens.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import struct
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

TYPE_A = 1
TYPE_AAAA = 28


@dataclass(frozen=True)
class Rule:
    """How to answer names starting with ``prefix``: after ``delay`` seconds (None: never)."""

    prefix: str
    delay: float | None
    address: str | None


def parse_rule(text: str) -> Rule:
    """``PREFIX=DELAY:ADDRESS`` or ``PREFIX=-``."""
    prefix, _, how = text.partition("=")
    if how == "-":
        return Rule(prefix, None, None)
    delay, _, address = how.partition(":")
    return Rule(prefix, float(delay), address)


def question(packet: bytes) -> tuple[str, int, int]:
    """The query's name, type and where the question ends."""
    labels, at = [], 12
    while packet[at]:
        length = packet[at]
        labels.append(packet[at + 1 : at + 1 + length].decode("ascii", "replace"))
        at += 1 + length
    qtype = struct.unpack("!H", packet[at + 1 : at + 3])[0]
    return ".".join(labels).lower(), qtype, at + 5


def answer(packet: bytes, address: str | None) -> bytes:
    """The response to ``packet``: an A record of ``address`` for an A query with one, no
    record for other types, NXDOMAIN when ``address`` is None."""
    _, qtype, end = question(packet)
    records = b""
    if address is not None and qtype == TYPE_A:
        rdata = ipaddress.IPv4Address(address).packed
        records = struct.pack("!HHHIH", 0xC00C, TYPE_A, 1, 30, len(rdata)) + rdata
    flags = 0x8180 if address is not None else 0x8183
    header = struct.pack("!HHHHHH", struct.unpack("!H", packet[:2])[0], flags, 1,
                         1 if records else 0, 0, 0)  # fmt: skip
    return header + packet[12:end] + records


def serve(rules: Sequence[Rule], host: str = "127.0.0.1", port: int = 53) -> None:
    """Answer queries until killed."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, port))
    print("ready", flush=True)  # noqa: T201
    while True:
        packet, peer = sock.recvfrom(4096)
        try:
            name, _, _ = question(packet)
        except (IndexError, struct.error):
            continue
        rule = next((r for r in rules if name.startswith(r.prefix)), None)
        if rule is None:
            sock.sendto(answer(packet, None), peer)
        elif rule.delay is not None:
            reply = answer(packet, rule.address)
            threading.Timer(rule.delay, sock.sendto, (reply, peer)).start()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.dns_stub --rule ...``."""
    parser = argparse.ArgumentParser(prog="dns_stub")
    parser.add_argument("--rule", action="append", default=[], type=parse_rule)
    parser.add_argument("--port", type=int, default=53)
    args = parser.parse_args(argv)
    serve(args.rule, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
