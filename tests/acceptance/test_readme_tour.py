"""The README's "A first run" and "A 60-second tour with the CLI", line by line, as written,
against ``runyard dev`` on the shipped tools: each line does what its comment says."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.acceptance.docs_runner import (
    ROOT,
    Line,
    Outcome,
    Stack,
    dev_stack,
    fenced_blocks,
    get_json,
    on_port,
    run_session,
    section,
    shell_lines,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
SHIPPED_TOOLS = ["echo", "sleep", "fail", "wordcount", "report", "numstats"]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with dev_stack() as started:
        yield started


def readme_block(heading: str) -> list[Line]:
    markdown = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = fenced_blocks(section(markdown, heading), "sh")
    assert blocks, f"README.md has no sh block under {heading!r}"
    return shell_lines(blocks[0])


@pytest.mark.timeout(300)
def test_readme_first_run__every_line_does_what_its_comment_says(stack: Stack):
    lines = readme_block("A first run")
    assert lines[0].command == "scripts/dev &"
    assert "minutes" in lines[0].claim
    # scripts/dev is bootstrap, then `runyard dev`: the stack fixture started that.
    ready, submit, wait = lines[1:]
    assert "--retry-connrefused" in ready.command and "ready" in ready.claim
    outcomes = run_session(stack, [on_port(ready.command, stack.port)])
    assert outcomes[0].rc == 0 and json.loads(outcomes[0].out)["status"] == "ready"

    outcomes = run_session(stack, [on_port(submit.command, stack.port)])
    run = json.loads(outcomes[0].out)
    # The answer is the run as admitted; a worker woken at once may have claimed it already.
    assert run["status"] in ("queued", "running") and '"status":"queued"' in submit.claim
    assert UUID.match(run["id"])

    assert "<id>" in wait.command
    command = on_port(wait.command.replace("<id>", run["id"]), stack.port)
    ended = json.loads(run_session(stack, [command])[0].out)
    assert (ended["status"], ended["result"], ended["exit_code"]) == (
        "succeeded",
        {"hello": "world"},
        0,
    )
    for claim in ('"status":"succeeded"', '"result":{"hello":"world"}', '"exit_code":0'):
        assert claim in wait.claim

    banner = stack.log.read_text()
    assert f"dashboard: {stack.base}/ui/" in banner


def tour_checks(stack: Stack) -> dict[str, Callable[[Outcome, dict[str, str]], None]]:
    """For each command of the tour, what its comment claims, as a check of its outcome
    (``found``: what the session left, the variables ``id`` and ``b``)."""

    def ok(outcome: Outcome, found: dict[str, str]) -> None:
        assert outcome.rc == 0, outcome

    def tools(outcome: Outcome, found: dict[str, str]) -> None:
        ok(outcome, found)
        names = [row.split()[0] for row in outcome.out.splitlines()]
        assert names == SHIPPED_TOOLS and "MB" in outcome.out

    def submit_wait(outcome: Outcome, found: dict[str, str]) -> None:
        ok(outcome, found)
        assert json.loads(outcome.out) == {"hi": 1}
        assert outcome.err.strip().endswith("echo  succeeded exit=0")

    def submit_id(outcome: Outcome, found: dict[str, str]) -> None:
        ok(outcome, found)
        assert UUID.match(found["id"]) and found["id"] in outcome.err

    def follow(outcome: Outcome, found: dict[str, str]) -> None:
        ok(outcome, found)  # the job started; `wait $!` below has its exit code
        run = get_json(f"{stack.base}/v1/runs/{found['id']}")
        # Streamed while it ran: the line the tool printed first, if it had started.
        if run["started_at"] is not None:
            assert outcome.out.startswith("sleeping 60\n"), outcome
        assert "done" not in outcome.out

    def ls(outcome: Outcome, found: dict[str, str]) -> None:
        ok(outcome, found)
        header, top, *_ = outcome.out.splitlines()
        assert header.split() == ["ID", "TOOL", "STATUS", "REQUESTED"]
        assert top.split()[:2] == [found["id"], "sleep"]

    def cancel(outcome: Outcome, found: dict[str, str]) -> None:
        ok(outcome, found)
        assert outcome.out.startswith(f"cancel requested: {found['id']}  sleep")

    def wait(outcome: Outcome, found: dict[str, str]) -> None:
        assert outcome.rc == 4, outcome
        assert get_json(f"{stack.base}/v1/runs/{found['id']}")["status"] == "cancelled"

    def submit_report(outcome: Outcome, found: dict[str, str]) -> None:
        ok(outcome, found)
        assert UUID.match(found["b"]) and "report" in outcome.err

    def after(outcome: Outcome, found: dict[str, str]) -> None:
        ok(outcome, found)
        assert outcome.err.strip().endswith("succeeded exit=0")
        run = get_json(f"{stack.base}/v1/runs/{found['b']}")
        assert run["status"] == "succeeded"

    def artifacts(outcome: Outcome, found: dict[str, str]) -> None:
        ok(outcome, found)
        assert re.fullmatch(r"downloaded 2 files \(\d+ bytes\) into \./out\n", outcome.out)
        out = stack.cwd / "out"
        assert (out / "report.txt").read_text().startswith("report of run ")
        assert json.loads((out / "data" / "input.json").read_text()) == {"title": "tour"}

    def batch(outcome: Outcome, found: dict[str, str]) -> None:
        ok(outcome, found)
        assert UUID.match(outcome.out.strip())
        progress = outcome.err.strip().splitlines()
        assert progress[0].endswith("queued  queued 4")
        assert progress[-1].endswith("succeeded  succeeded 4")

    return {
        'export PATH="$PWD/.venv/bin:$PATH"': ok,
        "export RUNYARD_URL=http://127.0.0.1:8000": ok,
        "runyard tools": tools,
        "runyard submit echo --input '{\"hi\": 1}' --wait": submit_wait,
        "id=$(runyard submit sleep --input '{\"seconds\": 60}')": submit_id,
        'runyard logs --follow "$id" &': follow,
        "runyard ls --limit 3": ls,
        'runyard cancel "$id"': cancel,
        "wait $!": wait,
        'b=$(runyard submit report --input \'{"title": "tour"}\')': submit_report,
        'runyard submit echo --after "$b" --wait': after,
        'runyard artifacts "$b" --out ./out': artifacts,
        "runyard batch submit tools/examples/ci.json --wait": batch,
    }


@pytest.mark.timeout(400)
def test_readme_tour__every_line_does_what_its_comment_says(stack: Stack):
    lines = readme_block("A 60-second tour with the CLI")
    checks = tour_checks(stack)
    commands = [line.command for line in lines]
    # A line added, changed or dropped in the README needs its check here.
    assert commands == list(checks), commands
    outcomes = run_session(
        stack,
        [on_port(c, stack.port) for c in commands],
        'printf "%s\\n" "$id" "$b"',
        preset=False,
    )
    run_id, report_id = (stack.cwd / ".session" / "epilogue.out").read_text().split()
    found = {"id": run_id, "b": report_id}
    for command, outcome in zip(commands, outcomes, strict=True):
        checks[command](outcome, found)


def test_readme_tour__batch_file_is_the_worked_example_of_the_workflows_page():
    markdown = (ROOT / "docs" / "workflows.md").read_text(encoding="utf-8")
    shown = json.loads(
        fenced_blocks(section(markdown, "A worked example: build → test → report"), "json")[0]
    )
    shipped = json.loads(Path(ROOT / "tools" / "examples" / "ci.json").read_text())
    assert shown == shipped
