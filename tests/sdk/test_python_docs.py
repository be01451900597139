"""Every Python example of ``docs/python.md`` runs, as written, against a real API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.sdk.harness import live_backend

PAGE = Path(__file__).resolve().parents[2] / "docs" / "python.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def python_blocks() -> list[str]:
    """The page's Python code blocks, in order."""
    return BLOCK.findall(PAGE.read_text())


def test_page__has_the_tour_async_errors_and_fake_examples():
    blocks = python_blocks()
    assert len(blocks) == 4
    assert "Runyard.from_env()" in blocks[0] and "AsyncRunyard" in blocks[1]
    assert "FakeRunyard" in blocks[3]


@pytest.mark.parametrize("index", range(4), ids=["tour", "async", "errors", "fake"])
def test_example__runs_against_the_api(
    index: int,
    database_url: str,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    block = python_blocks()[index]
    with live_backend(database_url, engine) as (url, key):
        monkeypatch.setenv("RUNYARD_URL", url)
        monkeypatch.setenv("RUNYARD_API_KEY", key)
        exec(compile(block, f"{PAGE.name}[{index}]", "exec"), {"__name__": "__docs__"})
    # The examples' own asserts are the checks; those against the API also print what they got.
    assert capsys.readouterr().out or index == 3
