"""Builds never pull: a Dockerfile FROM an image the engine lacks fails at once, naming the
image and how to get it onto the engine, and the engine's build API is never called."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import docker
import pytest
from sqlalchemy import Engine, text

from runyard.builder import BuildRequest
from runyard.builders.docker import DockerBuilder
from runyard.builds.context import context_tar, read_context
from runyard.builds.setup import with_builds
from runyard.platform.settings import Settings
from runyard.queue import JobQueue
from runyard.queue.builds import BuildQueue
from runyard.registry.tools import load_registry
from runyard.runners.docker.runner import DockerRunner
from runyard.submission.request import prepare_run
from worker.builds import BuildAgent, BuildConfig
from worker.service import Worker, WorkerConfig

pytestmark = pytest.mark.docker


def absent_image() -> str:
    return f"runyard-test/absent-base-{uuid.uuid4().hex[:8]}:1"


def request_for(tmp_path: Path, dockerfile: str, **args: str) -> BuildRequest:
    (tmp_path / "Dockerfile").write_text(dockerfile)
    files = read_context(tmp_path, "Dockerfile", 1 << 20)
    return BuildRequest(
        tag=f"runyard-build/nopull-{uuid.uuid4().hex[:8]}:0",
        tool="nopull",
        digest="0" * 64,
        context=context_tar(files),
        dockerfile="Dockerfile",
        args=args,
        timeout_seconds=30,
    )


def counting_api(monkeypatch: pytest.MonkeyPatch, posts: list[str]) -> Any:
    """The engine's API client, noting the URL of every POST it sends."""
    api = docker.APIClient(timeout=60)
    original = api._post

    def post(url: str, *args: Any, **kwargs: Any) -> Any:
        posts.append(url)
        return original(url, *args, **kwargs)

    monkeypatch.setattr(api, "_post", post)
    return api


@pytest.mark.parametrize(
    "dockerfile",
    [
        "FROM {image}\nRUN true\n",
        "ARG BASE={image}\nFROM ${{BASE}} AS one\n",
        "FROM runyard/toolbox:latest\nCOPY --from={image} /x /x\n",
    ],
)
def test_missing_base__fails_before_the_engine_is_asked_to_build(
    tmp_path: Path, dockerfile: str, monkeypatch: pytest.MonkeyPatch
):
    image = absent_image()
    posts: list[str] = []
    builder = DockerBuilder(counting_api(monkeypatch, posts), memory_mb=256)
    lines: list[str] = []

    def log(text: str) -> bool:
        lines.append(text)
        return True

    result = builder.build(
        request_for(tmp_path, dockerfile.format(image=image)), log, threading.Event()
    )
    assert not result.ok and result.error is not None
    assert result.error.startswith(f"the base image {image} is not on this engine")
    assert "builds never pull" in result.error and "scripts/build-images" in result.error
    assert lines == [f"ERROR: {result.error}\n"]
    assert posts == []


def test_present_base__builds(
    tmp_path: Path, docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
):
    posts: list[str] = []
    builder = DockerBuilder(counting_api(monkeypatch, posts), memory_mb=256)
    request = request_for(
        tmp_path, "ARG BASE\nFROM ${BASE}\nRUN true\n", BASE="runyard/toolbox:latest"
    )
    try:
        result = builder.build(request, lambda text: True, threading.Event())
        assert result.ok, result.error
        assert [url.rsplit("/", 1)[-1] for url in posts] == ["build"]
    finally:
        docker_client.images.remove(request.tag, force=True)


def test_missing_base__fails_the_waiting_run_with_the_reason(
    tmp_path: Path, engine: Engine, queue: JobQueue, docker_runner: DockerRunner
):
    image = absent_image()
    (tmp_path / "slim").mkdir()
    (tmp_path / "slim" / "Dockerfile").write_text(f"FROM {image}\nCOPY Dockerfile /x\n")
    (tmp_path / "tools.toml").write_text(
        '[tools.slim]\nbuild = { context = "slim" }\ncommand = ["true"]\n'
    )
    settings = Settings(database_url="unused")
    tools = with_builds(
        load_registry(tmp_path / "tools.toml", settings), BuildQueue(engine), settings
    )
    run_id = queue.enqueue(
        prepare_run(tools, tenant="acme", tool_name="slim", input_value={})
    ).run_id
    agent = BuildAgent(
        BuildQueue(engine),
        DockerBuilder(docker.APIClient(timeout=60), memory_mb=256),
        BuildConfig(worker_id="w-nopull", heartbeat_seconds=1),
    )
    worker = Worker(queue, docker_runner, WorkerConfig(worker_id="w-nopull"), builds=agent)
    try:
        for _ in range(300):
            worker.run_once()
            with engine.connect() as conn:
                row = conn.execute(
                    text("SELECT status, error_code, error FROM tool_runs WHERE id = :id"),
                    {"id": run_id},
                ).one()
            if row.status == "failed":
                break
            threading.Event().wait(0.1)
        assert row.status == "failed" and row.error_code == "build_failed"
        assert f"the base image {image} is not on this engine" in row.error
    finally:
        worker.wait_idle(30)
        worker.close()
