"""What every client command of the ``runyard`` console script shares: exit codes, the
client (the Python SDK's), and how it prints."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from runyard_client import Runyard, RunyardError, UnavailableError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMED_OUT = 3
EXIT_CANCELLED = 4
EXIT_API_ERROR = 5
EXIT_UNREACHABLE = 6
EXIT_INTERRUPTED = 130
OUTCOME_EXIT = {
    "succeeded": EXIT_OK,
    "failed": EXIT_FAILED,
    "timed_out": EXIT_TIMED_OUT,
    "cancelled": EXIT_CANCELLED,
}
EXIT_CODES_HELP = f"""\
exit codes:
  {EXIT_OK}    success; with --wait or logs --follow: the run succeeded
  {EXIT_FAILED}    the run failed
  {EXIT_USAGE}    usage error (bad arguments, --input that is not JSON)
  {EXIT_TIMED_OUT}    the run timed out
  {EXIT_CANCELLED}    the run was cancelled
  {EXIT_API_ERROR}    the API answered with an error (HTTP 4xx/5xx: unknown run, bad key, ...)
  {EXIT_UNREACHABLE}    the API could not be reached (connection refused, reset, timed out)
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C)
"""


class UsageError(Exception):
    """An argument the parser accepted but the command cannot use."""


def client_for(args: argparse.Namespace) -> Runyard:
    """The API client: ``--url`` and ``--api-key``, else ``RUNYARD_URL`` and
    ``RUNYARD_API_KEY`` (the SDK's configuration)."""
    return Runyard.from_env(url=args.url, api_key=args.api_key)


def as_json(model: BaseModel) -> dict[str, Any]:
    """What the API sent for ``model``: its fields, in the API's order, as JSON values
    (fields the answer did not carry are left out)."""
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True)


def error_exit(error: RunyardError) -> int:
    """The exit code of a failed request: no answer at all, or an error of the API (or an
    answer the client refused)."""
    unreachable = isinstance(error, UnavailableError) and error.status is None
    return EXIT_UNREACHABLE if unreachable else EXIT_API_ERROR


def emit(args: argparse.Namespace, value: Any, human: str) -> None:
    """stdout: ``value`` as JSON with ``--json``, else the human text."""
    print(json.dumps(value, indent=2, default=str) if args.json else human)  # noqa: T201


def say(text: str) -> None:
    """A status line on stderr."""
    print(text, file=sys.stderr, flush=True)  # noqa: T201


def run_line(run: dict[str, Any]) -> str:
    """One run on one line: id, tool, status, exit code and error."""
    extra = f" exit={run['exit_code']}" if run.get("exit_code") is not None else ""
    error = f" {run['error_code']}" if run.get("error_code") else ""
    error += f": {run['error']}" if error and run.get("error") else ""
    return f"{run['id']}  {run['tool']}  {run['status']}{extra}{error}"


def read_input(raw: str, what: str = "--input") -> Any:
    """JSON given inline, or ``@file`` (``-`` or ``@-``: stdin)."""
    if raw in ("-", "@-"):
        raw = sys.stdin.read()
    elif raw.startswith("@"):
        try:
            raw = Path(raw[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {what}: {exc}") from exc
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from exc
