"""``runyard completion SHELL`` prints a completion script made from the CLI's parser."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

# Each command is a Python process of its own (a second or more on two busy cores): the
# full tier runs these; the quick one leaves them out.
pytestmark = pytest.mark.slow

SUBCOMMANDS = [
    "submit",
    "logs",
    "artifacts",
    "batch",
    "keys",
    "migrate",
    "dev",
    "doctor",
    "completion",
]


def completion_script(shell: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "runyard.cli", "completion", shell],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stderr == ""
    return done.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion__prints_a_script_naming_every_subcommand(shell: str):
    script = completion_script(shell)
    for name in SUBCOMMANDS:
        assert name in script, (shell, name)


def test_completion_bash__is_valid_bash_that_completes_subcommands_and_their_choices(tmp_path):
    bash = shutil.which("bash")
    assert bash is not None
    path = tmp_path / "runyard.bash"
    path.write_text(completion_script("bash"), encoding="utf-8")
    subprocess.run([bash, "-n", str(path)], check=True, timeout=30)

    def complete(*words: str) -> list[str]:
        line = "runyard " + " ".join(words)
        probe = (
            f"source {path}; COMP_WORDS=(runyard {' '.join(repr(w) for w in words)}); "
            f"COMP_CWORD={len(words)}; COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; "
            'type _shtab_runyard >/dev/null && _shtab_runyard; printf "%s\\n" "${COMPREPLY[@]}"'
        )
        done = subprocess.run(
            [bash, "-c", probe], capture_output=True, text=True, check=True, timeout=30
        )
        return done.stdout.split()

    assert complete("sub") == ["submit"]
    assert complete("completion", "") == ["bash", "zsh", "fish"]
    assert "--follow" in complete("logs", "--f")


def test_completion__an_unknown_shell_is_a_usage_error():
    done = subprocess.run(
        [sys.executable, "-m", "runyard.cli", "completion", "tcsh"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
