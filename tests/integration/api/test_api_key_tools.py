"""Keys limited to some tools: refused elsewhere on every way in (a run, a batch, a rerun, a
schedule, a sandbox), shown only their tools, changed and lifted by an admin, from the CLI too."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import authenticate, create_api_key
from runyard.tenancy.keys import list_keys, prefix_of
from tests.integration.api.test_api_helpers import bearer, make_app


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry):
    with TestClient(make_app(database_url, engine, registry)) as made:
        yield made


@pytest.fixture
def echo_only(engine: Engine) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_api_key(engine, 'acme', tools=['echo'])}"}


def test_scoped_key__runs_its_tool_and_is_refused_another_with_403(
    client: TestClient, echo_only: dict[str, str]
):
    ran = client.post("/v1/runs", json={"tool": "echo", "input": {}}, headers=echo_only)
    assert ran.status_code == 202, ran.text
    refused = client.post("/v1/runs", json={"tool": "sleep", "input": {}}, headers=echo_only)
    assert refused.status_code == 403
    problem = refused.json()
    assert (problem["code"], problem["field"]) == ("tool_not_allowed", "tool")
    assert "sleep" in problem["detail"]


def test_scoped_key__a_batch_naming_another_tool_is_refused_whole_naming_the_item(
    client: TestClient, echo_only: dict[str, str]
):
    runs = [{"tool": "echo", "input": {}}, {"tool": "sleep", "input": {}}]
    refused = client.post("/v1/batches", json={"runs": runs}, headers=echo_only)
    assert refused.status_code == 403, refused.text
    assert (refused.json()["code"], refused.json()["field"]) == ("tool_not_allowed", "runs[1].tool")
    listed = client.get("/v1/runs", headers=echo_only).json()["items"]
    assert listed == []  # nothing of the batch was written


def test_scoped_key__may_not_rerun_another_keys_run_of_a_tool_it_may_not_run(
    client: TestClient, engine: Engine, echo_only: dict[str, str]
):
    acme = bearer(engine, "acme")
    sleep = {"tool": "sleep", "input": {"seconds": 1}}
    other = client.post("/v1/runs", json=sleep, headers=acme).json()
    client.post(f"/v1/runs/{other['id']}/cancel", headers=acme)
    rerun = client.post(f"/v1/runs/{other['id']}/rerun", headers=echo_only)
    assert rerun.status_code == 403 and rerun.json()["code"] == "tool_not_allowed"


def test_scoped_key__may_not_schedule_another_tool(client: TestClient, echo_only: dict[str, str]):
    body = {"tool": "sleep", "input": {"seconds": 1}, "every_seconds": 60}
    refused = client.post("/v1/schedules", json=body, headers=echo_only)
    assert refused.status_code == 403 and refused.json()["code"] == "tool_not_allowed"
    body = {"tool": "echo", "input": {}, "every_seconds": 60}
    assert client.post("/v1/schedules", json=body, headers=echo_only).status_code == 201


def test_scoped_key__may_not_hold_a_sandbox_of_another_tool(client: TestClient, engine: Engine):
    echo_only = {"Authorization": f"Bearer {create_api_key(engine, 'acme', tools=['echo'])}"}
    refused = client.post("/v1/sandboxes", json={"tool": "sandbox"}, headers=echo_only)
    assert refused.status_code == 403 and refused.json()["code"] == "tool_not_allowed"
    allowed = {"Authorization": f"Bearer {create_api_key(engine, 'acme', tools=['sandbox'])}"}
    made = client.post("/v1/sandboxes", json={"tool": "sandbox"}, headers=allowed)
    assert made.status_code == 201, made.text


def test_scoped_key__lists_only_its_tools_where_tools_are_listed(
    client: TestClient, engine: Engine, echo_only: dict[str, str], registry: ToolRegistry
):
    listed = client.get("/v1/tools", headers=echo_only).json()
    assert [t["name"] for t in listed] == ["echo"]
    every = client.get("/v1/tools", headers=bearer(engine, "acme")).json()
    assert {t["name"] for t in every} == set(registry.tools)


def test_keys_api__tools_set_changed_and_lifted_by_an_admin(client: TestClient, engine: Engine):
    admin = bearer(engine, "ops", admin=True)
    made = client.post("/v1/keys", json={"tenant": "acme", "tools": ["echo"]}, headers=admin)
    assert made.status_code == 201 and made.json()["tools"] == ["echo"]
    key, prefix = made.json()["key"], made.json()["prefix"]
    changed = client.patch(f"/v1/keys/{prefix}", json={"tools": ["sleep", "echo"]}, headers=admin)
    assert changed.status_code == 200 and changed.json()["tools"] == ["echo", "sleep"]
    assert changed.json()["max_priority"] == 0  # what was not given is kept
    principal = authenticate(engine, key)
    assert principal is not None and principal.tools == frozenset({"echo", "sleep"})
    lifted = client.patch(f"/v1/keys/{prefix}", json={"all_tools": True}, headers=admin)
    assert lifted.status_code == 200 and lifted.json()["tools"] is None
    sleep = client.post(
        "/v1/runs",
        json={"tool": "sleep", "input": {"seconds": 1}},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert sleep.status_code == 202, sleep.text  # this process forgot the cached key at once


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "give max_priority, tools or all_tools"),
        ({"tools": []}, "tools"),
        ({"tools": ["Not A Tool!"]}, "tools"),
        ({"tools": ["echo"], "all_tools": True}, "not both"),
    ],
    ids=["nothing", "empty-list", "bad-name", "both"],
)
def test_keys_api__a_bad_change_is_422_and_changes_nothing(
    client: TestClient, engine: Engine, body: dict[str, object], says: str
):
    admin = bearer(engine, "ops", admin=True)
    prefix = client.post("/v1/keys", json={"tenant": "acme"}, headers=admin).json()["prefix"]
    answer = client.patch(f"/v1/keys/{prefix}", json=body, headers=admin)
    assert answer.status_code == 422 and says in answer.text, answer.text
    [key] = [k for k in list_keys(engine) if k.prefix == prefix]
    assert (key.tools, key.max_priority) == (None, 0)


@pytest.mark.slow  # a CLI command in a process of its own per step
def test_cli_keys__create_with_tools_then_set_tools_and_lift(database_url: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
    env["RUNYARD_DATABASE_URL"] = database_url

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "runyard.cli", "keys", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    created = cli("create", "--tenant", "acme", "--tools", "echo,report")
    assert created.returncode == 0, created.stderr
    prefix = prefix_of(created.stdout.strip())
    assert prefix is not None
    assert "(echo,report)" in cli("ls").stdout
    narrowed = cli("set-tools", prefix, "echo")
    assert narrowed.returncode == 0 and "may run echo" in narrowed.stderr, narrowed.stderr
    lifted = cli("set-tools", prefix, "--all")
    assert lifted.returncode == 0 and "may run every tool" in lifted.stderr
    assert cli("set-tools", prefix).returncode == 2  # neither a list nor --all
