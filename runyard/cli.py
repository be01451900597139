"""The ``runyard`` console script: services, migrations, API keys and the API client.

The core does not import the services: their entry points are loaded by name when asked for.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from runyard.client import (
    EXIT_CODES,
    ClientError,
    RunyardClient,
    follow_logs,
    wait_with_progress,
)
from runyard.settings import Settings

SERVICES = {
    "api": ("api.__main__", "serve the HTTP API"),
    "worker": ("worker.__main__", "run a worker (claims, runs containers, heartbeats)"),
    "reaper": ("reaper.__main__", "run the stale-lease reaper"),
    "dev": ("api.dev", "API + worker + reaper in one process, embedded Postgres if needed"),
}


def _service_main(module: str) -> Callable[[Sequence[str]], int]:
    return cast(Callable[[Sequence[str]], int], importlib.import_module(module).main)


def _migrate(args: argparse.Namespace) -> int:
    from runyard.db import migrate

    settings = Settings()
    migrate(settings.database_url, args.revision)
    print(f"database migrated to {args.revision}")  # noqa: T201
    return 0


def _keys_create(args: argparse.Namespace) -> int:
    from runyard.auth import create_api_key
    from runyard.db import make_engine

    engine = make_engine(Settings().database_url, pool_size=1, max_overflow=0)
    try:
        key = create_api_key(engine, args.tenant, admin=args.admin, name=args.name)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    finally:
        engine.dispose()
    print(key)  # noqa: T201
    return 0


def _client(args: argparse.Namespace) -> RunyardClient:
    return RunyardClient(args.url, args.api_key)


def _emit(args: argparse.Namespace, value: Any, human: str) -> None:
    print(json.dumps(value, indent=2, default=str) if args.json else human)  # noqa: T201


def _run_line(run: dict[str, Any]) -> str:
    extra = f" exit={run['exit_code']}" if run.get("exit_code") is not None else ""
    error = f" {run['error_code']}: {run['error']}" if run.get("error_code") else ""
    return f"{run['id']}  {run['tool']}  {run['status']}{extra}{error}"


def _read_input(raw: str) -> Any:
    if raw.startswith("@"):
        raw = Path(raw[1:]).read_text(encoding="utf-8")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ClientError(f"--input is not valid JSON: {exc}") from exc


def _submit(args: argparse.Namespace) -> int:
    client = _client(args)
    run = client.submit(args.tool, _read_input(args.input))
    if not args.wait:
        _emit(args, run, f"submitted {run['id']} ({run['status']})")
        return 0
    interactive = sys.stderr.isatty() and not args.json
    run = wait_with_progress(client, run["id"], sys.stderr, interactive=interactive)
    human = _run_line(run)
    if run.get("result") is not None:
        human += "\n" + json.dumps(run["result"], indent=2)
    _emit(args, run, human)
    return EXIT_CODES.get(run["status"], 1)


def _get(args: argparse.Namespace) -> int:
    run = _client(args).get(args.run_id)
    human = _run_line(run)
    if run.get("result") is not None:
        human += "\n" + json.dumps(run["result"], indent=2)
    _emit(args, run, human)
    return 0


def _ls(args: argparse.Namespace) -> int:
    page = _client(args).runs(status=args.status, tool=args.tool, limit=args.limit)
    rows = [f"{'ID':36}  {'TOOL':12}  {'STATUS':10}  REQUESTED"]
    rows += [
        f"{r['id']:36}  {r['tool'][:12]:12}  {r['status']:10}  {r['requested_at']}"
        for r in page["items"]
    ]
    _emit(args, page, "\n".join(rows))
    return 0


def _logs(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.follow:
        status = follow_logs(client, args.run_id)
        return EXIT_CODES.get(status, 1)
    sys.stdout.write(client.logs(args.run_id, args.stream))
    return 0


def _cancel(args: argparse.Namespace) -> int:
    run = _client(args).cancel(args.run_id)
    _emit(args, run, f"cancel requested: {_run_line(run)}")
    return 0


def _tools(args: argparse.Namespace) -> int:
    tools = _client(args).tools()
    human = "\n".join(
        f"{t['name']:12}  {t['timeout_seconds']:>5}s  {t['memory_mb']:>5}MB  {t['description']}"
        for t in tools
    )
    _emit(args, tools, human)
    return 0


def _add_client_commands(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("RUNYARD_URL", "http://127.0.0.1:8000"))
    common.add_argument("--api-key", default=os.environ.get("RUNYARD_API_KEY"))
    common.add_argument("--json", action="store_true", help="machine-readable output")
    submit = sub.add_parser("submit", parents=[common], help="submit a run of a tool")
    submit.add_argument("tool")
    submit.add_argument("--input", default="{}", help="JSON, or @file with JSON")
    submit.add_argument("--wait", action="store_true", help="wait; exit code tells the outcome")
    submit.set_defaults(func=_submit)
    get = sub.add_parser("get", parents=[common], help="show a run")
    get.add_argument("run_id")
    get.set_defaults(func=_get)
    ls = sub.add_parser("ls", parents=[common], help="list runs, newest first")
    ls.add_argument("--status")
    ls.add_argument("--tool")
    ls.add_argument("--limit", type=int, default=20)
    ls.set_defaults(func=_ls)
    logs = sub.add_parser("logs", parents=[common], help="show (or --follow) a run's output")
    logs.add_argument("run_id")
    logs.add_argument("--follow", "-f", action="store_true", help="stream live until the end")
    logs.add_argument("--stream", choices=["stdout", "stderr", "both"], default="both")
    logs.set_defaults(func=_logs)
    cancel = sub.add_parser("cancel", parents=[common], help="cancel a run")
    cancel.add_argument("run_id")
    cancel.set_defaults(func=_cancel)
    tools = sub.add_parser("tools", parents=[common], help="list the registered tools")
    tools.set_defaults(func=_tools)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand that is not a service."""
    parser = argparse.ArgumentParser(prog="runyard", description="runyard tool execution platform")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in SERVICES.items():
        sub.add_parser(name, help=help_text, add_help=False)
    migrate = sub.add_parser("migrate", help="upgrade the database schema (alembic upgrade)")
    migrate.add_argument("revision", nargs="?", default="head")
    migrate.set_defaults(func=_migrate)
    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="create a key and print it once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--admin", action="store_true", help="the key sees every tenant")
    create.add_argument("--name", help="a label for the key")
    create.set_defaults(func=_keys_create)
    _add_client_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a service's ``main`` or run a management command."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in SERVICES:
        module, _ = SERVICES[args_list[0]]
        return _service_main(module)(args_list[1:])
    args = build_parser().parse_args(args_list)
    func = cast(Callable[[argparse.Namespace], int], args.func)
    try:
        return func(args)
    except ClientError as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        return 2


if __name__ == "__main__":
    sys.exit(main())
