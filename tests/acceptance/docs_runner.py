"""What the doc-running tests share: a ``runyard dev`` stack on the shipped tools, and the
shell lines of a Markdown page, taken from the page itself so a test fails when it drifts."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
# A trailing comment: two spaces or more, then "# " (no command of the docs holds that).
TRAILING_COMMENT = re.compile(r"\s{2,}#\s")


@dataclass
class Stack:
    """A running ``runyard dev`` and a folder laid out like the repository for the docs."""

    port: int
    base: str
    cwd: Path
    env: dict[str, str]
    log: Path


@dataclass
class Line:
    """One command of a shell block and what its comments claim."""

    command: str
    claim: str


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return dict(json.loads(response.read()))


@contextmanager
def dev_stack() -> Iterator[Stack]:
    """``runyard dev`` on a free port, the shipped registry, an embedded Postgres; the docs'
    commands run in a folder with ``tools`` and ``.venv`` as in a checkout."""
    made = Path(tempfile.mkdtemp(prefix="runyard-docs-test-"))
    cwd = made / "checkout"
    cwd.mkdir()
    (cwd / "tools").symlink_to(ROOT / "tools")
    (cwd / ".venv").symlink_to(VENV_BIN.parent)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")} | {
        "RUNYARD_TOOLS_FILE": str(ROOT / "tools" / "tools.toml"),
        "RUNYARD_WORKER_POLL_SECONDS": "0.2",
    }
    log_path = made / "dev.log"
    log = log_path.open("w")
    command = [sys.executable, "-m", "runyard.cli", "dev", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--data-dir", str(made / "pg")],
        cwd=made,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while "runyard dev is up at" not in log_path.read_text():
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.3)
        yield Stack(port, base, cwd, env, log_path)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(made, ignore_errors=True)


def fenced_blocks(markdown: str, language: str) -> list[str]:
    """The bodies of the page's ``` blocks of ``language`` ("" for a block without one)."""
    blocks: list[str] = []
    body: list[str] | None = None
    opened_with = ""
    for line in markdown.splitlines():
        if body is None and line.startswith("```"):
            body, opened_with = [], line[3:].strip()
        elif body is not None and line.strip() == "```":
            if opened_with == language:
                blocks.append("\n".join(body) + "\n")
            body = None
        elif body is not None:
            body.append(line)
    return blocks


def section(markdown: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## ``."""
    start = markdown.index(f"## {heading}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end >= 0 else len(markdown)]


def shell_lines(block: str) -> list[Line]:
    """Commands (continuation lines joined) with their trailing comment, and the ``# -> ...``
    lines under them, as the claim; other comment lines are prose."""
    lines: list[Line] = []
    pending = ""
    for raw in block.splitlines():
        stripped = raw.strip()
        if not stripped:
            continue
        if not pending and stripped.startswith("#"):
            if stripped.startswith("# ->") and lines:
                lines[-1].claim += " " + stripped[2:].strip()
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        parts = TRAILING_COMMENT.split(text, maxsplit=1)
        lines.append(Line(parts[0].strip(), parts[1].strip() if len(parts) > 1 else ""))
    return lines


@dataclass
class Outcome:
    """What one command of a shell session did."""

    rc: int
    out: str
    err: str


def run_session(
    stack: Stack, commands: list[str], epilogue: str = "", *, preset: bool = True
) -> list[Outcome]:
    """The commands in one bash session (variables and jobs carry over, as in a terminal),
    each with its own stdout, stderr and exit code; ``epilogue`` runs last (its output: the
    file ``epilogue.out`` in the stack's folder). ``preset``: ``runyard`` on the PATH and
    ``RUNYARD_URL`` the stack's, as the docs pages assume; without it the commands must set
    both themselves, as the README's tour does."""
    work = stack.cwd / ".session"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    script = ["set -u"]
    for n, command in enumerate(commands):
        script.append(
            f'{{ {command}\n}} >"{work}/out.{n}" 2>"{work}/err.{n}"; echo $? >"{work}/rc.{n}"'
        )
    script.append(f'{{ {epilogue or ":"}\n}} >"{work}/epilogue.out" 2>&1')
    subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=stack.cwd,
        env=stack.env | {"PATH": f"{VENV_BIN}:{stack.env['PATH']}", "RUNYARD_URL": stack.base}
        if preset
        else stack.env,
        timeout=600,
        check=False,
    )
    outcomes = []
    for n in range(len(commands)):
        rc_file = work / f"rc.{n}"
        assert rc_file.exists(), f"the session stopped before {commands[n]!r}"
        outcomes.append(
            Outcome(
                int(rc_file.read_text()),
                (work / f"out.{n}").read_text(),
                (work / f"err.{n}").read_text(),
            )
        )
    return outcomes


def on_port(command: str, port: int) -> str:
    """A command of the docs, aimed at the test's port instead of 8000."""
    return command.replace("localhost:8000", f"localhost:{port}").replace(
        "127.0.0.1:8000", f"127.0.0.1:{port}"
    )
