"""A path's stat from the engine's archive API: a link is a link by its mode, on Docker and on
Podman (which names the path itself as the link target of every file)."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest

from runyard.runners.docker.outputs import parse_result_archive, stat_is_link

FILE_MODE = 0o644
LINK_MODE = (1 << 27) | 0o777


@pytest.mark.parametrize(
    ("stat", "link"),
    [
        ({"name": "r.json", "mode": FILE_MODE, "linkTarget": ""}, False),  # Docker
        ({"name": "r.json", "mode": FILE_MODE, "linkTarget": "/runyard/out/r.json"}, False),
        ({"name": "l.json", "mode": LINK_MODE, "linkTarget": "/etc/passwd"}, True),
        ({"name": "passwd", "mode": LINK_MODE, "linkTarget": "/etc/passwd"}, True),  # Podman
        ({"name": "l.json", "linkTarget": "/etc/passwd"}, True),  # no mode: the target decides
        ({"name": "r.json"}, False),
    ],
)
def test_stat_is_link__by_mode_on_docker_and_podman(stat: dict[str, Any], link: bool):
    assert stat_is_link(stat) is link


def _tar_of(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_result_archive__podmans_stat_of_a_regular_file_is_read():
    stat = {"name": "result.json", "size": 8, "mode": FILE_MODE, "linkTarget": "/x/result.json"}
    chunks = [_tar_of("result.json", b'{"a": 1}')]
    assert parse_result_archive(stat, chunks, cap=1024) == ({"a": 1}, None)
