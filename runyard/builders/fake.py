"""A builder that builds nothing: for tests of the worker's build loop without an engine."""

from __future__ import annotations

import threading
import time

from runyard.builder import BuildRequest, BuildResult, LogWriter


class FakeBuilder:
    """Records each build; ``fail`` names tags that fail, ``seconds`` how long one takes."""

    def __init__(self, *, seconds: float = 0.0, fail: frozenset[str] = frozenset()) -> None:
        self._seconds = seconds
        self._fail = fail
        self._lock = threading.Lock()
        self.images: dict[str, str] = {}
        self.built: list[str] = []

    def image_id(self, tag: str) -> str | None:
        """The fake image of a tag it built."""
        with self._lock:
            return self.images.get(tag)

    def build(self, request: BuildRequest, log: LogWriter, stop: threading.Event) -> BuildResult:
        """Write a line of log, wait ``seconds`` (or until stopped), then succeed or fail."""
        with self._lock:
            self.built.append(request.tag)
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
