"""Schedules through the Python SDK (both flavours) and the CLI against a live API; a run's
concurrency_key from the CLI."""

from __future__ import annotations

import asyncio
import json

import pytest

from runyard_client import AsyncRunyard, Runyard, RunyardError
from tests.integration.api.cli_support import Api


def test_sdk_schedules__create_list_pause_resume_delete(api: Api):
    with Runyard(api.url, api_key=api.key) as client:
        made = client.create_schedule("echo", {"n": 1}, cron="*/5 * * * *", catch_up="one")
        assert (made.cron, made.catch_up, made.paused) == ("*/5 * * * *", "one", False)
        assert [s.id for s in client.list_schedules()] == [made.id]
        assert client.pause_schedule(made.id).paused
        assert not client.resume_schedule(made.id).paused
        client.delete_schedule(made.id)
        try:
            client.get_schedule(made.id)
        except RunyardError as exc:
            assert exc.status == 404
        else:
            raise AssertionError("a deleted schedule was found")


def test_async_sdk_schedules__the_same_calls(api: Api):
    async def scenario() -> None:
        async with AsyncRunyard(api.url, api_key=api.key) as client:
            made = await client.create_schedule("echo", every_seconds=60)
            assert (await client.get_schedule(made.id)).every_seconds == 60
            assert [s.id async for s in client.list_schedules()] == [made.id]
            assert (await client.pause_schedule(made.id)).paused
            await client.delete_schedule(made.id)

    asyncio.run(scenario())


@pytest.mark.slow  # a CLI command in a process of its own per step
def test_cli_schedule__create_ls_pause_rm(api: Api):
    made = api.run("schedule", "create", "echo", "--every", "60", "--json")
    assert made.returncode == 0, made.stderr
    schedule_id = json.loads(made.stdout)["id"]
    listed = api.run("schedule", "ls")
    assert schedule_id in listed.stdout and "every 60s  active" in listed.stdout
    paused = api.run("schedule", "pause", schedule_id)
    assert "paused" in paused.stdout
    assert api.run("schedule", "rm", schedule_id).returncode == 0
    bad = api.run("schedule", "create", "echo", "--cron", "61 * * * *")
    assert bad.returncode != 0 and "cron" in bad.stderr


@pytest.mark.slow  # a CLI command in a process of its own per step
def test_cli_submit__concurrency_key_is_sent(api: Api):
    made = api.run("submit", "echo", "--concurrency-key", "cust-3", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["concurrency_key"] == "cust-3"
