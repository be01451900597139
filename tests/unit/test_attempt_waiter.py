"""What an attempt's waiter asks of the engine for its watches."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from runyard.domain.attempt import AttemptSpec
from runyard.runner import AttemptControl
from runyard.runners.docker.host_workdirs import AttemptDirs
from runyard.runners.docker.usage_meter import UsageMeter
from runyard.runners.docker.waiting import AttemptWaiter


class CountingApi:
    def __init__(self) -> None:
        self.inspects = 0
        self.volumes: list[str] = []

    def inspect_container(self, ref: str) -> dict[str, Any]:
        self.inspects += 1
        return {"Config": {"Labels": {}}, "LogPath": ""}

    def inspect_volume(self, name: str) -> dict[str, Any]:
        self.volumes.append(name)
        return {"Mountpoint": ""}


def watch_of(api: CountingApi) -> Any:
    spec = AttemptSpec(
        run_id=uuid.uuid4(),
        attempt=1,
        tool={"name": "t", "image": "i", "command": ["true"], "disk_mb": 10},
        input={},
        deadline_at=datetime.now(UTC) + timedelta(minutes=1),
    )
    waiter = AttemptWaiter(api, AttemptDirs(None), UsageMeter(api), stop_grace_seconds=1)
    return waiter.watch("c0ffee", spec, AttemptControl())


def test_watch__an_inspect_its_owner_read_spares_it_one():
    api = CountingApi()
    watch = watch_of(api)
    watch.inspected({"Config": {"Labels": {}}, "LogPath": ""})
    assert watch.disk_used() is None  # the volume's mount point is not visible here
    assert api.inspects == 0 and len(api.volumes) == 1


def test_watch__asks_for_the_inspect_itself_when_none_was_read():
    api = CountingApi()
    assert watch_of(api).disk_used() is None
    assert api.inspects == 1
