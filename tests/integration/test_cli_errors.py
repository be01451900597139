"""Every error of the console script is one line on stderr and a documented exit code, never a
traceback: each command runs in a process of its own, under the condition that breaks it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

# Each command is a Python process of its own (a second or more on two busy cores): the
# full tier runs these; the quick one leaves them out.
pytestmark = pytest.mark.slow

USAGE, API_ERROR, UNREACHABLE = 2, 5, 6
NOWHERE = "http://127.0.0.1:9"  # the discard port on loopback: nothing answers
NO_DATABASE = "postgresql://runyard:secret@127.0.0.1:9/runyard"


def run_cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``runyard ARGS`` in a process of its own, with none of this shell's RUNYARD_ settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
    return subprocess.run(
        [sys.executable, "-m", "runyard.cli", *args],
        env=clean | env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], code: int) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.returncode == code, (done.returncode, done.stderr)


# The client retries an unreachable API before it gives up: seconds each.
SITS_OUT_RETRIES = pytest.mark.slow
# A service's command loads the service's modules, or tries an absent database: seconds each.
LOADS_A_SERVICE = pytest.mark.slow

CASES = [
    pytest.param(["keys", "ls"], {}, USAGE, "RUNYARD_DATABASE_URL", id="keys-ls-no-db-url"),
    pytest.param(
        ["keys", "create", "--tenant", "acme"], {}, USAGE, "not set", id="keys-create-no-url"
    ),
    pytest.param(["keys", "revoke", "0123456789ab"], {}, USAGE, "not set", id="keys-revoke-no-url"),
    pytest.param(["keys", "set-priority", "0123456789ab", "3"], {}, USAGE, "not", id="set-prio"),
    pytest.param(["migrate"], {}, USAGE, "RUNYARD_DATABASE_URL is not set", id="migrate-no-url"),
    pytest.param(
        ["migrate"],
        {"RUNYARD_DATABASE_URL": "mysql://x/y"},
        USAGE,
        "postgresql://",
        id="migrate-not-postgres",
    ),
    pytest.param(
        ["keys", "ls"],
        {"RUNYARD_DATABASE_URL": NO_DATABASE},
        UNREACHABLE,
        "cannot use the database",
        id="keys-ls-db-down",
        marks=LOADS_A_SERVICE,
    ),
    pytest.param(
        ["migrate"],
        {"RUNYARD_DATABASE_URL": NO_DATABASE},
        UNREACHABLE,
        "cannot use the database",
        id="migrate-db-down",
        marks=LOADS_A_SERVICE,
    ),
    pytest.param(
        ["reaper", "--once"], {}, USAGE, "not set", id="reaper-no-url", marks=LOADS_A_SERVICE
    ),
    pytest.param(["api"], {}, USAGE, "not set", id="api-no-url", marks=LOADS_A_SERVICE),
    pytest.param(["submit", "echo", "--input", "{bad"], {}, USAGE, "not valid JSON", id="bad-json"),
    pytest.param(
        ["submit", "echo", "--input", "@missing.json"], {}, USAGE, "cannot read", id="no-input"
    ),
    pytest.param(["batch", "submit", "missing.json"], {}, USAGE, "cannot read", id="no-batch"),
    pytest.param(["batch", "submit", "bad.json"], {}, USAGE, "not valid JSON", id="bad-batch"),
    pytest.param(
        [
            *("webhook", "verify", "missing.body", "--id", "m", "--timestamp", "1"),
            *("--signature", "v1,x", "--secret", "whsec_c2VjcmV0"),
        ],
        {},
        USAGE,
        "cannot read",
        id="webhook-verify-no-body",
    ),
    pytest.param(["--json", "dev"], {}, USAGE, "runyard dev", id="service-after-a-flag"),
    pytest.param(
        ["ls"],
        {"RUNYARD_URL": NOWHERE},
        UNREACHABLE,
        "cannot reach",
        id="ls-api-down",
        marks=SITS_OUT_RETRIES,
    ),
    pytest.param(
        ["get", "0197f5a2-0000-7000-8000-000000000000", "--url", NOWHERE],
        {},
        UNREACHABLE,
        "cannot reach",
        id="get-api-down",
        marks=SITS_OUT_RETRIES,
    ),
    pytest.param(
        ["--url", NOWHERE, "artifacts", "x", "--out", "out"],
        {},
        UNREACHABLE,
        "cannot reach",
        id="artifacts-api-down",
        marks=SITS_OUT_RETRIES,
    ),
    pytest.param(
        ["tools", "--url", NOWHERE],
        {},
        UNREACHABLE,
        "cannot reach",
        id="tools-down",
        marks=SITS_OUT_RETRIES,
    ),
]


@pytest.mark.parametrize(("args", "env", "code", "says"), CASES)
def test_cli_error__is_one_line_and_its_exit_code(
    args: list[str], env: dict[str, str], code: int, says: str, tmp_path: Path
):
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    done = run_cli(args, env, tmp_path)
    assert_one_line_error(done, code)
    assert says in done.stderr


def test_cli_database_command__on_a_database_never_migrated_says_to_migrate(
    postgres_server_url: str, tmp_path: Path
):
    # The server's own "postgres" database has no runyard tables.
    url = make_url(postgres_server_url).set(database="postgres")
    env = {"RUNYARD_DATABASE_URL": url.render_as_string(hide_password=False)}
    done = run_cli(["keys", "ls"], env, tmp_path)
    assert_one_line_error(done, API_ERROR)
    assert "runyard migrate" in done.stderr
