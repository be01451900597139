"""Where the CLI writes a downloaded artifact: always inside the target directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from runyard.client.artifacts import UnsafePath, target_path


@pytest.mark.parametrize("path", ["a.txt", "sub/dir/b.bin", "..x", "x..", "ünï code.txt"])
def test_target_path__plain_relative_paths_stay_inside(path: str):
    out = Path("/tmp/out")
    assert target_path(out, path).is_relative_to(out)
    assert target_path(out, path) == out / path


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/.", "", "a/", "nul\0byte"]
)
def test_target_path__refuses_anything_else(path: str):
    with pytest.raises(UnsafePath):
        target_path(Path("/tmp/out"), path)
