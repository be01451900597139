"""A dependent's copy of its dependencies' artifacts under ``deps/``: a set whose paths cannot
all be files of one tree is the dependent run's failure (``DepsUnusable``), never written."""

from __future__ import annotations

import hashlib
import stat
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runyard.artifact_store import ArtifactFile
from runyard.artifacts.deps_out import DepsUnusable, deps_archive, write_deps_dir

DEP = uuid.uuid4()
SET = uuid.uuid4()


class DictStore:
    """The reading half of an artifact store over one set of files held in a dict."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self._files = files

    def files(self, run_id: uuid.UUID, set_id: uuid.UUID) -> list[ArtifactFile]:
        assert (run_id, set_id) == (DEP, SET)
        return [
            ArtifactFile(path, len(data), hashlib.sha256(data).hexdigest())
            for path, data in self._files.items()
        ]

    def read(
        self, run_id: uuid.UUID, set_id: uuid.UUID, path: str, start: int, stop: int
    ) -> Iterator[bytes]:
        yield self._files[path][start:stop]


# Kept before paths were checked for this: a file, and a directory of the same name.
CLASHING = {"a-***": b"x", "a-***/f": b"y"}


def write(root: Path, files: dict[str, bytes]) -> None:
    write_deps_dir(root, DictStore(files), {str(DEP): SET})  # type: ignore[arg-type]


def test_write_deps_dir__writes_every_file_read_only(tmp_path: Path):
    write(tmp_path, {"a.txt": b"hello", "sub/b.bin": b"\0" * 10, "empty": b""})
    top = tmp_path / "deps" / str(DEP)
    assert (top / "a.txt").read_bytes() == b"hello"
    assert (top / "sub" / "b.bin").read_bytes() == b"\0" * 10
    assert stat.S_IMODE((top / "empty").stat().st_mode) == 0o444


def test_write_deps_dir__a_set_whose_paths_clash_is_refused_before_anything_is_written(
    tmp_path: Path,
):
    with pytest.raises(DepsUnusable) as caught:
        write(tmp_path, CLASHING)
    assert str(caught.value) == (
        f"the artifacts of dependency {DEP} cannot be copied to /runyard/deps/{DEP}:"
        " 'a-***/f' lies in 'a-***', which is a file once secret values are masked"
    )
    assert not (tmp_path / "deps").exists()


def test_deps_archive__a_set_whose_paths_clash_is_refused():
    with pytest.raises(DepsUnusable, match="'a-\\*\\*\\*/f' lies in 'a-\\*\\*\\*'"):
        deps_archive(DictStore(CLASHING), {str(DEP): SET}, 0.0)  # type: ignore[arg-type]


def test_deps_archive__holds_every_file_under_deps():
    archive = deps_archive(DictStore({"a": b"1", "d/b": b"22"}), {str(DEP): SET}, 0.0)  # type: ignore[arg-type]
    assert archive is not None
    with archive, tarfile.open(fileobj=archive) as tar:
        assert sorted(tar.getnames()) == [f"deps/{DEP}/a", f"deps/{DEP}/d/b"]


def test_write_deps_dir__a_clash_with_what_is_there_is_the_runs_failure(tmp_path: Path):
    (tmp_path / "deps").mkdir()
    (tmp_path / "deps" / str(DEP)).write_bytes(b"")  # a file where the set's directory goes
    with pytest.raises(DepsUnusable, match=r"'a\.txt': File exists"):
        write(tmp_path, {"a.txt": b"hello"})
