"""Collecting /runyard/out from a tar stream and from a directory, into an in-memory set."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest

from runyard.artifact_store import ArtifactFile
from runyard.artifacts.collect import CollectError, collect_dir, collect_tar
from runyard.artifacts.rules import ArtifactLimits, ArtifactRefused
from runyard.domain.states import ErrorCode

LIMITS = ArtifactLimits(max_bytes=10 << 20)


class MemoryWriter:
    """A set writer that keeps the files in a dict and records the largest piece it saw."""

    def __init__(self) -> None:
        self.set_id = uuid.uuid4()
        self.files: dict[str, bytes] = {}
        self.largest_piece = 0
        self.finished = False

    def add(self, path: str, chunks: Iterable[bytes]) -> ArtifactFile:
        data = bytearray()
        for piece in chunks:
            self.largest_piece = max(self.largest_piece, len(piece))
            data += piece
        self.files[path] = bytes(data)
        return ArtifactFile(path, len(data), hashlib.sha256(data).hexdigest())

    def done(self) -> None:
        self.finished = True


def _tar(*members: tuple[str, bytes | str | None, bytes]) -> list[bytes]:
    """A tar of ``(name, kind, data)`` as the engine would stream it, in small chunks."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.LNKTYPE, "out/a"
                tar.addfile(info)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
                tar.addfile(info)
            elif kind == "dev":
                info.type = tarfile.CHRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    return [raw[i : i + 7000] for i in range(0, len(raw), 7000)]


def test_collect_tar__keeps_files_and_subdirectories_but_not_the_result():
    writer = MemoryWriter()
    big = os.urandom(3 << 20)
    kept = collect_tar(
        _tar(
            ("out", "dir", b""),
            ("out/result.json", None, b"{}"),
            ("out/a.txt", None, b"hello"),
            ("out/sub", "dir", b""),
            ("out/sub/result.json", None, b"not the result"),
            ("out/sub/big.bin", None, big),
            ("out/empty", None, b""),
        ),
        writer,
        LIMITS,
    )
    assert kept == 4
    assert writer.files == {
        "a.txt": b"hello",
        "sub/result.json": b"not the result",
        "sub/big.bin": big,
        "empty": b"",
    }
    assert writer.largest_piece <= 1 << 20


def test_collect_tar__long_names_survive():
    name = "d/" * 100 + "f.txt"
    writer = MemoryWriter()
    collect_tar(_tar(("out", "dir", b""), (f"out/{name}", None, b"x")), writer, LIMITS)
    assert writer.files == {name: b"x"}


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (("out/link", "sym", b""), "symbolic link"),
        (("out/hard", "link", b""), "hard link"),
        (("out/pipe", "fifo", b""), "FIFO"),
        (("out/dev", "dev", b""), "device"),
        (("out/../etc/x", None, b"x"), "'..'"),
        (("elsewhere/x", None, b"x"), "absolute"),
    ],
)
def test_collect_tar__refuses_links_devices_fifos_and_traversal(
    member: tuple[str, str | None, bytes], why: str
):
    with pytest.raises(ArtifactRefused) as refused:
        collect_tar(
            _tar(("out", "dir", b""), ("out/a", None, b"a"), member), MemoryWriter(), LIMITS
        )
    assert refused.value.code is ErrorCode.INVALID_ARTIFACT
    assert why in refused.value.message


def test_collect_tar__over_the_size_limit_before_reading_the_file():
    writer = MemoryWriter()
    with pytest.raises(ArtifactRefused) as refused:
        collect_tar(
            _tar(("out", "dir", b""), ("out/a", None, b"a" * 600), ("out/b", None, b"b" * 600)),
            writer,
            ArtifactLimits(max_bytes=1000),
        )
    assert refused.value.code is ErrorCode.ARTIFACTS_LIMIT
    assert list(writer.files) == ["a"]


def test_collect_tar__a_broken_stream_is_a_collect_error():
    chunks = _tar(("out", "dir", b""), ("out/a", None, os.urandom(50_000)))
    with pytest.raises(CollectError):
        collect_tar(chunks[:3], MemoryWriter(), LIMITS)


def test_collect_dir__walks_without_following_links(tmp_path: Path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_bytes(b"hello")
    (out / "sub" / "b.bin").write_bytes(b"\0" * 10)
    (out / "result.json").write_text("{}")
    writer = MemoryWriter()
    assert collect_dir(out, writer, LIMITS) == 2
    assert writer.files == {"a.txt": b"hello", "sub/b.bin": b"\0" * 10}


@pytest.mark.parametrize("make", ["symlink", "hardlink", "fifo"])
def test_collect_dir__refuses_links_and_fifos(tmp_path: Path, make: str):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").write_bytes(b"a")
    if make == "symlink":
        (out / "z").symlink_to("/etc/passwd")
    elif make == "hardlink":
        os.link(out / "a", out / "z")
    else:
        os.mkfifo(out / "z")
    with pytest.raises(ArtifactRefused) as refused:
        collect_dir(out, MemoryWriter(), LIMITS)
    assert refused.value.code is ErrorCode.INVALID_ARTIFACT


def test_collect_dir__an_out_that_is_a_link_is_not_followed(tmp_path: Path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "secret").write_bytes(b"s")
    (tmp_path / "out").symlink_to(target)
    with pytest.raises(CollectError):
        collect_dir(tmp_path / "out", MemoryWriter(), LIMITS)


def test_collect_dir__file_count_limit(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    for n in range(4):
        (out / f"f{n}").write_bytes(b"x")
    with pytest.raises(ArtifactRefused, match="more than 3 files"):
        collect_dir(out, MemoryWriter(), ArtifactLimits(max_bytes=100, max_files=3))
