"""Hostile tools on one worker: each class ends as documented, every read about it answers,
the worker stays small and serves ordinary runs right after, and nothing is left behind."""

from __future__ import annotations

import base64
import shutil
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.acceptance.cluster import TERMINAL, Cluster, Expected, events_of
from tests.integration.api.test_api_helpers import bearer, make_app

# Solo: its tools' time limits assume the CPU is not shared with other clusters, and it
# checks the engine's free disk space.
pytestmark = [pytest.mark.docker, pytest.mark.solo]

FILL_MANY = "i=0; while true; do head -c 1048576 /dev/zero > /runyard/out/f$i; i=$((i+1)); done"


def _b64(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(data).decode()}


@dataclass(frozen=True)
class Hostile:
    """One class of hostile tool and what it must end as."""

    name: str
    tool: str
    value: dict[str, str]
    status: str
    error_code: str | None
    # A fork bomb may end by its deadline or when its shell can no longer fork.
    also: tuple[str, ...] = ()
    # Error codes also accepted: the engine can miss an OOM kill (runner-contract.md).
    also_codes: tuple[str, ...] = ()


CLASSES = [
    Hostile("nan", "result-bytes", _b64(b'{"x": NaN}'), "failed", "invalid_result"),
    Hostile("infinity", "result-bytes", _b64(b"[Infinity]"), "failed", "invalid_result"),
    Hostile("1e400", "result-bytes", _b64(b"[1e400]"), "failed", "invalid_result"),
    Hostile("nul", "result-bytes", _b64(b'{"x": "a\\u0000b"}'), "failed", "invalid_result"),
    Hostile("surrogate", "result-bytes", _b64(b'["\\ud800"]'), "failed", "invalid_result"),
    Hostile("depth-300", "result-bytes", _b64(b"[" * 300 + b"]" * 300), "failed", "invalid_result"),
    Hostile(
        "depth-5000", "result-bytes", _b64(b"[" * 5000 + b"]" * 5000), "failed", "invalid_result"
    ),
    Hostile(
        "5mb-result",
        "hostile",
        {"script": "yes 1 | head -c 5000000 > /runyard/out/result.json"},
        "failed",
        "invalid_result",
    ),
    Hostile(
        "symlink",
        "hostile",
        {"script": "ln -s /etc/passwd /runyard/out/result.json"},
        "failed",
        "invalid_result",
    ),
    Hostile(
        "fifo", "hostile", {"script": "mkfifo /runyard/out/result.json"}, "failed", "invalid_result"
    ),
    Hostile(
        "directory",
        "hostile",
        {"script": "mkdir /runyard/out/result.json"},
        "failed",
        "invalid_result",
    ),
    Hostile(
        "150mb-no-newline",
        "hostile",
        {"script": "yes abcdefghij | head -c 165000000 | tr -d '[:space:]'"},
        "succeeded",
        None,
    ),
    Hostile(
        "binary-stdout",
        "hostile",
        {"script": "head -c 3000000 /dev/urandom"},
        "succeeded",
        None,
    ),
    Hostile(
        "fork-bomb",
        "hostile",
        {"script": "f(){ f | f & }; f; sleep 60"},
        "timed_out",
        None,
        also=("failed",),
    ),
    Hostile(
        "memory-hog",
        "hostile",
        {"script": "yes xxxxxxxxxxxxxxxxxxxxxxxxxxxx | head -c 200000000 > /tmp/fill"},
        "failed",
        "oom_killed",
        also_codes=("tool_failed",),
    ),
    Hostile(
        "ignores-sigterm",
        "hostile",
        {"script": "trap '' TERM; while true; do echo tick; sleep 1; done"},
        "timed_out",
        "timed_out",
    ),
    Hostile("disk-fill", "hostile", {"script": FILL_MANY}, "failed", "disk_limit_exceeded"),
    Hostile("silence", "hostile", {"script": "echo hello; sleep 120"}, "timed_out", "idle_timeout"),
]


class RssSampler:
    """The peak resident set size of one process, sampled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                status = Path(f"/proc/{self._pid}/status").read_text()
            except OSError:
                return
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    self.peak_kb = max(self.peak_kb, int(line.split()[1]))


@pytest.fixture
def api(cluster: Cluster) -> Iterator[TestClient]:
    app = make_app(cluster.database_url, cluster.engine, cluster.registry)
    with TestClient(app) as client:
        yield client


def _free_bytes() -> int:
    return shutil.disk_usage("/var/lib/docker" if Path("/var/lib/docker").is_dir() else "/").free


def _reads_answer(api: TestClient, headers: dict[str, str], run_id: uuid.UUID) -> None:
    for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/logs", "/v1/runs?limit=100"):
        answer = api.get(path, headers=headers)
        assert answer.status_code == 200, (path, answer.text[:300])
    with api.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as stream:
        assert stream.status_code == 200
        body = "".join(stream.iter_text())
    assert "event: status" in body


def _seconds_to_final(cluster: Cluster, run_id: uuid.UUID) -> float:
    with cluster.engine.connect() as conn:
        took = conn.execute(
            text(
                "SELECT extract(epoch FROM finished_at - started_at) FROM tool_runs WHERE id = :id"
            ),
            {"id": run_id},
        ).scalar_one()
    return float(took)


@pytest.mark.parametrize("inputs", ["upload", "host"])
def test_hostile_tools__each_ends_as_documented_and_the_worker_stays_healthy(
    cluster: Cluster, api: TestClient, tmp_path: Path, inputs: str
):
    free_before = _free_bytes()
    workdirs = tmp_path / "attempts"
    extra = {"RUNYARD_HOST_WORKDIR_ROOT": str(workdirs) if inputs == "host" else "upload"}
    cluster.start_worker("w-hostile", concurrency=4, RUNYARD_STOP_GRACE_SECONDS="2", **extra)
    headers = bearer(cluster.engine, "acceptance")
    pid = cluster.procs["w-hostile"].pid
    submitted: dict[uuid.UUID, Hostile] = {}
    with RssSampler(pid) as rss:
        for hostile in CLASSES:
            run_id = cluster.submit(hostile.tool, hostile.value, Expected(status=hostile.status))
            submitted[run_id] = hostile
        cluster.wait_for(
            lambda: all(cluster.status(r) in TERMINAL for r in submitted),
            300,
            "every hostile run to end",
        )
        ordinary = [
            cluster.submit("echo", {"n": n}, Expected("succeeded", result={"n": n}))
            for n in range(4)
        ]
        cluster.wait_for(
            lambda: all(cluster.status(r) in TERMINAL for r in ordinary), 60, "ordinary runs"
        )
    report = []
    for run_id, hostile in submitted.items():
        row = cluster.run_row(run_id)
        took = _seconds_to_final(cluster, run_id)
        report.append(f"{hostile.name}: {row.status}/{row.error_code} in {took:.1f} s")
    report.append(f"worker peak RSS {rss.peak_kb / 1024:.1f} MB ({inputs} inputs)")
    print("\n".join(report))  # noqa: T201 (each class, its outcome and time to final)
    for run_id, hostile in submitted.items():
        row = cluster.run_row(run_id)
        took = _seconds_to_final(cluster, run_id)
        context = (hostile.name, dict(row._mapping))
        assert row.status in (hostile.status, *hostile.also), context
        cluster.accepted[run_id].status = row.status
        if hostile.error_code is not None:
            assert row.error_code in (hostile.error_code, *hostile.also_codes), context
        if row.error_code in hostile.also_codes:
            assert row.exit_code == 137, context  # killed, the OOM kill unrecorded
        timeout = cluster.registry.tools[hostile.tool].timeout_seconds
        assert took <= timeout + 30, context
        _reads_answer(api, headers, run_id)
    for run_id in ordinary:
        row = cluster.run_row(run_id)
        assert (row.status, row.attempts) == ("succeeded", 1), dict(row._mapping)
    silence = next(r for r, h in submitted.items() if h.name == "silence")
    assert "stale" in [kind for kind, _ in events_of(cluster.engine, silence)]
    assert rss.peak_kb < 200 * 1024, f"worker RSS peaked at {rss.peak_kb} kB"
    cluster.check_invariants(leak_timeout=90)
    if inputs == "host":
        cluster.wait_for(lambda: not list(workdirs.iterdir()), 30, "work directories removed")
    assert _free_bytes() > free_before - (256 << 20)
