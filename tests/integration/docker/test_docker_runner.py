"""The Docker adapter against the real engine: contract, hardening, outcomes, adoption."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import docker
import pytest

from runyard.domain.attempt import AttemptSpec, container_name
from runyard.domain.isolation import engine_memory_mb, engine_pids_limit
from runyard.domain.states import ContainerState, RunStatus
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptAbandoned, AttemptControl, RunnerUnavailable
from runyard.runners.docker.host_workdirs import HostWorkdirs
from runyard.runners.docker.runner import DockerLimits, DockerRunner
from runyard.runners.docker.socket_api import SocketApi

pytestmark = pytest.mark.docker


def spec_for(
    registry: ToolRegistry,
    tool: str,
    input_value: Any,
    *,
    timeout: float = 30,
    **overrides: Any,
) -> AttemptSpec:
    found = registry.get(tool)
    assert found is not None
    definition = {**found.snapshot(), **overrides}
    return AttemptSpec(
        run_id=uuid.uuid4(),
        attempt=1,
        tool=definition,
        input=input_value,
        deadline_at=datetime.now(UTC) + timedelta(seconds=timeout),
    )


def shell(registry: ToolRegistry, script: str, **kw: Any) -> AttemptSpec:
    return spec_for(registry, "shell", {"script": script}, **kw)


def test_echo__result_labels_name_and_hardening(
    docker_runner: DockerRunner, docker_client: docker.DockerClient, registry: ToolRegistry
):
    spec = spec_for(registry, "echo", {"a": [1, 2, "x"]})
    result = docker_runner.run(spec, AttemptControl())
    assert result.status == RunStatus.SUCCEEDED, result
    assert result.result == {"a": [1, 2, "x"]}
    assert result.exit_code == 0 and (result.image_digest or "").startswith("sha256:")

    container = docker_client.containers.get(container_name(spec.run_id, 1))
    labels = container.labels
    assert labels["io.runyard.managed"] == "true"
    assert labels["io.runyard.run_id"] == str(spec.run_id)
    assert labels["io.runyard.attempt"] == "1"
    assert labels["io.runyard.tool"] == "echo"
    assert datetime.fromisoformat(labels["io.runyard.deadline"]) == spec.deadline_at
    host = container.attrs["HostConfig"]
    config = container.attrs["Config"]
    assert config["User"] == "65534:65534"
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["ReadonlyRootfs"] is True
    assert host["NetworkMode"] == "none"
    assert host["Privileged"] is False
    assert host["Init"] is True
    # Under gVisor the engine is asked for the sandbox's allowance on top (docs/isolation.md).
    runtime = spec.tool.get("runtime")
    assert host["Memory"] == host["MemorySwap"] == engine_memory_mb(64, runtime) * 1024 * 1024
    assert host["NanoCpus"] == 500_000_000
    assert host["PidsLimit"] == engine_pids_limit(64, runtime)
    assert "noexec" in host["Tmpfs"]["/tmp"] and "nosuid" in host["Tmpfs"]["/tmp"]
    assert host["AutoRemove"] is False
    assert not host.get("Binds")
    assert [m["Destination"] for m in container.attrs["Mounts"]] == ["/runyard"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["RUNYARD_RUN_ID"] == str(spec.run_id) and env["RUNYARD_ATTEMPT"] == "1"
    assert env["RUNYARD_INPUT"] == "/runyard/input.json"
    assert env["RUNYARD_OUTPUT_DIR"] == "/runyard/out"

    docker_runner.discard(spec.run_id, 1)
    assert docker_runner.state(spec.run_id, 1) is ContainerState.MISSING
    assert not docker_client.volumes.list(filters={"name": container_name(spec.run_id, 1)})


def test_tool_sandbox__cannot_write_root_input_or_reach_network(
    docker_runner: DockerRunner, registry: ToolRegistry
):
    script = (
        "id -u; "
        "touch /etc/x 2>/dev/null && echo root-writable; "
        "echo tamper > /runyard/input.json 2>/dev/null && echo input-writable; "
        "ls /sys/class/net; "
        "cp /tmp/script.sh /tmp/x && chmod +x /tmp/x && /tmp/x 2>/dev/null && echo tmp-exec; "
        "echo ok"
    )
    result = docker_runner.run(shell(registry, script), AttemptControl())
    assert result.status == RunStatus.FAILED or result.status == RunStatus.SUCCEEDED
    lines = result.stdout.split()
    assert lines[0] == "65534"
    assert "root-writable" not in lines and "input-writable" not in lines
    assert "tmp-exec" not in lines
    assert "eth0" not in lines and "lo" in lines
    assert lines[-1] == "ok"


def test_failure__exit_code_and_stderr(docker_runner: DockerRunner, registry: ToolRegistry):
    result = docker_runner.run(spec_for(registry, "fail", {}), AttemptControl())
    assert result.status == RunStatus.FAILED
    assert result.exit_code == 3 and result.error_code == "tool_failed"
    assert result.stderr == "about to fail\n" and result.stdout == ""


@pytest.mark.slow  # sits out a deadline
def test_timeout__stops_the_container_at_the_deadline(
    docker_runner: DockerRunner, registry: ToolRegistry
):
    runner = docker_runner
    started = time.monotonic()
    result = runner.run(spec_for(registry, "sleep", {"seconds": 60}, timeout=1.5), AttemptControl())
    assert result.status == RunStatus.TIMED_OUT and result.error_code == "timed_out"
    assert time.monotonic() - started < 15
    assert "sleeping 60" in result.stdout


def test_cancel__stops_the_container(docker_runner: DockerRunner, registry: ToolRegistry):
    control = AttemptControl()
    threading.Timer(1.0, control.cancel.set).start()
    result = docker_runner.run(spec_for(registry, "sleep", {"seconds": 60}), control)
    assert result.status == RunStatus.CANCELLED and result.error_code == "cancelled"


def test_deps__the_tool_reads_its_dependencies_results(
    docker_runner: DockerRunner, registry: ToolRegistry
):
    deps = {str(uuid.uuid4()): {"tool": "echo", "ref": "a", "status": "succeeded", "result": [1]}}
    base = shell(registry, "cp $RUNYARD_DEPS /runyard/out/result.json")
    spec = dataclasses.replace(base, deps=deps)
    result = docker_runner.run(spec, AttemptControl())
    assert result.status == RunStatus.SUCCEEDED, result
    assert result.result == deps


# /tmp is tmpfs, charged to the container's memory: filling it past the limit OOMs.
FILL_TMPFS = "yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx | head -c 100000000 > /tmp/fill"


def engine_logged_oom(client: docker.DockerClient, spec: AttemptSpec) -> bool:
    """Whether the engine recorded the kernel's OOM kill of the attempt's container at all."""
    found = client.api.events(
        since=int(time.time()) - 300,
        until=round(time.time(), 3),
        filters={"container": [container_name(spec.run_id, 1)], "event": ["oom"]},
        decode=True,
    )
    return any(event.get("Action") == "oom" for event in found)


def assert_oom_outcome(result: Any, engine_saw_it: bool) -> None:
    """oom_killed whenever the engine knew; a SIGKILL naming the memory limit when it did not."""
    assert result.status == RunStatus.FAILED
    if engine_saw_it:
        assert result.error_code == "oom_killed", result
    else:  # Docker 20.10 on cgroup v1 now and then misses the kernel's note altogether
        assert result.error_code == "tool_failed" and result.exit_code == 137, result
        assert "memory limit (16 MB)" in (result.error or ""), result


def test_oom__is_reported_as_such(
    docker_runner: DockerRunner, docker_client: docker.DockerClient, registry: ToolRegistry
):
    spec = shell(registry, FILL_TMPFS, memory_mb=16, tmpfs_mb=512)
    result = docker_runner.run(spec, AttemptControl())
    assert_oom_outcome(result, engine_logged_oom(docker_client, spec))


def test_oom__flag_lost_by_the_engine__its_oom_event_still_counts(
    docker_client: docker.DockerClient, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
):
    # The engine clears OOMKilled when the kernel's note arrives after the exit.
    inspect = SocketApi.inspect_container

    def flag_lost(self: Any, container: str) -> Any:
        attrs = inspect(self, container)
        attrs["State"]["OOMKilled"] = False
        return attrs

    # The runner inspects over the engine's socket directly (socket_api.py).
    monkeypatch.setattr(SocketApi, "inspect_container", flag_lost)
    spec = shell(registry, FILL_TMPFS, memory_mb=16, tmpfs_mb=512)
    result = DockerRunner(docker_client).run(spec, AttemptControl())
    assert_oom_outcome(result, engine_logged_oom(docker_client, spec))


@pytest.mark.slow  # a container run to its end: seconds
def test_sigkill_by_the_tool_itself__is_no_oom(docker_runner: DockerRunner, registry: ToolRegistry):
    spec = shell(registry, "kill -9 $$", memory_mb=16)
    result = docker_runner.run(spec, AttemptControl())
    assert result.status == RunStatus.FAILED and result.exit_code == 137, result
    assert result.error_code == "tool_failed", result


@pytest.mark.slow  # floods megabytes of output
def test_output__capped_head_and_tail_kept(registry: ToolRegistry, docker_client):
    runner = DockerRunner(docker_client, DockerLimits(stdout_cap_bytes=4096))
    script = "echo FIRST; yes 0123456789 | head -c 2000000; echo; echo LAST"
    result = runner.run(shell(registry, script), AttemptControl())
    assert result.status == RunStatus.SUCCEEDED
    assert result.stdout_truncated and not result.stderr_truncated
    assert result.stdout.startswith("FIRST\n") and result.stdout.endswith("LAST\n")
    assert len(result.stdout) < 4096 + 100


@pytest.mark.parametrize(
    ("script", "problem"),
    [
        ("echo not json > /runyard/out/result.json", "result.json: Expecting value"),
        ("echo NaN > /runyard/out/result.json", "result.json: NaN is not JSON at line 1"),
        ("ln -s /etc/passwd /runyard/out/result.json", "link"),
        ("mkdir /runyard/out/result.json", "regular file"),
        ("yes 1 | head -c 3000000 > /runyard/out/result.json", "larger than"),
    ],
)
def test_result__invalid_results_are_rejected(
    docker_runner: DockerRunner, registry: ToolRegistry, script: str, problem: str
):
    result = docker_runner.run(shell(registry, script), AttemptControl())
    assert result.status == RunStatus.FAILED
    assert result.error_code == "invalid_result"
    assert problem in (result.error or "")


def test_no_result_file__succeeds_with_null_result(
    docker_runner: DockerRunner, registry: ToolRegistry
):
    result = docker_runner.run(shell(registry, "echo hi"), AttemptControl())
    assert result.status == RunStatus.SUCCEEDED and result.result is None
    assert result.stdout == "hi\n"


@pytest.mark.slow  # waits on a container that sleeps for seconds
def test_adoption__running_container_is_waited_on_not_restarted(
    docker_runner: DockerRunner, docker_client: docker.DockerClient, registry: ToolRegistry
):
    spec = spec_for(registry, "sleep", {"seconds": 2})
    control = AttemptControl()
    threading.Timer(0.7, control.abandon.set).start()
    with pytest.raises(AttemptAbandoned):
        docker_runner.run(spec, control)
    assert docker_runner.state(spec.run_id, 1) is ContainerState.RUNNING
    first_start = docker_client.containers.get(spec.container_name).attrs["State"]["StartedAt"]

    result = docker_runner.run(spec, AttemptControl())  # the adopter, same spec and deadline
    assert result.status == RunStatus.SUCCEEDED and result.result == {"slept": True}
    container = docker_client.containers.get(spec.container_name)
    assert container.attrs["State"]["StartedAt"] == first_start
    assert container.attrs["RestartCount"] == 0
    assert result.stdout.count("sleeping") == 1


@pytest.fixture(params=["upload", "host"])
def either_runner(
    request: pytest.FixtureRequest, docker_client: docker.DockerClient, tmp_path: Path
) -> DockerRunner:
    """The adapter with inputs uploaded (the default) or written in a host work directory."""
    if request.param == "upload":
        return DockerRunner(docker_client)
    return DockerRunner(docker_client, workdirs=HostWorkdirs.open(str(tmp_path / "attempts")))


def test_adoption__exited_container_is_finalized_from_its_outputs(
    either_runner: DockerRunner, docker_client: docker.DockerClient, registry: ToolRegistry
):
    spec = spec_for(registry, "echo", {"x": 1})
    either_runner.run(spec, AttemptControl())
    first_start = docker_client.containers.get(spec.container_name).attrs["State"]["StartedAt"]
    again = either_runner.run(spec, AttemptControl())
    assert again.status == RunStatus.SUCCEEDED and again.result == {"x": 1}
    assert (
        docker_client.containers.get(spec.container_name).attrs["State"]["StartedAt"] == first_start
    )


@pytest.mark.slow  # sits out a created container's grace
def test_created_but_never_started__is_recreated(
    docker_runner: DockerRunner, docker_client: docker.DockerClient, registry: ToolRegistry
):
    spec = spec_for(registry, "echo", {"y": 2})
    docker_client.containers.create(
        "runyard/toolbox:latest",
        ["true"],
        name=spec.container_name,
        labels={"io.runyard.managed": "true"},
    )
    assert docker_runner.state(spec.run_id, 1) is ContainerState.CREATED
    result = docker_runner.run(spec, AttemptControl())
    assert result.status == RunStatus.SUCCEEDED and result.result == {"y": 2}
    assert len(docker_client.containers.list(all=True, filters={"name": spec.container_name})) == 1


def test_missing_image__fails_clearly(docker_runner: DockerRunner, registry: ToolRegistry):
    spec = spec_for(registry, "echo", {}, image="runyard/does-not-exist:0")
    result = docker_runner.run(spec, AttemptControl())
    assert result.status == RunStatus.FAILED and result.error_code == "image_not_found"


def test_engine_id__stable_and_not_docker_info_id(
    docker_runner: DockerRunner, docker_client: docker.DockerClient
):
    first = docker_runner.engine_id()
    assert first == DockerRunner(docker_client).engine_id()
    assert first != docker_client.info()["ID"]


@pytest.mark.slow  # a fork bomb loads the machine for seconds
def test_fork_bomb__ends_cleanly_and_host_stays_healthy(
    registry: ToolRegistry, docker_client: docker.DockerClient
):
    runner = DockerRunner(docker_client, DockerLimits(stop_grace_seconds=1))
    bomb = shell(registry, "f(){ f | f & }; f; sleep 30", timeout=3, pids_limit=32)
    result = runner.run(bomb, AttemptControl())
    assert result.status in (RunStatus.TIMED_OUT, RunStatus.FAILED), result
    container = docker_client.containers.get(bomb.container_name)
    pids = engine_pids_limit(32, bomb.tool.get("runtime"))
    assert container.attrs["HostConfig"]["PidsLimit"] == pids
    after = runner.run(spec_for(registry, "echo", {"still": "fine"}), AttemptControl())
    assert after.status == RunStatus.SUCCEEDED and after.result == {"still": "fine"}


@pytest.mark.slow  # 30 MB of output, read under tracemalloc
def test_stdout_flood__truncated_with_bounded_memory(
    registry: ToolRegistry, docker_client: docker.DockerClient
):
    import tracemalloc

    runner = DockerRunner(docker_client, DockerLimits(stdout_cap_bytes=64 * 1024))
    flood = shell(registry, "yes flood-flood-flood | head -c 30000000; echo; echo END")
    tracemalloc.start()
    try:
        result = runner.run(flood, AttemptControl())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.status == RunStatus.SUCCEEDED
    assert result.stdout_truncated and result.stdout.endswith("END\n")
    assert len(result.stdout) < 64 * 1024 + 100
    assert peak < 8 * 1024 * 1024, peak  # 30 MB went through; memory stayed bounded


def test_second_create_for_same_attempt__never_makes_a_twin(
    docker_runner: DockerRunner, docker_client: docker.DockerClient, registry: ToolRegistry
):
    # Two owners of one attempt never happen under a lease; this forces the race anyway.
    # Either caller may give up (RunnerUnavailable, "decide nothing") when the other one's
    # container appears or vanishes under it; what must never happen is a second container.
    spec = spec_for(registry, "sleep", {"seconds": 1})
    results = []
    gave_up = []
    barrier = threading.Barrier(2)

    def run() -> None:
        barrier.wait()
        try:
            results.append(DockerRunner(docker_client).run(spec, AttemptControl()))
        except RunnerUnavailable as exc:
            gave_up.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) + len(gave_up) == 2
    assert results and all(r.status == RunStatus.SUCCEEDED for r in results)
    found = docker_client.containers.list(all=True, filters={"name": spec.container_name})
    assert len(found) == 1
    assert found[0].attrs["RestartCount"] == 0
    assert all(r.stdout.count("sleeping") == 1 for r in results)


def test_live_container__has_no_docker_socket_and_no_host_mounts(
    docker_runner: DockerRunner, docker_client: docker.DockerClient, registry: ToolRegistry
):
    script = "ls /var/run/docker.sock /run/docker.sock 2>&1; cat /proc/1/status; setpriv -d"
    spec = shell(registry, script)
    result = docker_runner.run(spec, AttemptControl())
    assert "No such file" in result.stdout
    mounts = docker_client.containers.get(spec.container_name).attrs["Mounts"]
    assert all(m["Type"] == "volume" for m in mounts)
    status = dict(line.split(":\t", 1) for line in result.stdout.splitlines() if ":\t" in line)
    assert status["CapEff"].strip("0\n ") == ""  # no effective capabilities
    # Asked of the kernel: gVisor's /proc/<pid>/status has no NoNewPrivs line.
    assert "no_new_privs: 1" in result.stdout.splitlines()


@pytest.mark.slow  # sits out a deadline
def test_adoption_after_deadline__exited_container_keeps_its_own_outcome(
    docker_runner: DockerRunner, registry: ToolRegistry
):
    spec = spec_for(registry, "echo", {"done": "in time"}, timeout=2)
    first = docker_runner.run(spec, AttemptControl())
    assert first.status == RunStatus.SUCCEEDED
    while datetime.now(UTC) < spec.deadline_at:
        time.sleep(0.1)
    adopted = docker_runner.run(spec, AttemptControl())  # an adopter arriving after the deadline
    assert adopted.status == RunStatus.SUCCEEDED and adopted.result == {"done": "in time"}


def test_cancel_after_exit__keeps_the_real_outcome(
    docker_runner: DockerRunner, registry: ToolRegistry
):
    spec = spec_for(registry, "fail", {})
    docker_runner.run(spec, AttemptControl())
    control = AttemptControl()
    control.cancel.set()
    again = docker_runner.run(spec, control)
    assert again.status == RunStatus.FAILED and again.exit_code == 3
