"""The tools file's reload: what changed, a valid edit taken, a broken one refused."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

import pytest

from runyard.platform.settings import Settings
from runyard.registry.reload import LiveTools, RegistryChanges, live_registry, registry_changes
from runyard.registry.tools import ToolRegistry, ToolSpec, load_registry
from runyard.runners.docker.runner import DockerRunner
from worker.__main__ import registry_watch

SETTINGS = Settings(database_url="unused")
ECHO = '[tools.echo]\nimage = "runyard/toolbox:latest"\ncommand = ["echo", "one"]\n'
CAT = '[tools.cat]\nimage = "runyard/toolbox:latest"\ncommand = ["cat"]\n'
NET = '[tools.net]\nimage = "runyard/toolbox:latest"\ncommand = ["true"]\nnetwork = "egress"\n'


def tool(name: str, *command: str) -> ToolSpec:
    return ToolSpec(name=name, image="runyard/toolbox:latest", command=list(command))


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ({}, {}, RegistryChanges((), (), ())),
        ({}, {"a": tool("a", "x")}, RegistryChanges(("a",), (), ())),
        ({"a": tool("a", "x")}, {}, RegistryChanges((), ("a",), ())),
        ({"a": tool("a", "x")}, {"a": tool("a", "y")}, RegistryChanges((), (), ("a",))),
        ({"a": tool("a", "x")}, {"a": tool("a", "x")}, RegistryChanges((), (), ())),
        (
            {"b": tool("b", "x"), "a": tool("a", "x")},
            {"c": tool("c", "x"), "d": tool("d", "x"), "a": tool("a", "z")},
            RegistryChanges(("c", "d"), ("b",), ("a",)),
        ),
    ],
)
def test_registry_changes__names_added_removed_and_changed_tools(
    old: dict[str, ToolSpec], new: dict[str, ToolSpec], expected: RegistryChanges
):
    assert registry_changes(old, new) == expected
    assert bool(registry_changes(old, new)) == bool(
        expected.added or expected.removed or expected.changed
    )


def test_live_tools__a_replace_is_seen_by_every_holder():
    live = LiveTools({"a": tool("a", "x")})
    registry = ToolRegistry(tools=live)
    live.replace({"b": tool("b", "y")})
    assert registry.get("a") is None
    assert registry.names() == ["b"] and len(live) == 1


def watched(tmp_path: Path, text: str, seconds: float = 5) -> tuple[Path, Settings]:
    path = tmp_path / "tools.toml"
    path.write_text(text)
    return path, Settings(database_url="unused", tools_file=path, tools_reload_seconds=seconds)


def test_watcher__a_valid_edit_replaces_the_tools(tmp_path: Path):
    path, settings = watched(tmp_path, ECHO)
    registry, watcher = live_registry(load_registry(path, settings), settings, process="test")
    assert watcher.check() is False  # unchanged bytes are not parsed again
    path.write_text(ECHO + CAT)
    assert watcher.check() is True
    assert registry.names() == ["cat", "echo"]
    assert watcher.check() is False


def test_watcher__a_broken_file_keeps_the_old_tools_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    path, settings = watched(tmp_path, ECHO)
    registry, watcher = live_registry(load_registry(path, settings), settings, process="test")
    path.write_text(ECHO + "[tools.cat]\nimage = 3\n")
    with caplog.at_level(logging.ERROR, logger="runyard.registry.reload"):
        assert watcher.check() is False
        assert watcher.check() is False
    refused = [r for r in caplog.records if "is refused" in r.getMessage()]
    assert len(refused) == 1
    message = refused[0].getMessage()
    assert str(path) in message and "the 1 tools loaded before are kept" in message
    assert "tools.cat.image" in message
    assert registry.names() == ["echo"]
    path.write_text("not toml = = =")
    assert watcher.check() is False and registry.names() == ["echo"]
    path.unlink()
    assert watcher.check() is False and registry.names() == ["echo"]
    path.write_text(ECHO + CAT)
    assert watcher.check() is True and registry.names() == ["cat", "echo"]


@pytest.mark.parametrize(
    ("registry", "expected"),
    [
        (ToolRegistry(tools={}), "no tool named 'x'; GET /v1/tools lists them"),
        (
            ToolRegistry(tools={}, source=Path("/etc/runyard/tools.toml")),
            "no tool named 'x'; GET /v1/tools lists them. Tools come from the registry file"
            " /etc/runyard/tools.toml (RUNYARD_TOOLS_FILE), read when the process starts:"
            " restart it after an edit",
        ),
        (
            ToolRegistry(tools={}, source=Path("/etc/runyard/tools.toml"), reload_seconds=5.0),
            "no tool named 'x'; GET /v1/tools lists them. Tools come from the registry file"
            " /etc/runyard/tools.toml (RUNYARD_TOOLS_FILE); an edit is picked up within 5 s",
        ),
    ],
)
def test_unknown_tool_message__says_where_tools_come_from(registry: ToolRegistry, expected: str):
    assert registry.unknown_tool_message("x") == expected


def test_live_registry__reload_off_says_restart(tmp_path: Path):
    path, settings = watched(tmp_path, ECHO, seconds=0)
    registry, watcher = live_registry(load_registry(path, settings), settings, process="test")
    assert watcher.interval_seconds == 0
    assert "restart it after an edit" in registry.unknown_tool_message("x")


class EngineWithout:
    """An engine check that finds every tool it is shown on a network the engine lacks."""

    def __init__(self) -> None:
        self.shown: list[list[str]] = []

    def engine_problems(self, tools: list[ToolSpec]) -> list[str]:
        self.shown.append([t.name for t in tools])
        return [f"tools.{t.name}: the engine has no network 'egress'" for t in tools]


def test_worker_watch__checks_added_and_changed_tools_against_the_engine_and_logs_what_it_lacks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    path, settings = watched(tmp_path, ECHO + CAT, seconds=60)
    runner = EngineWithout()
    chores = registry_watch(settings, cast(DockerRunner, runner), load_registry(path, settings))
    path.write_text(ECHO.replace('"one"', '"two"') + NET)
    with caplog.at_level(logging.WARNING, logger="worker"):
        assert chores.run_due() > 0
    assert runner.shown == [["echo", "net"]]
    warned = [r.getMessage() for r in caplog.records if r.name == "worker"]
    assert warned == [
        f"the Docker engine cannot run every tool of {path}: "
        "tools.echo: the engine has no network 'egress'; "
        "tools.net: the engine has no network 'egress'"
    ]
    chores.start()
    chores.start()  # a worker started twice (start, then run_forever) has one such thread
    chores.stop()


def test_worker_watch__no_chore_when_reload_is_off(tmp_path: Path):
    path, settings = watched(tmp_path, ECHO, seconds=0)
    runner = EngineWithout()
    chores = registry_watch(settings, cast(DockerRunner, runner), load_registry(path, settings))
    path.write_text(ECHO + NET)
    chores.run_due()
    assert runner.shown == []
