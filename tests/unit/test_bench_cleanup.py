"""A benchmark's cleanup removes its own runs' leftovers only, host work directories included."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from bench.common import remove_containers_of


class NoEngineLeftovers:
    """An engine API that lists no container and no volume."""

    def __init__(self) -> None:
        self.api = self

    def containers(self, **_: Any) -> list[dict[str, Any]]:
        return []

    def volumes(self, **_: Any) -> dict[str, Any]:
        return {"Volumes": []}


def test_remove_containers_of__removes_its_runs_work_directories_and_nothing_else(
    tmp_path: Path,
):
    ours, theirs = uuid.uuid4(), uuid.uuid4()
    for name in (f"runyard-{ours}-1", f"runyard-{ours}-2", f"runyard-{theirs}-1", "notes"):
        (tmp_path / name / "out").mkdir(parents=True)
    remove_containers_of(NoEngineLeftovers(), [ours], workdir_root=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"runyard-{theirs}-1", "notes"])


def test_remove_containers_of__a_missing_root_is_nothing_to_remove(tmp_path: Path):
    gone = tmp_path / "none"
    assert remove_containers_of(NoEngineLeftovers(), [uuid.uuid4()], workdir_root=gone) == 0
    assert not gone.exists()
