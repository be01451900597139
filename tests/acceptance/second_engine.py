"""A second dockerd of a test's own, which the test may stop and start (never the main one).

It has its own data root, exec root, socket and network namespace: beside the first daemon in
one namespace, a second one was seen to delete the first daemon's ``docker0``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from runyard.runners.docker.engine_marker import MARKER_NAME
from runyard.runners.docker.labels import LABEL_MANAGED
from tests.integration.conftest import _quietly

TOOLBOX = "runyard/toolbox:latest"


def can_run_second_daemon() -> bool:
    """A second dockerd needs root, dockerd, ip and nsenter."""
    return os.geteuid() == 0 and all(shutil.which(b) for b in ("dockerd", "ip", "nsenter"))


class SecondEngine:
    """One extra Docker engine named ``name``; ``live_restore`` keeps containers across stops."""

    def __init__(self, name: str, logs: Path, *, live_restore: bool = False) -> None:
        self.name = name
        self.socket = Path(f"/var/run/{name}.sock")
        self.host = f"unix://{self.socket}"
        self._data = Path(f"/var/lib/{name}")
        self._exec = Path(f"/var/run/{name}")
        self._pidfile = Path(f"/var/run/{name}.pid")
        self._logs = logs
        self._config = logs / f"{name}.json"
        self._config.write_text(json.dumps({"live-restore": live_restore}))
        self._proc: subprocess.Popen[bytes] | None = None
        self._client: docker.DockerClient | None = None

    @property
    def client(self) -> docker.DockerClient:
        """A client of this engine (valid across restarts)."""
        assert self._client is not None, "the engine was never started"
        return self._client

    def start(self, timeout: float = 60) -> None:
        """Start dockerd and wait until it answers; the first start loads the tool image."""
        if not can_run_second_daemon():
            pytest.skip("a second dockerd needs root, dockerd, ip and nsenter")
        first_start = self._client is None
        if first_start:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "add", self.name], check=True)
        with (self._logs / f"{self.name}.log").open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    # nsenter switches only the network namespace (ip netns exec hides cgroups).
                    "nsenter",
                    f"--net=/var/run/netns/{self.name}",
                    "dockerd",
                    "--config-file",
                    str(self._config),
                    "--host",
                    self.host,
                    "--data-root",
                    str(self._data),
                    "--exec-root",
                    str(self._exec),
                    "--pidfile",
                    str(self._pidfile),
                    "--storage-driver",
                    _storage_driver(),
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        if first_start:
            self._client = docker.DockerClient(base_url=self.host, timeout=60, version="1.41")
        self._wait_until_it_answers(timeout)
        if first_start:
            _load_toolbox(self.client)

    def _wait_until_it_answers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self._proc is not None and self._proc.poll() is None, self.log_tail()
            with contextlib.suppress(docker.errors.DockerException, OSError):
                if self.socket.exists() and self.client.ping():
                    return
            assert time.monotonic() < deadline, f"{self.name} did not answer\n{self.log_tail()}"
            time.sleep(0.2)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM dockerd and wait for it (with live-restore its containers keep running)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._pidfile.unlink(missing_ok=True)

    def log_tail(self) -> str:
        """The end of this dockerd's log."""
        path = self._logs / f"{self.name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def close(self) -> None:
        """Remove what the tests left in it, stop dockerd, drop the namespace."""
        try:
            if self._client is not None:
                if self._proc is None or self._proc.poll() is not None:
                    self.start()  # stopped by the test: back once, to leave its data root clean
                self._clean()
                self._client.close()
        finally:
            self.stop()
            shutil.rmtree(self._exec, ignore_errors=True)
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
        docker0 = subprocess.run(["ip", "link", "show", "docker0"], capture_output=True)
        assert docker0.returncode == 0, "the first daemon lost its bridge"

    def _clean(self) -> None:
        # The engine's marker stays (its id with it); a worker may be removing its own
        # container right now (404/409).
        api = self.client.api
        for container in api.containers(all=True):
            if f"/{MARKER_NAME}" not in (container.get("Names") or []):
                _quietly(functools.partial(api.remove_container, container["Id"], force=True))
        for volume in self.client.volumes.list(filters={"label": f"{LABEL_MANAGED}=true"}):
            if volume.name != MARKER_NAME:
                _quietly(functools.partial(volume.remove, force=True))


@contextlib.contextmanager
def started_engine(name: str, logs: Path) -> Iterator[SecondEngine]:
    """A second engine named ``name``, started, and closed at the end."""
    engine = SecondEngine(name, logs)
    try:
        engine.start()
        yield engine
    finally:
        engine.close()


def _storage_driver() -> str:
    first = docker.from_env(timeout=60)
    try:
        return str(first.info()["Driver"])
    finally:
        first.close()


def _load_toolbox(client: docker.DockerClient) -> None:
    first = docker.from_env(timeout=60)
    try:
        image = first.images.get(TOOLBOX)
        client.images.load(b"".join(image.save(named=True)))
    finally:
        first.close()
