"""The docs match the code (settings and CLI commands exist) and stand alone (no outside
references)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from runyard.cli.main import SERVICES, build_parser
from runyard.platform.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    ROOT / "compose.yaml",
    ROOT / "sdk" / "python" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
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
    for folder in ("scripts", "tests", "runyard", "api", "worker", "reaper", "sdk"):
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


# A path of the repository's own, as the docs cite it (`runyard/queue/sql.py`, docs/api.md).
PATH = re.compile(
    r"(?<![\w/.@-])((?:runyard|api|worker|reaper|tests|docs|scripts|bench|migrations|tools)"
    r"/[\w.-]+(?:/[\w.-]+)*/?)"
)
# A code name in backticks: dotted (`Worker.run_once`, `runyard.queue.sql`), called
# (`run_once()`), CamelCase (`DockerRunner`) or snake_case with an underscore (`claim_jobs`).
CODE_NAME = re.compile(
    r"`((?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*|[A-Za-z_]\w*\(\)|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+"
    r"|[a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?:\(\))?`"
)
# Names of other programs the docs cite (Postgres and PgBouncer settings, extensions, tools).
EXTERNAL_NAMES = {
    "auto_explain",
    "idle_in_transaction_session_timeout",
    "max_prepared_statements",
    "pg_dump",
    "pg_stat_statements",
    "pg_stat_user_indexes",
    "synchronous_commit",
}
CODE_SUFFIXES = {".py", ".sql", ".toml", ".sh", ".yaml", ".yml", ".cfg", ".ini", ""}


def cited_paths(text: str) -> set[str]:
    """The repository paths ``text`` cites, without a trailing anchor or line number."""
    found = set()
    text = text.replace("](../", "](")  # a link from docs/ to the code
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".")
        if text[match.end() : match.end() + 1] in ("*", "<", "{"):
            continue  # a pattern (tests/unit/test_*.py), not a path
        # ``runyard/toolbox`` or ``runyard/raw`` with no extension and no folder below is an
        # image name or a ratio: a path names a file (an extension) or a folder (a slash).
        if path.count("/") == 1 and "." not in path.rsplit("/", 1)[1]:
            continue
        found.add(path)
    return found


def _code_words() -> set[str]:
    """Every identifier-like word of the project's code, SQL, settings and scripts."""
    words: set[str] = set()
    for path in _project_text_files():
        relative = path.relative_to(ROOT)
        if relative.parts[0] in ("docs",) or path.suffix not in CODE_SUFFIXES:
            continue
        if path.suffix == "" and relative.parts[0] != "scripts":
            continue
        words |= set(re.findall(r"[A-Za-z_][\w]*", path.read_text(errors="replace")))
    return words


def test_every_cited_path__exists():
    missing = []
    for doc in DOCS:
        for path in sorted(cited_paths(doc.read_text())):
            if not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
    assert not missing, "the docs cite paths that do not exist:\n" + "\n".join(missing)


def _is_known(name: str, words: set[str], files: set[str]) -> bool:
    """Whether a cited code name is the project's: a file's name, or words of its code."""
    name = name.removesuffix("()")
    if name in files or name in EXTERNAL_NAMES:
        return True
    # A Prometheus counter is declared without the ``_total`` its samples carry.
    parts = name.removesuffix("_total").split(".")
    # A test cited by the part of its name before ``__`` (test_thing rather than
    # test_thing__what_happens).
    return all(
        part in words or any(word.startswith(f"{part}__") for word in words) for part in parts
    )


def test_every_cited_code_name__exists():
    words = _code_words()
    files = {path.name for path in _project_text_files()}
    missing = []
    for doc in DOCS:
        for name in sorted(set(CODE_NAME.findall(doc.read_text()))):
            if not _is_known(name, words, files):
                missing.append(f"{doc.relative_to(ROOT)}: {name}")
    assert not missing, "the docs cite code names that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    ("text", "paths"),
    [
        ("see `runyard/queue/sql.py` and docs/api.md.", {"runyard/queue/sql.py", "docs/api.md"}),
        ("the image runyard/toolbox:latest and the ratio runyard/raw", set()),
        ("every `tests/unit/test_*.py`", set()),
        ("[workers](docs/workers.md#faults)", {"docs/workers.md"}),
        ("[the route](../api/routes/runs.py)", {"api/routes/runs.py"}),
        ("`tests/acceptance/` holds them", {"tests/acceptance/"}),
    ],
)
def test_cited_paths__table(text: str, paths: set[str]) -> None:
    assert cited_paths(text) == paths
