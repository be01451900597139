"""The docs match the code (settings and CLI commands exist) and stand alone (no outside
references)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from runyard.cli import SERVICES, build_parser
from runyard.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "compose.yaml", *sorted((ROOT / "docs").glob("*.md"))]
VARIABLE = re.compile(r"RUNYARD_[A-Z0-9_]*[A-Z0-9]")
COMMAND = re.compile(r"(?<![\w/.-])runyard ([a-z][a-z-]+)")
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
# Names of documents that live outside the repository (design notes, decision or issue
# numbers of another tracker): the repository's text must explain itself.
OUTSIDE = re.compile(
    r"ADR-\d+|DESIGN\s*(?:§|\.md)|\bissues?\s+#?\d+|\.\./shared|\bseeds/", re.IGNORECASE
)
# Folders that are not the project's own text.
NOT_OURS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "var"}


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


def outside_references(text: str) -> list[str]:
    """Every mention in ``text`` of a document outside the repository."""
    return [match.group(0) for match in OUTSIDE.finditer(text)]


# The examples are spelled with stand-ins (see ``_spelled``) so this file, like every other
# tracked file, names no outside document itself.
_STAND_INS = {
    "<A>": "A" + "DR",
    "<D>": "DES" + "IGN",
    "<I>": "iss" + "ue",
    "<S>": "sha" + "red",
    "<E>": "se" + "eds",
}


def _spelled(text: str) -> str:
    for stand_in, word in _STAND_INS.items():
        text = text.replace(stand_in, word)
    return text


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("runs tools inline (<A>-0016)", ["<A>-0016"]),
        ("the hardening flags (<D> §5)", ["<D> §"]),
        ("read <D>.md first", ["<D>.md"]),
        ("### Added (<I> 9)", ["<I> 9"]),
        ("fixes <I>s #12 and 13", ["<I>s #12"]),
        ("see ../<S>/notes", ["../<S>"]),
        ("from <E>/003.txt", ["<E>/"]),
        ("signer.issue(prefix); a seeded soak; the session cookie; an issue with 2 cores", []),
        ("docs/decisions/0007-event-delivery-order.md, record 0002", []),
    ],
)
def test_outside_references__table(text: str, found: list[str]) -> None:
    assert outside_references(_spelled(text)) == [_spelled(item) for item in found]


def _project_text_files() -> list[Path]:
    """The tracked files; without git, every file outside caches and virtualenvs."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
        ).stdout.decode()
        paths = [ROOT / name for name in listed.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        paths = [
            path
            for path in ROOT.rglob("*")
            if path.is_file() and not NOT_OURS & set(path.relative_to(ROOT).parts)
        ]
    return [path for path in paths if path.is_file()]


def test_every_tracked_file__names_no_outside_document():
    offenders = []
    for path in _project_text_files():
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        for line_number, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            for found in outside_references(line):
                offenders.append(f"{path.relative_to(ROOT)}:{line_number}: {found}")
    assert not offenders, "references to documents outside the repository:\n" + "\n".join(offenders)
