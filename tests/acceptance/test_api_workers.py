"""``python -m api`` with several worker processes: all serve, and SIGTERM stops them all."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx2

from tests.acceptance.cluster import Cluster


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def test_api_workers__serve_batches_and_stop_together(cluster: Cluster):
    cluster.start_api("api", RUNYARD_QUEUE_ENABLED="true", RUNYARD_API_WORKERS="2")
    parent = cluster.procs["api"].pid
    cluster.wait_for(lambda: len(_children(parent)) >= 2, 30, "two worker processes")
    workers = _children(parent)
    url = f"http://127.0.0.1:{cluster.ports['api']}/v1/batches"
    body = {"runs": [{"tool": "echo", "input": {}}] * 3}
    answers = [httpx2.post(url, json=body, timeout=30) for _ in range(6)]  # a connection each
    assert [answer.status_code for answer in answers] == [202] * 6
    assert all(answer.json()["counts"] == {"queued": 3} for answer in answers)
    cluster.signal("api", signal.SIGTERM)
    assert cluster.wait_exit("api", timeout=30) == 0
    cluster.wait_for(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers),
        15,
        "the worker processes to exit",
    )
