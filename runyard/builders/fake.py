"""A builder that builds nothing: for tests of the worker's build loop without an engine."""

from __future__ import annotations

import threading
import time

from runyard.builder import BuildRequest, BuildResult, LogWriter
from runyard.domain.usage import BuildUsage


class FakeBuilder:
    """Records each build; ``fail`` names tags that fail, ``seconds`` how long one takes,
    ``cpu_seconds`` what each build's steps are said to have used."""

    def __init__(
        self,
        *,
        seconds: float = 0.0,
        fail: frozenset[str] = frozenset(),
        cpu_seconds: float | None = None,
    ) -> None:
        self._seconds = seconds
        self._fail = fail
        self._cpu_seconds = cpu_seconds
        self._lock = threading.Lock()
        self.images: dict[str, str] = {}
        self.built: list[str] = []
        self.forgotten: list[str] = []
        self._runs: dict[str, int] = {}

    def usage(self, meter_name: str) -> BuildUsage:
        """``cpu_seconds`` of the builds under that name, no memory peak."""
        if self._cpu_seconds is None:
            return BuildUsage()
        with self._lock:
            return BuildUsage(cpu_seconds=self._cpu_seconds * self._runs.get(meter_name, 0))

    def forget_usage(self, meter_name: str) -> None:
        """Noted."""
        with self._lock:
            self.forgotten.append(meter_name)

    def image_id(self, tag: str) -> str | None:
        """The fake image of a tag it built."""
        with self._lock:
            return self.images.get(tag)

    def build(self, request: BuildRequest, log: LogWriter, stop: threading.Event) -> BuildResult:
        """Write a line of log, wait ``seconds`` (or until stopped), then succeed or fail."""
        with self._lock:
            self.built.append(request.tag)
            self._runs[request.meter_name] = self._runs.get(request.meter_name, 0) + 1
        log(f"Step 1/1 : building {request.tag}\n")
        deadline = time.monotonic() + self._seconds
        while time.monotonic() < deadline:
            if stop.wait(0.01):
                return BuildResult(error="stopped")
        if request.tag in self._fail:
            log("ERROR: the fake build failed\n")
            return BuildResult(error="fake failure")
        image = f"sha256:{len(self.built):064x}"
        with self._lock:
            self.images[request.tag] = image
        return BuildResult(image_id=image)
