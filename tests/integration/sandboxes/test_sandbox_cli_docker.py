"""``runyard sandbox`` as a real process against the API and a sandbox worker."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.api.cli_support import CLI
from tests.integration.sandboxes.conftest import Stack

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    key = str(stack.client.headers["Authorization"]).removeprefix("Bearer ")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
    env |= {"RUNYARD_URL": stack.url, "RUNYARD_API_KEY": key}
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120)


def test_cli_sandbox__create_exec_cp_ls_rm(stack: Stack, tmp_path: Path):
    created = cli(stack, "sandbox", "create", "sandbox", "--ttl", "300")
    assert created.returncode == 0, created.stderr
    sid = created.stdout.strip()
    local = tmp_path / "in.txt"
    local.write_text("from the laptop\n")

    copied_in = cli(stack, "sandbox", "cp", str(local), f"{sid}:docs/in.txt")
    ran = cli(
        stack, "sandbox", "exec", sid, "--", "sh", "-c", "cat docs/in.txt; echo e >&2; exit 5"
    )
    copied_out = cli(stack, "sandbox", "cp", f"{sid}:docs/in.txt", str(tmp_path / "back.txt"))
    listed = cli(stack, "sandbox", "ls")
    removed = cli(stack, "sandbox", "rm", sid)

    assert copied_in.returncode == 0, copied_in.stderr
    assert (ran.returncode, ran.stdout, ran.stderr) == (5, "from the laptop\n", "e\n")
    assert copied_out.returncode == 0 and (tmp_path / "back.txt").read_text() == "from the laptop\n"
    assert sid in listed.stdout
    assert removed.returncode == 0 and removed.stdout == f"deleted {sid}\n"
