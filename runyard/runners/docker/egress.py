"""Egress allow-lists on the engine: a tool with ``egress = [...]`` gets a network of its own
attempt with no way out (``internal``) but one: a filtering proxy the platform starts on it,
also joined to the outbound network (the engine's bridge unless told otherwise).

The proxy (``egress_proxy.py`` with the rules of ``runyard.domain.egress``) runs from
``runyard/base`` (built here; never pulled) under the same hardening as a tool; the tool
finds it through ``HTTP_PROXY``/``HTTPS_PROXY``. Both are named after the attempt's container
(``<name>-egress``), so an adopter finds them; ``report`` stops the proxy and turns its
event lines into the run's ``egress`` events, ``remove`` removes both.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions
from docker.types import LogConfig

from runyard.runner import RunnerUnavailable

logger = logging.getLogger(__name__)

PROXY_IMAGE = "runyard/base:latest"
PROXY_PORT = 3128
LABEL_EGRESS_FOR = "io.runyard.egress_for"
# The tool's resolver behind the engine's own DNS: nothing listens there, so names outside the
# network (a channel out through the host's resolvers) do not resolve; the proxy's does.
EGRESS_DNS = ["127.0.0.1"]
# What one attempt may record: its first events, each line of a bounded length.
MAX_EVENTS = 500
MAX_LINE = 4096
# A proxy whose attempt has neither container nor volume left is an orphan past this age
# (younger, its attempt may be between the proxy's start and its own create).
ORPHAN_SECONDS = 600.0
LISTEN_SECONDS = 30.0
_SOURCES = Path(__file__).resolve().parent
_TRANSPORT_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


def egress_name(container: str) -> str:
    """The name of an attempt's egress network and of its proxy container."""
    return f"{container}-egress"


def wants_egress(tool: Mapping[str, Any]) -> bool:
    """Whether the tool's definition asks for an allow-list."""
    return bool(tool.get("egress"))


def proxy_env(container: str) -> dict[str, str]:
    """The tool's environment that sends HTTP and HTTPS through its proxy."""
    url = f"http://{egress_name(container)}:{PROXY_PORT}"
    return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url}


def proxy_program() -> str:
    """The proxy as one ``python3 -c`` program: the rules module registered under its own
    name, then the proxy run as ``__main__`` (the image has no runyard installed)."""
    rules = (_SOURCES.parent.parent / "domain" / "egress.py").read_text()
    proxy = (_SOURCES / "egress_proxy.py").read_text()
    return (
        "import sys, types\n"
        "for _n in ('runyard', 'runyard.domain'):\n"
        "    sys.modules[_n] = types.ModuleType(_n)\n"
        "_m = types.ModuleType('runyard.domain.egress')\n"
        "sys.modules['runyard.domain.egress'] = _m\n"
        f"exec(compile({rules!r}, 'egress.py', 'exec'), _m.__dict__)\n"
        f"exec(compile({proxy!r}, 'egress_proxy.py', 'exec'), {{'__name__': '__main__'}})\n"
    )


def read_events(log: str) -> list[dict[str, Any]]:
    """The proxy's connection events in its log, at most ``MAX_EVENTS``; anything else on a
    line (a traceback, its start line) is passed over."""
    events: list[dict[str, Any]] = []
    for line in log.splitlines():
        if len(events) >= MAX_EVENTS:
            break
        if len(line) > MAX_LINE or not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "host" in event and "allowed" in event:
            events.append(event)
    return events


class EgressGate:
    """Makes, reports on and removes the egress network and proxy of attempts."""

    def __init__(
        self, api: Any, outbound_network: str = "bridge", orphan_seconds: float = ORPHAN_SECONDS
    ) -> None:
        self._api = api
        self._outbound = outbound_network
        self._orphan_seconds = orphan_seconds
        # Attempts whose proxy this process made or reported on and has not removed yet:
        # ``discard`` asks the engine only about these.
        self._open: set[str] = set()

    def prepare(self, container: str, tool: Mapping[str, Any], labels: Mapping[str, str]) -> None:
        """The attempt's internal network and its started proxy (made if missing)."""
        name = egress_name(container)
        own = {**labels, LABEL_EGRESS_FOR: container}
        self._open.add(container)
        try:
            self._network(name, own)
            self._proxy(name, tool, own)
            self._wait_listening(name)
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot set up the egress proxy {name}: {exc}") from exc

    def _wait_listening(self, name: str) -> None:
        """Until the proxy says it listens: a tool started before would find no way out."""
        deadline = time.monotonic() + LISTEN_SECONDS
        while b'"listening"' not in self._api.logs(name, stdout=True, stderr=False, tail=5):
            if time.monotonic() > deadline:
                waited = f"{LISTEN_SECONDS:g} s"
                raise RunnerUnavailable(f"the egress proxy {name} did not listen within {waited}")
            time.sleep(0.05)

    def _network(self, name: str, labels: Mapping[str, str]) -> None:
        try:
            self._api.create_network(name, driver="bridge", internal=True, labels=dict(labels))
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise

    def _proxy(self, name: str, tool: Mapping[str, Any], labels: Mapping[str, str]) -> None:
        host_config = self._api.create_host_config(
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            read_only=True,
            network_mode=self._outbound,
            mem_limit=64 << 20,
            memswap_limit=64 << 20,
            nano_cpus=250_000_000,
            pids_limit=32,
            init=True,
            # Its event lines: the runner reads the first MAX_EVENTS; the rest is capped.
            log_config=LogConfig(type="json-file", config={"max-size": "4m", "max-file": "1"}),
        )
        try:
            self._api.create_container(
                PROXY_IMAGE,
                ["python3", "-c", proxy_program()],
                name=name,
                labels=dict(labels),
                environment={"RUNYARD_EGRESS_RULES": json.dumps(list(tool["egress"]))},
                user="65534:65534",
                detach=True,
                host_config=host_config,
            )
            self._api.connect_container_to_network(name, name, aliases=[name])
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise
        self._api.start(name)

    def report(self, container: str, note: Callable[[str, dict[str, Any]], None]) -> int:
        """Stop the proxy (its open connections end and are printed) and record each of its
        events as an ``egress`` event; how many were recorded."""
        name = egress_name(container)
        try:
            self._api.stop(name, timeout=2)
            log = self._head_of_log(name)
        except docker.errors.NotFound:
            return 0
        except _TRANSPORT_ERRORS as exc:
            logger.warning("cannot read the egress proxy's events", extra={"error": str(exc)})
            return 0
        self._open.add(container)
        events = read_events(log)
        for event in events:
            note("egress", event)
        return len(events)

    def _head_of_log(self, name: str) -> str:
        """The start of the proxy's stdout, never more than ``MAX_EVENTS`` lines can fill."""
        stream = self._api.logs(name, stdout=True, stderr=False, stream=True, follow=False)
        head = bytearray()
        try:
            for chunk in stream:
                head += chunk
                if len(head) >= MAX_EVENTS * MAX_LINE:
                    break
        finally:
            stream.close()
        return bytes(head[: MAX_EVENTS * MAX_LINE]).decode("utf-8", "replace")

    def note_leftovers(self, attempts: set[str]) -> int:
        """Take note of the engine's egress proxies (the sweep's pass over the engine): that of
        an attempt in ``attempts`` goes with the attempt's ``discard`` from now on, one whose
        attempt is gone is removed now, past ``ORPHAN_SECONDS``; how many were removed."""
        try:
            proxies = self._api.containers(all=True, filters={"label": LABEL_EGRESS_FOR})
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot list egress proxies: {exc}") from exc
        removed = 0
        for summary in proxies:
            owner = str((summary.get("Labels") or {}).get(LABEL_EGRESS_FOR) or "")
            if not owner:
                continue
            if owner in attempts:
                self._open.add(owner)
            elif time.time() - float(summary.get("Created") or 0) > self._orphan_seconds:
                self.remove(owner)
                removed += 1
        return removed

    def discard(self, container: str) -> None:
        """Remove the proxy and network of an attempt this process set up or reported on."""
        if container in self._open:
            self.remove(container)
            self._open.discard(container)

    def remove(self, container: str) -> None:
        """Remove the attempt's proxy and network (gone already: nothing to do)."""
        name = egress_name(container)
        try:
            with contextlib.suppress(docker.errors.NotFound):
                self._api.remove_container(name, force=True)
            with contextlib.suppress(docker.errors.NotFound):
                self._api.remove_network(name)
        except _TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot remove the egress proxy {name}: {exc}") from exc
