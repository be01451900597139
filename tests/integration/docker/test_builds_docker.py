"""Built tools end to end on the real engine: in-process workers with the Docker runner and
builder, real Postgres. A first run waits for its build; an edited source makes a new digest
while runs of the old one keep their image; a failing Dockerfile and a build past its timeout
fail the runs that wait, with the log's tail."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from sqlalchemy import Engine, text

from runyard.builders.docker import FORGET_SECONDS, DockerBuilder
from runyard.builds.setup import with_builds
from runyard.platform.settings import Settings
from runyard.queue import JobQueue
from runyard.queue.builds import BuildQueue
from runyard.registry.tools import ToolRegistry, load_registry
from runyard.runners.docker.runner import DockerRunner
from runyard.runners.docker.usage_meter import UsageMeter
from runyard.submission.request import prepare_run
from runyard.usage.ledger import UsageLedger
from worker.builds import BuildAgent, BuildConfig
from worker.service import Worker, WorkerConfig

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "tools" / "examples" / "numstats"


@pytest.fixture
def names(docker_client: docker.DockerClient) -> Iterator[dict[str, str]]:
    """Tool names of this test's own (their images are removed after it)."""
    suffix = uuid.uuid4().hex[:8]
    made = {"stats": f"stats-{suffix}", "version": f"version-{suffix}", "bad": f"bad-{suffix}"}
    yield made
    for image in docker_client.images.list(name="runyard-build/*"):
        for tag in image.tags:
            if any(tag.startswith(f"runyard-build/{name}:") for name in made.values()):
                docker_client.images.remove(tag, force=True)


def registry(tmp_path: Path, engine: Engine, names: dict[str, str]) -> ToolRegistry:
    shutil.copytree(EXAMPLE, tmp_path / "numstats")
    (tmp_path / "version").mkdir()
    (tmp_path / "version" / "Dockerfile").write_text(
        "FROM runyard/toolbox:latest\nCOPY version.txt /version.txt\nCOPY v.sh /opt/v.sh\n"
    )
    (tmp_path / "version" / "v.sh").write_text(
        """printf '{"v": "%s"}' "$(cat /version.txt)" > /runyard/out/result.json\n"""
    )
    (tmp_path / "version" / "version.txt").write_text("one")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "Dockerfile").write_text(
        'FROM runyard/toolbox:latest\nRUN ["sh", "-c", "echo the step says why; exit 3"]\n'
    )
    (tmp_path / "tools.toml").write_text(
        f"""
[tools.{names["stats"]}]
build = {{ context = "numstats" }}
command = ["sh", "/opt/numstats/numstats.sh"]

[tools.{names["version"]}]
build = {{ context = "version" }}
command = ["sh", "/opt/v.sh"]

[tools.{names["bad"]}]
build = {{ context = "bad" }}
command = ["true"]

[tools.slow-{names["bad"]}]
build = {{ context = "slow" }}
build_timeout_seconds = 2
command = ["true"]
"""
    )
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "Dockerfile").write_text(
        'FROM runyard/toolbox:latest\nRUN ["sh", "-c", "echo sleeping now; sleep 60"]\n'
    )
    settings = Settings(database_url="unused")
    return with_builds(
        load_registry(tmp_path / "tools.toml", settings), BuildQueue(engine), settings
    )


@pytest.fixture
def make_worker(
    queue: JobQueue, engine: Engine, docker_runner: DockerRunner
) -> Iterator[Callable[[str], Worker]]:
    made: list[Worker] = []

    def make(worker_id: str) -> Worker:
        api = docker.APIClient(timeout=60)
        agent = BuildAgent(
            BuildQueue(engine),
            DockerBuilder(api, memory_mb=256, meter=UsageMeter(api)),
            BuildConfig(worker_id=worker_id, heartbeat_seconds=1),
            UsageLedger(engine),
        )
        w = Worker(queue, docker_runner, WorkerConfig(worker_id=worker_id), builds=agent)
        made.append(w)
        return w

    yield make
    for w in made:
        w.wait_idle(30)
        w.close()


def submit(queue: JobQueue, tools: ToolRegistry, tool: str, value: Any) -> uuid.UUID:
    return queue.enqueue(
        prepare_run(tools, tenant="acme", tool_name=tool, input_value=value)
    ).run_id


def run(engine: Engine, run_id: uuid.UUID) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT status, result, error_code, error, image_digest, spec->>'image' AS image "
                "FROM tool_runs WHERE id = :id"
            ),
            {"id": run_id},
        ).one()
    return dict(row._mapping)


def builds(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT tag, status, attempts, image_id, log FROM tool_builds ORDER BY created_at")
        ).all()
    return [dict(r._mapping) for r in rows]


def until(condition: Callable[[], bool], workers: list[Worker], seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        for w in workers:
            w.run_once()
        time.sleep(0.1)


def terminal(engine: Engine, *run_ids: uuid.UUID) -> Callable[[], bool]:
    return lambda: all(
        run(engine, r)["status"] in ("succeeded", "failed", "timed_out") for r in run_ids
    )


def test_first_run__waits_for_its_build_then_succeeds(tmp_path, engine, queue, names, make_worker):
    tools = registry(tmp_path, engine, names)
    run_id = submit(queue, tools, names["stats"], {"numbers": [3, 1.5, -2, 10]})
    w = make_worker("w1")
    until(terminal(engine, run_id), [w])
    done = run(engine, run_id)
    assert done["status"] == "succeeded", done
    assert done["result"] == {"count": 4, "sum": 12.5, "min": -2, "max": 10, "mean": 3.125}
    [build] = builds(engine)
    assert build["tag"] == done["image"] and build["status"] == "ready"
    assert done["image_digest"] == build["image_id"]
    assert "FROM runyard/toolbox:latest" in build["log"]
    assert f"Successfully tagged {build['tag']}" in build["log"]


@pytest.mark.slow  # two image builds
def test_changed_context__new_digest_and_build_while_old_runs_keep_their_image(
    tmp_path, engine, queue, names, make_worker
):
    tools = registry(tmp_path, engine, names)
    old = submit(queue, tools, names["version"], {})
    (tmp_path / "version" / "version.txt").write_text("two")
    new = submit(queue, tools, names["version"], {})
    assert run(engine, old)["image"] != run(engine, new)["image"]
    w = make_worker("w1")
    until(terminal(engine, old, new), [w])
    assert run(engine, old)["result"] == {"v": "one"}
    assert run(engine, new)["result"] == {"v": "two"}
    assert sorted(b["status"] for b in builds(engine)) == ["ready", "ready"]


def test_failing_dockerfile__fails_waiting_runs_with_the_log_tail_and_later_ones_fast(
    tmp_path, engine, queue, names, make_worker
):
    tools = registry(tmp_path, engine, names)
    waiting = [submit(queue, tools, names["bad"], {}) for _ in range(3)]
    w = make_worker("w1")
    until(terminal(engine, *waiting), [w])
    for run_id in waiting:
        done = run(engine, run_id)
        assert done["status"] == "failed" and done["error_code"] == "build_failed"
        assert "returned a non-zero code: 3" in done["error"]
        assert "the step says why" in done["error"]
    later = submit(queue, tools, names["bad"], {})
    assert BuildQueue(engine).fail_waiting(run(engine, later)["image"]) == 1
    assert run(engine, later)["error"] == run(engine, waiting[0])["error"]
    assert [b["status"] for b in builds(engine)] == ["failed"]
    # The failed build consumed: metered once, charged to the tenant whose runs waited; its
    # RUN step's CPU and peak read from its parent cgroup where this engine places it by path.
    with engine.connect() as conn:
        [usage] = conn.execute(
            text("SELECT tenant, wall_seconds, cpu_seconds, memory_peak_bytes FROM build_usage")
        ).all()
    assert usage.tenant == "acme" and usage.wall_seconds > 0
    if UsageMeter(docker.APIClient()).cgroup_parent("probe") is not None:
        assert usage.cpu_seconds > 0 and usage.memory_peak_bytes > 0
    else:
        assert usage.cpu_seconds is None


@pytest.mark.slow  # sits out a build's timeout
def test_build_timeout__fails_the_waiting_runs(tmp_path, engine, queue, names, make_worker):
    tools = registry(tmp_path, engine, names)
    run_id = submit(queue, tools, f"slow-{names['bad']}", {})
    w = make_worker("w1")
    until(terminal(engine, run_id), [w])
    done = run(engine, run_id)
    assert done["error_code"] == "build_failed"
    assert "build timed out after 2 s" in done["error"] and "sleeping now" in done["error"]
    # Its parent cgroup goes once the cut step is gone (the engine kills it after the cut):
    # the worker removes it after failing the runs, waiting for the dying step, so it is
    # looked for until then, within the worker's own wait.
    with engine.connect() as conn:
        build_id = conn.execute(text("SELECT id FROM tool_builds")).scalar_one()
    deadline = time.monotonic() + FORGET_SECONDS + 5
    while list(Path("/sys/fs/cgroup").glob(f"*/runyard/build-{build_id}")):
        assert time.monotonic() < deadline, "the build's parent cgroup was left behind"
        time.sleep(0.2)
