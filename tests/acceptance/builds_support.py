"""A registry with a tool built from a slow Dockerfile, for the build fault tests."""

from __future__ import annotations

import uuid
from pathlib import Path

import docker

from runyard.builds.setup import with_builds
from runyard.platform.settings import Settings
from runyard.queue.builds import BuildQueue
from runyard.registry.tools import load_registry
from tests.acceptance.cluster import Cluster


def use_built_tool(cluster: Cluster, tmp_path: Path, *, build_seconds: int) -> str:
    """Point the cluster (its processes and its submits) at a registry of one built tool,
    whose build takes ``build_seconds``; the tool's name (unique to the test)."""
    name = f"slowbuild-{uuid.uuid4().hex[:8]}"
    context = tmp_path / "slowbuild"
    context.mkdir()
    (context / "Dockerfile").write_text(
        "FROM runyard/toolbox:latest\n"
        f'RUN ["sh", "-c", "echo build started {name}; sleep {build_seconds}; echo build done"]\n'
        "COPY built.txt /built.txt\n"
    )
    (context / "built.txt").write_text("built\n")
    tools = tmp_path / "tools.toml"
    tools.write_text(
        f"""
[tools.{name}]
build = {{ context = "slowbuild" }}
build_timeout_seconds = 120
command = ["sh", "-c", "cat /built.txt; cp /runyard/input.json /runyard/out/result.json"]
"""
    )
    settings = Settings(database_url="unused")
    cluster.registry = with_builds(
        load_registry(tools, settings), BuildQueue(cluster.engine), settings
    )
    cluster.env["RUNYARD_TOOLS_FILE"] = str(tools)
    return name


def remove_images(client: docker.DockerClient, tool: str) -> None:
    """Remove the images built for ``tool`` on an engine."""
    for image in client.images.list(name=f"runyard-build/{tool}"):
        for tag in image.tags:
            client.images.remove(tag, force=True)
