"""A tool's secret values in its artifacts: masked in paths and text, binary refused."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable
from pathlib import Path

import pytest

from runyard.artifacts.collect import collect_dir, collect_tar
from runyard.artifacts.masking import mask_path, masked_content
from runyard.artifacts.rules import ArtifactLimits, ArtifactRefused, Kind, Tally
from runyard.domain.states import ErrorCode
from runyard.registry.redact import Redactor
from tests.unit.test_artifact_collect import MemoryWriter

SECRET = "hunter2-token"
REDACTOR = Redactor([SECRET])
LIMITS = ArtifactLimits(max_bytes=1 << 20)


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[at : at + size] for at in range(0, len(data), size)] or [b""]


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("report.txt", "report.txt"),
        (f"{SECRET}.txt", "***.txt"),
        (f"dir-{SECRET}/inner-{SECRET}", "dir-***/inner-***"),
        ("hunter2/-token/x", "hunter2/-token/x"),
        # Not UTF-8 (as tarfile decodes it): masked byte for byte, still not UTF-8.
        (f"bad-\udcff-{SECRET}", "bad-\udcff-***"),
    ],
)
def test_mask_path__table(path: str, shown: str):
    assert mask_path(REDACTOR, path) == shown
    assert mask_path(Redactor(()), path) == path


def test_mask_path__a_value_across_a_directory_border_is_masked_too():
    assert mask_path(Redactor(["ab/cd"]), "x-ab/cd-y/z") == "x-***-y/z"


@pytest.mark.parametrize("size", [1, 3, 7, 64])
def test_masked_content__text_is_masked_across_pieces(size: int):
    data = f"key={SECRET}\nagain {SECRET}{SECRET} done\n".encode()
    tally = Tally(LIMITS)
    tally.admit("a.txt", Kind.FILE, len(data))
    out = b"".join(masked_content(REDACTOR, "a.txt", pieces(data, size), tally))
    assert out == b"key=***\nagain ****** done\n"


def test_masked_content__utf8_text_around_a_value_stays_utf8():
    data = f"é→{SECRET}←ü".encode()
    tally = Tally(LIMITS)
    out = b"".join(masked_content(REDACTOR, "u.txt", pieces(data, 2), tally))
    assert out.decode("utf-8") == "é→***←ü"


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xfe" + SECRET.encode(),
        SECRET.encode() + b"\x00\xff" * 100,
        # Cut in the middle of a multi-byte character at the end: not UTF-8 either.
        SECRET.encode() + b"\xe2\x82",
    ],
)
def test_masked_content__binary_holding_a_value_is_refused_naming_the_masked_path(data: bytes):
    tally = Tally(LIMITS)
    with pytest.raises(ArtifactRefused) as caught:
        b"".join(masked_content(REDACTOR, "blob-***.bin", pieces(data, 5), tally))
    assert caught.value.code is ErrorCode.INVALID_ARTIFACT
    assert "'blob-***.bin' is not UTF-8 text and holds a secret value" in caught.value.message
    assert SECRET not in caught.value.message


def test_masked_content__binary_without_a_value_is_kept_as_it_is():
    data = bytes(range(256)) * 50
    tally = Tally(LIMITS)
    assert b"".join(masked_content(REDACTOR, "b.bin", pieces(data, 999), tally)) == data


def test_masked_content__a_value_shorter_than_the_mask_cannot_grow_past_the_limit():
    data = b"a" * 1000
    tally = Tally(ArtifactLimits(max_bytes=2000))
    tally.admit("a.txt", Kind.FILE, len(data))
    with pytest.raises(ArtifactRefused) as caught:
        b"".join(masked_content(Redactor(["a"]), "a.txt", pieces(data, 100), tally))
    assert caught.value.code is ErrorCode.ARTIFACTS_LIMIT


def test_tally__two_files_masked_into_one_path_are_refused():
    tally = Tally(LIMITS)
    tally.admit("x-***", Kind.FILE, 1)
    with pytest.raises(ArtifactRefused) as caught:
        tally.admit("x-***", Kind.FILE, 1)
    assert caught.value.code is ErrorCode.INVALID_ARTIFACT
    assert "names two files once secret values are masked" in caught.value.message


def _tar(members: Iterable[tuple[str, bytes]]) -> list[bytes]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        top = tarfile.TarInfo("out")
        top.type = tarfile.DIRTYPE
        tar.addfile(top)
        for name, data in members:
            info = tarfile.TarInfo(f"out/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    return [raw[at : at + 5000] for at in range(0, len(raw), 5000)]


def test_collect_tar__masks_names_and_text_and_refuses_a_binary_secret():
    writer = MemoryWriter()
    members = [(f"{SECRET}.txt", f"token {SECRET}".encode()), ("plain.bin", b"\xff\x00")]
    assert collect_tar(_tar(members), writer, LIMITS, redactor=REDACTOR) == 2
    assert writer.files == {"***.txt": b"token ***", "plain.bin": b"\xff\x00"}
    with pytest.raises(ArtifactRefused) as caught:
        collect_tar(
            _tar([(f"bin-{SECRET}", b"\xff" + SECRET.encode())]),
            MemoryWriter(),
            LIMITS,
            redactor=REDACTOR,
        )
    assert "'bin-***'" in caught.value.message and SECRET not in caught.value.message


def test_collect_dir__masks_names_and_refusals_show_masked_paths(tmp_path: Path):
    out = tmp_path / "out"
    (out / f"d-{SECRET}").mkdir(parents=True)
    (out / f"d-{SECRET}" / "r.txt").write_text(f"{SECRET}!")
    writer = MemoryWriter()
    assert collect_dir(out, writer, LIMITS, REDACTOR) == 1
    assert writer.files == {"d-***/r.txt": b"***!"}
    (out / f"link-{SECRET}").symlink_to("/etc/passwd")
    with pytest.raises(ArtifactRefused) as caught:
        collect_dir(out, MemoryWriter(), LIMITS, REDACTOR)
    assert "'link-***' is a symbolic link" in caught.value.message


@pytest.mark.parametrize("file_first", [True, False])
def test_collect_tar__a_file_and_a_directory_masked_into_one_path_are_refused(file_first: bool):
    members = [("a-***", b"x"), (f"a-{SECRET}/f", b"y")]
    with pytest.raises(ArtifactRefused) as caught:
        collect_tar(
            _tar(members if file_first else members[::-1]),
            MemoryWriter(),
            LIMITS,
            redactor=REDACTOR,
        )
    assert caught.value.code is ErrorCode.INVALID_ARTIFACT
    assert "'a-***" in caught.value.message and SECRET not in caught.value.message


def test_collect_dir__a_file_and_a_directory_masked_into_one_path_are_refused(tmp_path: Path):
    out = tmp_path / "out"
    (out / f"a-{SECRET}").mkdir(parents=True)
    (out / f"a-{SECRET}" / "f").write_text("y")
    (out / "a-***").write_text("x")  # a file named like the masked directory
    with pytest.raises(ArtifactRefused) as caught:
        collect_dir(out, MemoryWriter(), LIMITS, REDACTOR)
    assert caught.value.code is ErrorCode.INVALID_ARTIFACT
    assert "'a-***/f' lies in 'a-***'" in caught.value.message
