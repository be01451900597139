"""Workflow commands of the ``runyard`` console script: batches, re-runs, event downloads.

``runyard submit --after/--at`` lives with ``submit``; these add ``batch``, ``rerun`` and
``events``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from pydantic import ValidationError

from runyard.cli.common import (
    EXIT_CODES_HELP,
    EXIT_FAILED,
    OUTCOME_EXIT,
    UsageError,
    as_json,
    client_for,
    emit,
    read_input,
    run_line,
    say,
)
from runyard_client import Runyard

ACTIVE_BATCH = ("queued", "running")
# What a batch file may hold besides its runs.
BATCH_FIELDS = ("runs", "callback_url")
POLL_SECONDS = 1.0
STATUS_ORDER = ("queued", "running", "succeeded", "failed", "timed_out", "cancelled")


def progress_line(batch: dict[str, Any]) -> str:
    """``batch <id>  running  queued 3  running 2  succeeded 10``: a count per status."""
    counts = batch.get("counts") or {}
    parts = [f"{status} {counts[status]}" for status in STATUS_ORDER if counts.get(status)]
    return f"batch {batch['id']}  {batch['status']}  " + "  ".join(parts)


def wait_for_batch(
    client: Runyard, batch: dict[str, Any], poll_seconds: float = POLL_SECONDS
) -> dict[str, Any]:
    """Poll the batch until no run of it is queued or running, printing its progress line
    (on a terminal, in place) whenever it changes; the final batch."""
    live = sys.stderr.isatty()
    shown = ""
    while True:
        line = progress_line(batch)
        if line != shown:
            sys.stderr.write(("\r\033[K" if live else "") + line + ("" if live else "\n"))
            sys.stderr.flush()
            shown = line
        if batch["status"] not in ACTIVE_BATCH:
            if live:
                sys.stderr.write("\n")
            return batch
        time.sleep(poll_seconds)
        batch = as_json(client.get_batch(str(batch["id"])))


def _batch_exit(batch: dict[str, Any]) -> int:
    return OUTCOME_EXIT.get(str(batch["status"]), EXIT_FAILED)


def _batch_submit(args: argparse.Namespace) -> int:
    """stdout: the batch id (--json: the batch with its run ids); --wait: the exit code is
    the batch's outcome."""
    source = args.file if args.file == "-" else "@" + args.file
    body = read_input(source, "the batch file")
    if isinstance(body, list):
        body = {"runs": body}
    if not isinstance(body, dict) or not isinstance(body.get("runs"), list):
        raise UsageError('the batch file holds no list of runs ({"runs": [...]} or the list)')
    unknown = sorted(set(body) - set(BATCH_FIELDS))
    if unknown:
        raise UsageError(f"the batch file has fields a batch does not: {', '.join(unknown)}")
    client = client_for(args)
    try:
        submitted = client.submit_batch(
            body["runs"],
            callback_url=body.get("callback_url"),
            idempotency_key=args.idempotency_key,
        )
    except ValidationError as exc:
        raise UsageError(f"the batch file's runs are not runs of a batch: {exc}") from exc
    batch = as_json(submitted)
    refs = batch.get("run_ids", {})
    if args.wait:
        batch = {**wait_for_batch(client, batch), "run_ids": refs}
    emit(args, batch, str(batch["id"]))
    return _batch_exit(batch) if args.wait else 0


def _batch_show(args: argparse.Namespace) -> int:
    batch = as_json(client_for(args).get_batch(args.batch_id))
    rows = [progress_line(batch)]
    rows += [f"  {run['ref']:20}  {run['run_id']}  {run['status']}" for run in batch["runs"]]
    emit(args, batch, "\n".join(rows))
    return 0


def _batch_act(args: argparse.Namespace) -> int:
    client = client_for(args)
    act = client.cancel_batch if args.action == "cancel" else client.retry_batch
    batch = as_json(act(args.batch_id))
    emit(args, batch, progress_line(batch))
    return 0


def _rerun(args: argparse.Namespace) -> int:
    run = as_json(client_for(args).rerun(args.run_id))
    say(run_line(run))
    emit(args, run, str(run["id"]))
    return 0


def _events(args: argparse.Namespace) -> int:
    """The run's whole event log so far: NDJSON with --ndjson, else a line per event."""
    for line in client_for(args).events_ndjson(args.run_id):
        if args.ndjson:
            print(line)  # noqa: T201
            continue
        event = json.loads(line)
        print(f"{event['at']}  {event['type']:16}  {json.dumps(event['data'])}")  # noqa: T201
    return 0


def add_workflow_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``batch``, ``rerun`` and ``events``."""
    batch = sub.add_parser("batch", help="batches: submit (and --wait), get, cancel, retry")
    actions = batch.add_subparsers(dest="action", required=True)
    submit = actions.add_parser(
        "submit",
        parents=[common],
        help="submit a batch from a JSON file",
        description='Submit runs as one graph. FILE holds {"runs": [...]} (or the list '
        "itself); - reads stdin. stdout: the batch id. With --wait, a progress line per "
        "status until every run has ended; the exit code is the batch's outcome.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    submit.add_argument("file")
    submit.add_argument("--wait", action="store_true", help="wait until every run has ended")
    submit.add_argument("--idempotency-key", help="a retry with the same key gets the same batch")
    submit.set_defaults(func=_batch_submit)
    get = actions.add_parser("get", parents=[common], help="show a batch and its runs")
    get.add_argument("batch_id")
    get.set_defaults(func=_batch_show)
    for action, text in (
        ("cancel", "cancel every run of a batch that has not ended"),
        ("retry", "run again every run of a finished batch that did not succeed"),
    ):
        parser = actions.add_parser(action, parents=[common], help=text)
        parser.add_argument("batch_id")
        parser.set_defaults(func=_batch_act, action=action)
    rerun = sub.add_parser(
        "rerun", parents=[common], help="submit the same tool and input as a new run"
    )
    rerun.add_argument("run_id")
    rerun.set_defaults(func=_rerun)
    events = sub.add_parser("events", parents=[common], help="print a run's whole event log")
    events.add_argument("run_id")
    events.add_argument("--ndjson", action="store_true", help="one JSON event a line")
    events.set_defaults(func=_events)
