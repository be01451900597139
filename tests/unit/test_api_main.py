"""``python -m api``: one process by default, uvicorn workers on request (queue mode only)."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import uvicorn

import api.__main__ as api_main


class RecordingServer:
    """Stands for ``QuietServer``: records what it was to serve, starts or fails as told."""

    starts = True
    served: ClassVar[list[uvicorn.Config]] = []

    def __init__(self, config: uvicorn.Config) -> None:
        self.config = config
        self.started = False

    def run(self) -> None:
        self.served.append(self.config)
        self.started = self.starts


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, dict[str, Any]]]]:
    calls: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    monkeypatch.setattr(RecordingServer, "served", [])
    monkeypatch.setattr(api_main, "QuietServer", RecordingServer)
    monkeypatch.setenv("RUNYARD_DATABASE_URL", "postgresql://unused@127.0.0.1/unused")
    monkeypatch.delenv("RUNYARD_UI_SESSION_SECRET", raising=False)
    yield calls
    gc.unfreeze()  # the test process's objects go back to the collector


def test_main__workers_run_the_factory_and_share_one_session_secret(
    served: list[tuple[Any, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RUNYARD_API_WORKERS", "3")
    assert api_main.main(["--port", "8123"]) == 0
    [(app, options)] = served
    assert app == "api.__main__:app_from_env" and options["factory"] is True
    assert (options["workers"], options["port"]) == (3, 8123)
    assert len(os.environ["RUNYARD_UI_SESSION_SECRET"]) == 64


def test_main__one_process_by_default_on_the_quiet_server_with_what_startup_made_frozen(
    served: list[tuple[Any, dict[str, Any]]],
):
    gc.unfreeze()
    assert api_main.main(["--port", "8123"]) == 0
    assert served == []  # not uvicorn's own server
    [config] = RecordingServer.served
    assert not isinstance(config.app, str) and (config.port, config.workers) == (8123, 1)
    assert gc.get_freeze_count() > 0


def test_main__a_server_that_never_started_exits_as_uvicorn_does(
    served: list[tuple[Any, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(RecordingServer, "starts", False)
    assert api_main.main(["--port", "8123"]) == 3


def test_main__workers_are_refused_in_sync_mode(
    served: list[tuple[Any, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RUNYARD_QUEUE_ENABLED", "false")
    with pytest.raises(SystemExit) as refused:
        api_main.main(["--workers", "2"])
    assert refused.value.code == 2 and served == []
