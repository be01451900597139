"""Builds: the content digest, the context on disk, the registry's build key, the rules."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from runyard.builds.context import (
    ContextProblem,
    DiskBuildResolver,
    context_tar,
    read_context,
)
from runyard.builds.digest import ContextFile, context_digest, image_tag, is_build_tag
from runyard.builds.reads import log_since
from runyard.builds.rules import BuildAction, failure_message, log_tail, on_claim
from runyard.domain.build_ref import BuildRef
from runyard.platform.settings import Settings
from runyard.registry.tools import RegistryError, parse_registry

SETTINGS = Settings(database_url="unused")
FILES = [ContextFile("Dockerfile", False, b"FROM x\n"), ContextFile("run.sh", True, b"echo\n")]
BASE = context_digest(FILES, "Dockerfile", {"A": "1"})


@pytest.mark.parametrize(
    ("files", "dockerfile", "args", "same"),
    [
        (list(reversed(FILES)), "Dockerfile", {"A": "1"}, True),  # order of listing
        (FILES, "Dockerfile", {"A": "2"}, False),  # an arg
        (FILES, "Dockerfile", {}, False),
        (FILES, "other/Dockerfile", {"A": "1"}, False),  # the Dockerfile's path
        ([FILES[0], ContextFile("run.sh", False, b"echo\n")], "Dockerfile", {"A": "1"}, False),
        ([FILES[0], ContextFile("run2.sh", True, b"echo\n")], "Dockerfile", {"A": "1"}, False),
        ([FILES[0], ContextFile("run.sh", True, b"echo!\n")], "Dockerfile", {"A": "1"}, False),
        # bytes moved from one file to the next
        (
            [ContextFile("Dockerfile", False, b"FROM x\ne"), ContextFile("run.sh", True, b"cho\n")],
            "Dockerfile",
            {"A": "1"},
            False,
        ),
    ],
)
def test_context_digest__changes_with_any_input_and_only_then(files, dockerfile, args, same):
    assert (context_digest(files, dockerfile, args) == BASE) is same


def test_image_tag__names_the_tool_and_twelve_hex():
    tag = image_tag("numstats", BASE)
    assert tag == f"runyard-build/numstats:{BASE[:12]}"
    assert is_build_tag(tag) and not is_build_tag("runyard/toolbox:latest")


def test_context_tar__same_files_same_bytes_with_modes():
    assert context_tar(FILES) == context_tar(list(reversed(FILES)))
    with tarfile.open(fileobj=io.BytesIO(context_tar(FILES))) as tar:
        modes = {m.name: (m.mode, m.uid, m.mtime) for m in tar.getmembers()}
    assert modes == {"Dockerfile": (0o644, 0, 0), "run.sh": (0o755, 0, 0)}


def _context(root: Path) -> Path:
    (root / "ctx").mkdir()
    (root / "ctx" / "Dockerfile").write_text("FROM runyard/toolbox:latest\n")
    (root / "ctx" / "sub").mkdir()
    (root / "ctx" / "sub" / "a.txt").write_text("a")
    return root / "ctx"


def test_read_context__refuses_links_a_missing_dockerfile_and_too_much(tmp_path: Path):
    ctx = _context(tmp_path)
    assert [f.path for f in read_context(ctx, "Dockerfile", 1000)] == ["Dockerfile", "sub/a.txt"]
    with pytest.raises(ContextProblem, match=r"has no Dockerfile\.other"):
        read_context(ctx, "Dockerfile.other", 1000)
    with pytest.raises(ContextProblem, match="more than 10 bytes"):
        read_context(ctx, "Dockerfile", 10)
    os.symlink("/etc/passwd", ctx / "sub" / "link")
    with pytest.raises(ContextProblem, match="sub/link is not a regular file"):
        read_context(ctx, "Dockerfile", 1000)
    with pytest.raises(ContextProblem, match="not a directory"):
        read_context(tmp_path / "nothing", "Dockerfile", 1000)


def _tool(context: str = "ctx", **more: object):
    entry = {"build": {"context": context}, "command": ["true"], **more}
    registry = parse_registry({"tools": {"t": entry}}, SETTINGS)
    tool = registry.get("t")
    assert tool is not None
    return tool


def test_resolver__saves_each_new_digest_once_and_sees_edits(tmp_path: Path):
    ctx = _context(tmp_path)
    saved: list[tuple[BuildRef, bytes]] = []
    resolver = DiskBuildResolver(tmp_path, lambda ref, tar: saved.append((ref, tar)), max_bytes=999)
    tool = _tool(build_timeout_seconds=30)
    first = resolver.resolve(tool)
    assert resolver.resolve(tool) == first and len(saved) == 1
    assert first.timeout_seconds == 30 and first.tag == image_tag("t", first.digest)
    (ctx / "sub" / "a.txt").write_text("changed, and longer")
    second = resolver.resolve(tool)
    assert second.digest != first.digest and len(saved) == 2
    assert second.snapshot()["tag"] == second.tag


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"command": ["true"]}, "exactly one of image and build"),
        ({"image": "i", "build": {"context": "c"}, "command": ["true"]}, "exactly one of"),
        ({"build": {"context": "/abs"}, "command": ["true"]}, "relative to the tools file"),
        (
            {"build": {"context": "c", "dockerfile": "../D"}, "command": ["true"]},
            "inside the context",
        ),
        ({"build": {"context": "c", "network": "host"}, "command": ["true"]}, "network"),
        ({"build": {"context": "c", "secret": "x"}, "command": ["true"]}, "secret"),
        ({"build": {"context": "c"}, "build_timeout_seconds": 0, "command": ["true"]}, "timeout"),
    ],
)
def test_registry__build_key_checked_at_load(entry, problem):
    with pytest.raises(RegistryError, match=problem):
        parse_registry({"tools": {"t": entry}}, SETTINGS)


def test_registry__build_defaults():
    tool = _tool()
    assert tool.build is not None and tool.image is None
    assert (tool.build.dockerfile, tool.build.args, tool.build.network) == (
        "Dockerfile",
        {},
        "none",
    )
    assert tool.build_timeout_seconds == 600


@pytest.mark.parametrize(
    ("image_present", "recovered", "attempts", "action"),
    [
        (True, False, 1, BuildAction.ADOPT),
        (True, True, 9, BuildAction.ADOPT),  # the image is there whoever built it
        (False, False, 1, BuildAction.BUILD),
        (False, True, 2, BuildAction.BUILD),  # its worker died: build again
        (False, True, 3, BuildAction.BUILD),
        (False, True, 4, BuildAction.GIVE_UP),  # lost on every attempt
    ],
)
def test_on_claim__adopt_build_or_give_up(image_present, recovered, attempts, action):
    assert (
        on_claim(
            image_present=image_present, recovered=recovered, attempts=attempts, max_attempts=3
        )
        is action
    )


def test_failure_message__reason_then_the_logs_last_lines():
    log = "".join(f"Step {i}\n\n" for i in range(40))
    message = failure_message("runyard-build/t:abc", "exit 7", log)
    assert message.startswith("build of runyard-build/t:abc failed: exit 7\nStep 20\n")
    assert message.endswith("Step 39") and "Step 19\n" not in message
    assert failure_message("x", "gone", "") == "build of x failed: gone"
    assert len(log_tail("y" * 5000)) == 2000


@pytest.mark.parametrize(
    ("log", "size", "seen", "expected"),
    [
        ("abcdef", 6, 0, ("abcdef", False)),
        ("abcdef", 6, 4, ("ef", False)),
        ("abcdef", 6, 6, ("", False)),
        ("cdef", 6, 1, ("cdef", True)),  # the log kept its tail: b is gone
        ("cdef", 6, 2, ("cdef", False)),
    ],
)
def test_log_since__what_a_follower_has_not_seen(log, size, seen, expected):
    assert log_since(log, size, seen) == expected
