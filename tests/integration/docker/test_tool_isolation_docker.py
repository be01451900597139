"""A tool's network, runtime and secrets against the real engine."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from runyard.domain.attempt import container_name
from runyard.domain.states import ContainerState, RunStatus
from runyard.platform.settings import Settings
from runyard.registry.secrets import SecretSource
from runyard.registry.tools import ToolRegistry, parse_registry
from runyard.runner import AttemptAbandoned, AttemptControl
from runyard.runners.docker.runner import DockerRunner
from tests.integration.docker.test_docker_runner import shell, spec_for

pytestmark = pytest.mark.docker

TOOLBOX = "runyard/toolbox:latest"
PAGE = "hello-from-the-listener"
# Busybox's own wget -T crashes; timeout(1) bounds a connect that is silently dropped.
FETCH = "timeout 5 wget -q -O - http://{ip}:8080/ && echo fetched || echo unreachable"


class Sink:
    """Live log chunks, as the worker's event log would get them."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def resume_point(self, stream: str) -> str | None:
        return None

    def write(self, stream: str, text: str, until: str) -> bool:
        self.texts.append(text)
        return True


def _listener(client: docker.DockerClient, network: str, name: str = "") -> Iterator[str]:
    """A busybox httpd container on ``network`` (called ``name`` if given); yields its
    address there."""
    page = f"mkdir -p /tmp/www && echo {PAGE} > /tmp/www/index.html"
    script = f"{page} && exec httpd -f -p 8080 -h /tmp/www"
    container = client.containers.run(
        TOOLBOX,
        ["sh", "-c", script],
        name=name or f"runyard-test-listener-{uuid.uuid4().hex[:12]}",
        network=network,
        detach=True,
        user="65534:65534",
        cap_drop=["ALL"],
        read_only=True,
        tmpfs={"/tmp": "size=1m"},
    )
    try:
        for _ in range(100):
            if (
                container.exec_run(["wget", "-q", "-O", "-", "http://127.0.0.1:8080/"]).exit_code
                == 0
            ):
                break
            time.sleep(0.1)
        container.reload()
        yield str(container.attrs["NetworkSettings"]["Networks"][network]["IPAddress"])
    finally:
        container.remove(force=True)


@pytest.fixture
def bridge_listener(docker_client: docker.DockerClient) -> Iterator[str]:
    """A listener on the engine's default bridge."""
    yield from _listener(docker_client, "bridge")


@pytest.fixture
def internal_network(docker_client: docker.DockerClient) -> Iterator[str]:
    """An internal network of this test (no way out), removed after."""
    network = docker_client.networks.create(
        f"runyard-test-net-{uuid.uuid4().hex[:12]}", driver="bridge", internal=True
    )
    try:
        yield str(network.name)
    finally:
        network.remove()


def _fetch(runner: DockerRunner, registry: ToolRegistry, ip: str, **tool: Any) -> str:
    spec = shell(registry, FETCH.format(ip=ip), **tool)
    try:
        result = runner.run(spec, AttemptControl())
    finally:
        runner.discard(spec.run_id, spec.attempt)
    assert result.status == RunStatus.SUCCEEDED, result
    return result.stdout


def test_network__a_bridge_tool_reaches_a_listener_a_none_tool_cannot(
    docker_runner: DockerRunner, registry: ToolRegistry, bridge_listener: str
):
    assert _fetch(docker_runner, registry, bridge_listener, network="bridge") == (
        f"{PAGE}\nfetched\n"
    )
    assert _fetch(docker_runner, registry, bridge_listener).strip().endswith("unreachable")
    assert _fetch(docker_runner, registry, bridge_listener, network="none").endswith(
        "unreachable\n"
    )


@pytest.mark.slow  # sits out the fetch's 5 s timeout on a dropped connection
def test_network__a_named_network_is_joined_and_the_bridge_is_not(
    docker_runner: DockerRunner,
    docker_client: docker.DockerClient,
    registry: ToolRegistry,
    internal_network: str,
):
    for ip in _listener(docker_client, internal_network):
        assert _fetch(docker_runner, registry, ip, network=internal_network) == (
            f"{PAGE}\nfetched\n"
        )
        assert _fetch(docker_runner, registry, ip, network="bridge").endswith("unreachable\n")


def test_network__a_missing_network_fails_the_attempt_not_the_engine(
    docker_runner: DockerRunner, registry: ToolRegistry
):
    spec = shell(registry, "echo never", network="runyard-test-no-such-net")
    result = docker_runner.run(spec, AttemptControl())
    assert (result.status, result.error_code) == (RunStatus.FAILED, "engine_unsupported")
    assert result.error == "the Docker engine has no network 'runyard-test-no-such-net'"
    docker_runner.discard(spec.run_id, spec.attempt)
    assert docker_runner.state(spec.run_id, spec.attempt) is ContainerState.MISSING


def test_runtime__a_listed_runtime_is_used_an_unknown_one_fails_the_attempt(
    docker_runner: DockerRunner, docker_client: docker.DockerClient, registry: ToolRegistry
):
    spec = shell(registry, "echo ok", runtime="runc")
    result = docker_runner.run(spec, AttemptControl())
    assert result.status == RunStatus.SUCCEEDED and result.stdout == "ok\n"
    host = docker_client.api.inspect_container(container_name(spec.run_id, 1))["HostConfig"]
    assert host["Runtime"] == "runc"

    spec = shell(registry, "echo never", runtime="runyard-test-no-such-runtime")
    result = docker_runner.run(spec, AttemptControl())
    assert (result.status, result.error_code) == (RunStatus.FAILED, "engine_unsupported")
    assert result.error == "the Docker engine has no runtime 'runyard-test-no-such-runtime'"
    assert docker_runner.state(spec.run_id, spec.attempt) is ContainerState.MISSING


def test_engine_problems__names_missing_runtimes_and_networks(
    docker_runner: DockerRunner, internal_network: str
):
    document = {
        "tools": {
            "ok": {"image": TOOLBOX, "command": ["true"], "network": internal_network},
            "plain": {"image": TOOLBOX, "command": ["true"], "runtime": "runc"},
            "bad-rt": {"image": TOOLBOX, "command": ["true"], "runtime": "nosuch"},
            "bad-net": {"image": TOOLBOX, "command": ["true"], "network": "runyard-test-nonet"},
        }
    }
    registry = parse_registry(document, Settings(database_url="unused"))
    problems = docker_runner.engine_problems(list(registry.tools.values()))
    assert len(problems) == 2
    assert problems[0] == "tools.bad-net: the engine has no network 'runyard-test-nonet'"
    assert problems[1].startswith("tools.bad-rt: runtime 'nosuch' is not one of the engine's (")
    assert "runc" in problems[1]


SECRET = "s3cr3t-" + uuid.uuid4().hex
FILE_SECRET = "f1le-" + uuid.uuid4().hex
# Prints the secrets plainly, split over two writes, inside a long line (cut into 16 KiB log
# entries by the engine), to stderr, and into result.json; it runs past the live-log start.
LEAKY = (
    'echo "token=$TOKEN"; printf "%s" "$TOKEN" | head -c 9; printf "%s\\n" "${TOKEN#?????????}"; '
    'head -c 16380 /dev/zero | tr \'\\0\' x; echo "$TOKEN"; echo "cert=$CERT" >&2; '
    'sleep 1.5; echo "late $TOKEN"; '
    'printf "{\\"t\\": \\"%s\\"}" "$TOKEN" > /runyard/out/result.json'
)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "cert"
    path.write_text(FILE_SECRET + "\n")
    return path


def _secret_spec(registry: ToolRegistry, secret_file: Path) -> Any:
    secrets = {"TOKEN": "env:RY_TEST_TOKEN", "CERT": f"file:{secret_file}"}
    return spec_for(registry, "echo", {}, command=["sh", "-c", LEAKY], secrets=secrets)


@pytest.mark.slow  # a container that writes for seconds
def test_secrets__reach_the_tool_and_are_masked_in_logs_chunks_and_result(
    docker_client: docker.DockerClient, registry: ToolRegistry, secret_file: Path
):
    runner = DockerRunner(docker_client, secrets=SecretSource(environ={"RY_TEST_TOKEN": SECRET}))
    spec = _secret_spec(registry, secret_file)
    sink = Sink()
    result = runner.run(spec, AttemptControl(logs=sink))
    assert result.status == RunStatus.SUCCEEDED, result
    lines = result.stdout.splitlines()
    assert lines[0] == "token=***"
    assert lines[1] == "***"  # printed in two writes, one line
    assert lines[2] == "x" * 16380 + "***"
    assert lines[3] == "late ***"
    assert result.stderr == "cert=***\n"
    assert result.result == {"t": "***"}
    chunks = "".join(sink.texts)
    assert "late ***" in chunks and "token=***" in chunks
    for text in [result.stdout, result.stderr, str(result.result), *sink.texts]:
        assert SECRET not in text and FILE_SECRET not in text
        assert SECRET[:9] not in text  # no piece of a split secret either
    runner.discard(spec.run_id, spec.attempt)


def test_secrets__a_missing_variable_fails_the_attempt_clearly(
    docker_client: docker.DockerClient, registry: ToolRegistry, secret_file: Path
):
    runner = DockerRunner(docker_client, secrets=SecretSource(environ={}))
    spec = _secret_spec(registry, secret_file)
    result = runner.run(spec, AttemptControl())
    assert (result.status, result.error_code) == (RunStatus.FAILED, "secret_unavailable")
    assert result.error == "secret TOKEN: environment variable RY_TEST_TOKEN is not set"
    assert runner.state(spec.run_id, spec.attempt) is ContainerState.MISSING


def test_secrets__an_unreadable_file_fails_the_attempt_clearly(
    docker_client: docker.DockerClient, registry: ToolRegistry, tmp_path: Path
):
    runner = DockerRunner(docker_client, secrets=SecretSource(environ={"RY_TEST_TOKEN": "x"}))
    spec = _secret_spec(registry, tmp_path / "missing")
    result = runner.run(spec, AttemptControl())
    assert (result.status, result.error_code) == (RunStatus.FAILED, "secret_unavailable")
    assert result.error == f"secret CERT: cannot read {tmp_path}/missing: No such file or directory"


@pytest.mark.slow  # a container run and adopted: seconds
def test_secrets__an_adopter_without_them_masks_what_the_container_has(
    docker_client: docker.DockerClient, registry: ToolRegistry, secret_file: Path
):
    first = DockerRunner(docker_client, secrets=SecretSource(environ={"RY_TEST_TOKEN": SECRET}))
    spec = _secret_spec(registry, secret_file)
    control = AttemptControl()
    asked: list[bool] = []

    def owner() -> bool:
        asked.append(True)
        if len(asked) == 2:  # asked before the start: hand over right after it
            control.abandon.set()
        return True

    control.still_owner = owner
    with pytest.raises(AttemptAbandoned):
        first.run(spec, control)
    adopter = DockerRunner(docker_client, secrets=SecretSource(environ={}))
    result = adopter.run(spec, AttemptControl())
    assert result.status == RunStatus.SUCCEEDED, result
    assert result.stdout.splitlines()[0] == "token=***"
    assert SECRET not in result.stdout + result.stderr
    adopter.discard(spec.run_id, spec.attempt)
