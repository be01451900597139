"""The docs match the code: every setting and every CLI command they name exists."""

from __future__ import annotations

import re
from pathlib import Path

from runyard.cli import SERVICES, build_parser
from runyard.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "compose.yaml", *sorted((ROOT / "docs").glob("*.md"))]
VARIABLE = re.compile(r"RUNYARD_[A-Z0-9_]*[A-Z0-9]")
COMMAND = re.compile(r"(?<![\w/.-])runyard ([a-z][a-z-]+)")
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)


def _code_env_names() -> set[str]:
    """Variables read outside Settings: by scripts, tests, the client, compose."""
    names: set[str] = set()
    for folder in ("scripts", "tests", "runyard", "api", "worker", "reaper"):
        for path in (ROOT / folder).rglob("*"):
            if (
                path.is_file()
                and path.suffix in ("", ".py", ".sh")
                and "__pycache__" not in str(path)
            ):
                names |= set(VARIABLE.findall(path.read_text(errors="replace")))
    names |= set(VARIABLE.findall((ROOT / "compose.yaml").read_text()))
    return names


def test_every_documented_setting__exists():
    fields = {f"RUNYARD_{name.upper()}" for name in Settings.model_fields}
    known = fields | _code_env_names()
    for doc in DOCS:
        unknown = sorted(set(VARIABLE.findall(doc.read_text())) - known)
        assert not unknown, f"{doc.name} names settings the code does not know: {unknown}"


def test_every_documented_command__exists():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    commands = set(subparsers.choices) | set(SERVICES)  # type: ignore[arg-type]
    for doc in DOCS:
        code = " ".join(CODE.findall(doc.read_text()))
        named = set(COMMAND.findall(code))
        unknown = sorted(named - commands)
        assert not unknown, f"{doc.name} names runyard commands that do not exist: {unknown}"
