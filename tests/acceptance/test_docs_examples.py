"""The worked example of docs/workflows.md and the runnable example of docs/tools.md, taken
from the pages and run against ``runyard dev`` on the shipped tools."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.acceptance.docs_runner import (
    ROOT,
    Stack,
    dev_stack,
    fenced_blocks,
    get_json,
    run_session,
    section,
    shell_lines,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]
WORKED_EXAMPLE = "A worked example: build → test → report"
# In the pages an id is shortened to its start and "…".
SHORT_ID = re.compile(r"[0-9a-f][0-9a-f-]*…")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with dev_stack() as started:
        yield started


def transcript(block: str) -> list[tuple[str, list[str]]]:
    """A ``$ command`` block: each command (trailing comment dropped) and the lines shown
    after it."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((re.split(r"\s{2,}#\s", line[2:])[0].strip(), []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def shown_as(actual: str, shown: str) -> bool:
    """Whether an output line is the one the page shows: an id shortened to ``abcd…`` stands
    for any id; a JSON object is compared by its values (the page's keys are shortened ids)."""
    if shown.startswith("{"):
        count = iter(range(1000))
        expected = json.loads(SHORT_ID.sub(lambda _: f"id{next(count)}", shown))
        return sorted(map(json.dumps, json.loads(actual).values())) == sorted(
            map(json.dumps, expected.values())
        )
    pattern = "[0-9a-f-]+".join(map(re.escape, SHORT_ID.split(shown)))
    return re.fullmatch(pattern, actual) is not None


def workflows_page() -> str:
    return section((ROOT / "docs" / "workflows.md").read_text(encoding="utf-8"), WORKED_EXAMPLE)


def test_workflows_worked_example__runs_as_shown(stack: Stack):
    steps = [step for block in fenced_blocks(workflows_page(), "") for step in transcript(block)]
    commands = [command for command, _ in steps]
    assert commands == [
        "runyard batch submit tools/examples/ci.json --wait",
        "echo $?",
        "runyard batch get 5b0c…",
        "runyard artifacts 7c41… --out ./report && cat ./report/report.txt",
        "runyard batch retry 5b0c…",
    ], commands
    submit, echo, get, artifacts, _ = steps

    done = run_session(stack, [submit[0]])[0]
    progress = done.err.strip().splitlines()
    assert shown_as(progress[0], submit[1][0]) and shown_as(progress[-1], submit[1][-2])
    assert done.rc == int(echo[1][0]) == 0
    batch_id = done.out.strip()
    assert shown_as(batch_id, submit[1][-1])

    done = run_session(stack, [get[0].replace("5b0c…", batch_id)])[0]
    assert done.rc == 0
    assert len(done.out.splitlines()) == len(get[1])
    for actual, shown in zip(done.out.splitlines(), get[1], strict=True):
        assert shown_as(actual, shown), (actual, shown)

    batch = get_json(f"{stack.base}/v1/batches/{batch_id}")
    refs = {run["ref"]: run["run_id"] for run in batch["runs"]}  # type: ignore[attr-defined]
    done = run_session(stack, [artifacts[0].replace("7c41…", refs["report"])])[0]
    assert done.rc == 0
    for actual, shown in zip(done.out.splitlines(), artifacts[1], strict=True):
        assert shown_as(actual, shown), (actual, shown)


def test_workflows_worked_example__a_failed_build_fails_the_rest_and_retry_runs_all(
    stack: Stack,
):
    page = workflows_page()
    retry = transcript(fenced_blocks(page, "")[-1])[0][0]
    assert retry == "runyard batch retry 5b0c…"
    assert "`test`'s error reading `dependency 9d1e… (ref build) ended failed (tool_failed)`" in (
        " ".join(page.split())
    )
    body = json.loads(fenced_blocks(page, "json")[0])
    body["runs"][0]["tool"] = "fail"  # the build breaks
    (stack.cwd / "broken.json").write_text(json.dumps(body))
    done = run_session(stack, ["runyard batch submit broken.json --wait"])[0]
    assert done.rc == 1, done
    batch_id = done.out.strip()
    runs = {r["ref"]: r for r in get_json(f"{stack.base}/v1/batches/{batch_id}")["runs"]}  # type: ignore[attr-defined]
    assert runs["build"]["error_code"] == "tool_failed"
    for ref in ("test", "lint", "report"):
        assert runs[ref]["error_code"] == "dependency_failed"
    test_run = get_json(f"{stack.base}/v1/runs/{runs['test']['run_id']}")
    assert re.fullmatch(
        r"dependency [0-9a-f-]{36} \(ref build\) ended failed \(tool_failed\)",
        str(test_run["error"]),
    ), test_run["error"]

    done = run_session(stack, [retry.replace("5b0c…", batch_id)])[0]
    assert done.rc == 0, done
    again = {r["ref"]: r for r in get_json(f"{stack.base}/v1/batches/{batch_id}")["runs"]}  # type: ignore[attr-defined]
    # build, test, lint and report were submitted again, each a re-run of the first.
    for ref, run in again.items():
        assert run["rerun_of"] == runs[ref]["run_id"], (ref, run)


def test_tools_report_example__leaves_the_two_artifacts_it_names(stack: Stack):
    markdown = (ROOT / "docs" / "tools.md").read_text(encoding="utf-8")
    block = next(b for b in fenced_blocks(markdown, "sh") if "runyard submit report" in b)
    lines = shell_lines(block)
    outcomes = run_session(stack, [line.command for line in lines])
    submitted, follow, artifacts = outcomes
    assert submitted.rc == 0 and submitted.out == ""
    assert "wrote report.txt and data/input.json" in lines[1].claim
    assert follow.rc == 0 and follow.out == "wrote report.txt and data/input.json\n"
    assert artifacts.rc == 0
    assert re.fullmatch(r"downloaded 2 files \(\d+ bytes\) into \./report\n", artifacts.out)
    assert "downloaded 2 files" in lines[2].claim
    assert (stack.cwd / "report" / "report.txt").read_text().startswith("report of run ")
    assert json.loads((stack.cwd / "report" / "data" / "input.json").read_text()) == {
        "title": "nightly"
    }
