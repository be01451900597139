"""Removing an attempt's volume: one the engine keeps "mounted" is given up on, quietly."""

from __future__ import annotations

import logging
import uuid
from typing import Any, cast

import docker
import docker.errors
import pytest

from runyard.domain.attempt import container_name
from runyard.runner import RunnerUnavailable
from runyard.runners.docker.labels import LABEL_ATTEMPT, LABEL_MANAGED, LABEL_RUN_ID
from runyard.runners.docker.runner import DockerRunner


class StubApi:
    def __init__(self, refusal: str, run_id: uuid.UUID) -> None:
        self.refusal = refusal
        self.run_id = run_id
        self.volume_removals = 0

    def remove_container(self, ref: str, force: bool) -> None:
        raise docker.errors.NotFound("no such container")

    def remove_volume(self, name: str, force: bool) -> None:
        self.volume_removals += 1
        raise docker.errors.APIError("500 Server Error", explanation=self.refusal)

    def containers(self, all: bool, filters: dict[str, str]) -> list[dict[str, Any]]:
        return []

    def volumes(self, filters: dict[str, str]) -> dict[str, Any]:
        labels = {LABEL_MANAGED: "true", LABEL_RUN_ID: str(self.run_id), LABEL_ATTEMPT: "1"}
        return {"Volumes": [{"Name": container_name(self.run_id, 1), "Labels": labels}]}


class StubClient:
    def __init__(self, api: StubApi) -> None:
        self.api = api


def runner_with(refusal: str) -> tuple[DockerRunner, StubApi, uuid.UUID]:
    run_id = uuid.uuid4()
    api = StubApi(refusal, run_id)
    return DockerRunner(cast(docker.DockerClient, StubClient(api))), api, run_id


def test_discard__a_volume_stuck_mounted_is_logged_once_and_no_longer_listed(
    caplog: pytest.LogCaptureFixture,
):
    runner, api, run_id = runner_with("remove x: volume has active mounts")
    assert [a.run_id for a in runner.managed_attempts()] == [run_id]
    caplog.set_level(logging.WARNING, logger="runyard.runners.docker.leftovers")
    runner.discard(run_id, 1)
    runner.discard(run_id, 1)
    assert api.volume_removals == 2
    assert [r.getMessage() for r in caplog.records] == [
        "the engine keeps a volume it says is still mounted; left to its next restart"
    ]
    assert runner.managed_attempts() == []


def test_discard__another_refusal_is_the_engines_trouble():
    runner, _, run_id = runner_with("remove x: volume is in use - [c0ffee]")
    with pytest.raises(RunnerUnavailable, match="cannot remove volume"):
        runner.discard(run_id, 1)
