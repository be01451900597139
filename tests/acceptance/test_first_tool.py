"""docs/first-tool.md typed in: its shell blocks and files, in order, in one shell, with
``runyard dev`` in the background where the page opens a second terminal; every output the
page shows must be printed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "first-tool.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
TITLE = re.compile(r'title="([^"]+)"')
HEREDOC_END = "RUNYARD_PAGE_EOF"


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, its other words, its text."""

    language: str
    info: str
    body: str


def blocks() -> list[Block]:
    """The page's fenced blocks, in order."""
    found = []
    for info, body in FENCE.findall(PAGE.read_text()):
        language, _, rest = info.partition(" ")
        found.append(Block(language, rest.strip(), body))
    return found


def script(blocks: list[Block], start: Path) -> str:
    """One bash script that does what the reader does: the plain shell blocks as they are,
    the files written where their title says, the second terminal's block in the background
    from where the reader started (its pid in ``start/dev.pid``) and waited for."""
    lines = ["set -euo pipefail", "set -m", f"cd {start}"]
    for block in blocks:
        title = TITLE.search(block.info)
        if block.language == "sh" and block.info == "":
            lines.append(block.body)
        elif block.language == "sh" and block.info == "fails":
            # A step the page says fails: its message (stderr) is what the page shows.
            lines.append(f"if {{ {block.body.strip()}; }} 2>&1; then exit 99; fi")
        elif block.language == "sh" and block.info == "terminal=2":
            lines.append(f"( cd {start} && {block.body.strip().replace(chr(10), ' && ')} )")
            lines[-1] += f" >{start}/dev.log 2>&1 &"
            lines.append(f"echo $! >{start}/dev.pid")
            lines.append(
                "for _ in $(seq 480); do runyard tools >/dev/null 2>&1 && break; sleep 0.5; done"
            )
        elif title is not None:
            redirect = ">>" if "mode=append" in block.info else ">"
            lines.append(f"cat {redirect} {title.group(1)} <<'{HEREDOC_END}'")
            lines.append(block.body + HEREDOC_END)
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_page__every_block_is_one_the_test_knows():
    kinds = {(b.language, b.info) for b in blocks()}
    assert kinds == {
        ("sh", "setup"),
        ("sh", ""),
        ("sh", "terminal=2"),
        ("sh", "fails"),
        ("toml", 'title="tools.toml"'),
        ("toml", 'title="tools.toml" mode=append'),
        ("python", 'title="wordfreq/wordfreq.py"'),
        ("dockerfile", 'title="wordfreq/Dockerfile"'),
        ("text", ""),
    }
    # The set-up the test does not type: the suite's own set-up has done it.
    setup = [b.body for b in blocks() if b.info == "setup"]
    assert setup == ["scripts/bootstrap\nsource .venv/bin/activate\n"]
    wordfreq = next(b for b in blocks() if b.language == "dockerfile")
    assert wordfreq.body.startswith("FROM runyard/base:latest\n")


@pytest.fixture
def start() -> Iterator[Path]:
    """Where the reader starts: outside pytest's temporary tree, which another session may
    make private while the embedded Postgres (another user) still needs to traverse it."""
    made = Path(tempfile.mkdtemp(prefix="runyard-first-tool-"))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_page__typed_in_order_against_runyard_dev(start: Path):
    client = docker.from_env(timeout=60)
    for image in ("runyard/base:latest", "runyard/toolbox:latest"):
        client.images.get(image)  # scripts/build-images made them, as the page's set-up does
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")} | {
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "RUNYARD_API_PORT": str(port),
        "RUNYARD_URL": f"http://127.0.0.1:{port}",
    }
    page = blocks()
    typed = script(page, start)
    try:
        done = subprocess.run(
            ["bash", "-c", typed],
            env=env,
            capture_output=True,
            text=True,
            timeout=360,
        )
        dev_log = (start / "dev.log").read_text() if (start / "dev.log").exists() else ""
        assert done.returncode == 0, f"{done.stderr}\n--- runyard dev:\n{dev_log}"
        for shown in (b.body for b in page if b.language == "text"):
            assert shown in done.stdout, f"{shown!r} not in:\n{done.stdout}"
    finally:
        _stop_dev(start)
        for image in client.images.list(name="runyard-build/wordfreq"):
            for tag in image.tags:
                client.images.remove(tag, force=True)
    assert not (start / "my-tools" / "var" / "pg" / "postmaster.pid").exists()


def _stop_dev(start: Path) -> None:
    """Ctrl-C for the background ``runyard dev`` (its own process group), then waiting for
    it to stop its Postgres; killed if it does not."""
    pid_file = start / "dev.pid"
    if not pid_file.exists():
        return
    group = int(pid_file.read_text())
    try:
        os.killpg(group, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(group, signal.SIGKILL)
