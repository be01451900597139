"""The Docker builder against the real engine: a tagged image, a failing step, the deadline,
and a build with no network.

A test that reads a step's output builds it from a context no earlier build has seen
(``uncached``): on an engine that ran the same step before, the step would come from the build
cache and print nothing.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import docker
import pytest

from runyard.builder import BuildRequest
from runyard.builders.docker import LABEL_BUILD_TOOL, DockerBuilder
from runyard.builds.context import context_tar
from runyard.builds.digest import ContextFile


def request(dockerfile: str, *, timeout: float = 120, files: dict[str, str] | None = None):
    """A build request of ``dockerfile`` and ``files``, tagged uniquely."""
    tag = f"runyard-build/test-{uuid.uuid4().hex[:8]}:0123456789ab"
    items = [ContextFile("Dockerfile", False, dockerfile.encode())]
    items += [ContextFile(p, False, d.encode()) for p, d in (files or {}).items()]
    return BuildRequest(
        tag=tag,
        tool="test",
        digest="0123456789ab" + "0" * 52,
        context=context_tar(items),
        dockerfile="Dockerfile",
        args={"GREETING": "hello"},
        timeout_seconds=timeout,
    )


def uncached(dockerfile: str, files: dict[str, str] | None = None) -> dict[str, Any]:
    """``dockerfile`` with a file unique to this call copied in right after its ``FROM``: every
    later step misses the engine's build cache, so it runs and prints."""
    first, rest = dockerfile.split("\n", 1)
    nonce = {"nonce.txt": uuid.uuid4().hex}
    return {
        "dockerfile": f"{first}\nCOPY nonce.txt /nonce.txt\n{rest}",
        "files": {**(files or {}), **nonce},
    }


@pytest.fixture
def builder() -> Iterator[tuple[DockerBuilder, list[str]]]:
    client = docker.APIClient(timeout=60)
    made: list[str] = []
    yield DockerBuilder(client, memory_mb=256), made
    for tag in made:
        try:
            client.remove_image(tag, force=True)
        except docker.errors.NotFound:
            pass
    client.close()


def collect() -> tuple[list[str], Callable[[str], bool]]:
    lines: list[str] = []

    def write(text: str) -> bool:
        lines.append(text)
        return True

    return lines, write


LABELLED_BUILD = (
    "FROM runyard/toolbox:latest\nARG GREETING\nCOPY note.txt /note.txt\n"
    'RUN ["sh", "-c", "echo $GREETING from the build; cat /note.txt"]\n'
)


def build_and_check_labels_and_log(build: DockerBuilder, made: list[str]) -> None:
    """Build ``LABELLED_BUILD``; its tag carries the labels and its log the step's output."""
    req = request(**uncached(LABELLED_BUILD, {"note.txt": "a note\n"}))
    made.append(req.tag)
    lines, write = collect()
    result = build.build(req, write, threading.Event())
    assert result.ok and result.image_id == build.image_id(req.tag)
    log = "".join(lines)
    assert "hello from the build" in log and "a note" in log
    labels = docker.APIClient().inspect_image(req.tag)["Config"]["Labels"]
    assert labels[LABEL_BUILD_TOOL] == "test"


def test_build__tags_the_image_with_its_labels_and_streams_the_log(builder):
    build, made = builder
    build_and_check_labels_and_log(build, made)


@pytest.mark.slow  # two image builds
def test_build__the_same_build_twice_streams_its_log_twice(builder):
    # The second build of the same Dockerfile runs on an engine whose cache holds the first:
    # the test above must pass however warm the engine is.
    build, made = builder
    build_and_check_labels_and_log(build, made)
    build_and_check_labels_and_log(build, made)


def test_build__a_failing_step_is_an_error_with_its_output(builder):
    build, made = builder
    req = request('FROM runyard/toolbox:latest\nRUN ["sh", "-c", "echo about to break; exit 7"]\n')
    made.append(req.tag)
    lines, write = collect()
    result = build.build(req, write, threading.Event())
    assert not result.ok and not result.timed_out
    assert "returned a non-zero code: 7" in str(result.error)
    assert "about to break" in "".join(lines)
    assert build.image_id(req.tag) is None


@pytest.mark.slow  # sits out a build's deadline
def test_build__stopped_at_its_deadline(builder):
    build, made = builder
    req = request('FROM runyard/toolbox:latest\nRUN ["sleep", "60"]\n', timeout=2)
    made.append(req.tag)
    _lines, write = collect()
    started = time.monotonic()
    result = build.build(req, write, threading.Event())
    assert result.timed_out and not result.ok
    assert time.monotonic() - started < 30
    assert build.image_id(req.tag) is None


def test_build__has_no_network_but_loopback(builder):
    build, made = builder
    req = request(
        **uncached(
            'FROM runyard/toolbox:latest\nRUN ["sh", "-c", "echo nets: $(ls /sys/class/net)"]\n'
        )
    )
    made.append(req.tag)
    lines, write = collect()
    result = build.build(req, write, threading.Event())
    assert result.ok
    assert "nets: lo\n" in "".join(lines)
