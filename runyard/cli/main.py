"""The ``runyard`` console script: services, migrations, API keys and the API client.

The core does not import the services: their entry points are loaded by name when asked for.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import ValidationError

import runyard
from runyard.cli.builds import add_build_commands
from runyard.cli.common import (
    EXIT_API_ERROR,
    EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    OUTCOME_EXIT,
    UsageError,
    as_json,
    client_for,
    emit,
    error_exit,
    read_input,
    run_line,
    say,
)
from runyard.cli.doctor import add_doctor_command
from runyard.cli.failures import database_url_problem, describe_failure
from runyard.cli.sandboxes import add_sandbox_commands
from runyard.cli.schedules import add_schedule_commands
from runyard.cli.spinner import Spinner
from runyard.cli.usage import add_usage_commands
from runyard.cli.waiting import follow_logs, wait_for_run
from runyard.cli.workflows import add_workflow_commands
from runyard_client import Run, RunyardError

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from runyard.platform.settings import Settings

SERVICES = {
    "api": ("api.__main__", "serve the HTTP API"),
    "worker": ("worker.__main__", "run a worker (claims, runs containers, heartbeats)"),
    "reaper": ("reaper.__main__", "run the stale-lease reaper"),
    "dev": ("api.dev", "API + worker + reaper in one process, embedded Postgres if needed"),
}


def _service_main(module: str) -> Callable[[Sequence[str]], int]:
    return cast(Callable[[Sequence[str]], int], importlib.import_module(module).main)


def _database_settings() -> Settings:
    """The settings of a database command; a usage error when they name no usable database."""
    # Imported here: the commands that talk to the API need no settings class at their start.
    from runyard.platform.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        raise UsageError(f"the settings are not valid: {exc.errors()[0]['msg']}") from exc
    problem = database_url_problem(settings.database_url)
    if problem is not None:
        raise UsageError(problem)
    return settings


def _service_first(args: argparse.Namespace) -> int:
    """A service is started by its name first: ``runyard dev [its flags]``."""
    raise UsageError(f"a service takes no flags before its name: runyard {args.command} [FLAGS]")


def _completion(args: argparse.Namespace) -> int:
    """stdout: the shell's completion script, made from this very parser."""
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))  # noqa: T201
    return EXIT_OK


def _migrate(args: argparse.Namespace) -> int:
    from runyard.platform.db import migrate

    settings = _database_settings()
    # DDL on the direct URL when there is one (it bypasses a transaction pooler).
    migrate(settings.listen_database_url or settings.database_url, args.revision)
    print(f"database migrated to {args.revision}")  # noqa: T201
    return 0


@contextlib.contextmanager
def _admin_engine() -> Iterator[Engine]:
    """A one-connection engine on the configured database, disposed of at the end."""
    from runyard.platform.db import make_engine

    settings = _database_settings()
    engine = make_engine(
        settings.database_url, pool_size=1, max_overflow=0, plan=settings.connection_plan()
    )
    try:
        yield engine
    finally:
        engine.dispose()


def _keys_create(args: argparse.Namespace) -> int:
    from runyard.tenancy.auth import issue_api_key

    try:
        with _admin_engine() as engine:
            issued = issue_api_key(
                engine,
                args.tenant,
                admin=args.admin,
                name=args.name,
                max_priority=args.max_priority,
                tools=None if args.tools is None else _tool_names(args.tools),
            )
    except ValueError as exc:
        say(f"runyard: error: {exc}")
        return EXIT_USAGE
    print(issued.key)  # noqa: T201
    return 0


def _tool_names(text: str) -> list[str]:
    """``echo,report`` as a list of names."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _keys_set_tools(args: argparse.Namespace) -> int:
    """Limit a key to some tools, or let it run every tool (as ``PATCH /v1/keys/{prefix}``)."""
    from runyard.tenancy.keys import prefix_of, update_key

    prefix = prefix_of(args.key)
    if prefix is None:
        say(f"runyard: error: {args.key!r} is not a key or a key prefix")
        return EXIT_USAGE
    if (args.tools is None) == (not args.all):
        say("runyard: error: give a comma-separated list of tools, or --all")
        return EXIT_USAGE
    try:
        with _admin_engine() as engine:
            key = update_key(
                engine,
                prefix,
                tools=None if args.all else _tool_names(args.tools),
                all_tools=args.all,
            )
    except ValueError as exc:
        say(f"runyard: error: {exc}")
        return EXIT_USAGE
    if key is None:
        say(f"runyard: error: no key has the prefix {prefix}")
        return EXIT_FAILED
    allowed = "every tool" if key.tools is None else ", ".join(key.tools)
    say(f"key {key.prefix} of {key.tenant}: may run {allowed}")
    return 0


def _keys_set_priority(args: argparse.Namespace) -> int:
    """Set a key's ``max_priority`` (as ``PATCH /v1/keys/{prefix}`` does)."""
    from runyard.tenancy.keys import prefix_of, set_max_priority

    prefix = prefix_of(args.key)
    if prefix is None:
        say(f"runyard: error: {args.key!r} is not a key or a key prefix")
        return EXIT_USAGE
    with _admin_engine() as engine:
        key = set_max_priority(engine, prefix, args.max_priority)
    if key is None:
        say(f"runyard: error: no key has the prefix {prefix}")
        return EXIT_FAILED
    say(f"key {key.prefix} of {key.tenant}: max_priority {key.max_priority}")
    return 0


def _keys_ls(args: argparse.Namespace) -> int:
    from runyard.tenancy.keys import list_keys

    with _admin_engine() as engine:
        keys = list_keys(engine, tenant=args.tenant, include_revoked=args.all, limit=args.limit)
    rows = [
        f"{'PREFIX':12}  {'TENANT':16}  {'SCOPES':8}  {'MAX PRIO':8}  {'CREATED':25}  "
        f"{'LAST USED':25}  NAME (TOOLS)"
    ]
    for key in keys:
        last = key.last_used_at.isoformat(timespec="seconds") if key.last_used_at else "never"
        revoked = f"  (revoked {key.revoked_at:%Y-%m-%d %H:%M})" if key.revoked_at else ""
        ceiling = "any" if "admin" in key.scopes else str(key.max_priority)
        tools = "" if key.tools is None else f" ({','.join(key.tools)})"
        rows.append(
            f"{key.prefix:12}  {key.tenant[:16]:16}  {','.join(key.scopes) or '-':8}  "
            f"{ceiling:8}  {key.created_at.isoformat(timespec='seconds'):25}  {last:25}  "
            f"{key.name or ''}{tools}{revoked}"
        )
    value = [dataclasses.asdict(key) for key in keys]
    emit(args, value, "\n".join(rows))
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    from runyard.tenancy.keys import prefix_of, revoke_key

    prefix = prefix_of(args.key)
    if prefix is None:
        raise UsageError(f"not a key or key prefix: {args.key!r}")
    with _admin_engine() as engine:
        revoked = revoke_key(engine, prefix)
    if revoked is None:
        say(f"runyard: error: there is no key {prefix}")
        return EXIT_FAILED
    say(f"key {prefix} revoked at {revoked.isoformat(timespec='seconds')}")
    return 0


def _workflow_fields(args: argparse.Namespace) -> dict[str, Any]:
    """``depends_on`` from ``--after``, ``run_at`` from ``--at`` (local time if no offset)."""
    fields: dict[str, Any] = {"depends_on": list(args.after or ()), "run_at": None}
    if args.at:
        try:
            at = datetime.fromisoformat(args.at)
        except ValueError as exc:
            raise UsageError(f"--at is not an RFC 3339 time: {args.at!r}") from exc
        fields["run_at"] = at if at.tzinfo else at.astimezone()
    return fields


def _submit(args: argparse.Namespace) -> int:
    """Without --wait, stdout is the run id; with it, the result (--json: the run)."""
    value = read_input(args.input)
    fields = _workflow_fields(args) | {
        "callback_url": args.callback_url,
        "concurrency_key": args.concurrency_key,
    }
    client = client_for(args)
    if not args.wait:
        submitted = client.submit(args.tool, value, idempotency_key=args.idempotency_key, **fields)
        run = as_json(submitted)
        say(run_line(run))
        emit(args, run, str(run["id"]))
        return EXIT_OK
    key = args.idempotency_key or f"cli-{uuid.uuid4()}"
    spinner = Spinner(sys.stderr, enabled=sys.stderr.isatty() and not args.json)
    seen: list[str] = []

    def on_update(update: Run) -> None:
        seen.append(str(update.id))
        spinner.update(update.status.value)

    try:
        with spinner:
            run = as_json(
                wait_for_run(client, args.tool, value, key, on_update=on_update, **fields)
            )
    except KeyboardInterrupt:
        if seen:
            say(f"interrupted while waiting for run {seen[0]} (runyard get {seen[0]})")
        raise
    say(run_line(run))
    if args.json:
        emit(args, run, "")
    elif run.get("result") is not None:
        print(json.dumps(run["result"], indent=2))  # noqa: T201
    return OUTCOME_EXIT.get(run["status"], EXIT_FAILED)


def _get(args: argparse.Namespace) -> int:
    run = as_json(client_for(args).get(args.run_id))
    human = run_line(run)
    if run.get("trace_id"):
        human += f"\ntrace {run['trace_id']}"
    if run.get("result") is not None:
        human += "\n" + json.dumps(run["result"], indent=2)
    emit(args, run, human)
    return 0


def _ls(args: argparse.Namespace) -> int:
    page = as_json(client_for(args).list_page(status=args.status, tool=args.tool, limit=args.limit))
    rows = [f"{'ID':36}  {'TOOL':12}  {'STATUS':10}  REQUESTED"]
    rows += [
        f"{r['id']:36}  {r['tool'][:12]:12}  {r['status']:10}  {r['requested_at']}"
        for r in page["items"]
    ]
    emit(args, page, "\n".join(rows))
    return 0


def _logs(args: argparse.Namespace) -> int:
    client = client_for(args)
    if args.follow:
        status, skipped = follow_logs(client, args.run_id, sys.stdout, sys.stderr)
        if skipped:
            say(f"note: skipped {skipped} malformed events")
        return OUTCOME_EXIT.get(status, EXIT_FAILED)
    sys.stdout.write(client.log_text(args.run_id, stream=args.stream))
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    run = as_json(client_for(args).cancel(args.run_id))
    emit(args, run, f"cancel requested: {run_line(run)}")
    return 0


def _rm(args: argparse.Namespace) -> int:
    client = client_for(args)
    for run_id in args.run_ids:
        client.delete(run_id)
        emit(args, {"id": run_id, "deleted": True}, f"deleted {run_id}")
    return 0


def _artifacts(args: argparse.Namespace) -> int:
    """Without --out, the list; with it, every file downloaded into DIR."""
    client = client_for(args)
    listing = as_json(client.artifact_list(args.run_id))
    if args.out is None:
        rows = [f"{a['size']:>12}  {a['sha256'][:12]}  {a['path']}" for a in listing["artifacts"]]
        emit(args, listing, "\n".join(rows) if rows else "(no artifacts)")
        return EXIT_OK
    client.download_all(args.run_id, Path(args.out))
    files = listing["artifacts"]
    total = sum(int(a["size"]) for a in files)
    emit(args, files, f"downloaded {len(files)} files ({total} bytes) into {args.out}")
    return EXIT_OK


def _webhook_set(args: argparse.Namespace) -> int:
    """stdout: the tenant's settings; the new secret, when one was made, is shown this once."""
    settings = as_json(
        client_for(args).set_tenant_webhook(
            args.tenant,
            args.webhook_url,
            rotate_secret=args.rotate_secret,
            events=None if args.events is None else _event_list(args.events),
            deadline_lead_seconds=args.deadline_lead,
        )
    )
    human = (
        f"tenant {settings['tenant']}: default webhook {settings['url'] or '(none)'}"
        f"\nevents: {', '.join(settings['events'])}"
        f" (deadline notice {settings['deadline_lead_seconds']} s before)"
    )
    if settings.get("secret"):
        human += f"\nsigning secret (shown once, keep it): {settings['secret']}"
    emit(args, settings, human)
    return 0


def _event_list(text: str) -> list[str]:
    """``run.started,run.completed`` as a list; an unknown name is a usage error."""
    from runyard.domain.webhook_events import WEBHOOK_EVENTS

    events = [e.strip() for e in text.split(",") if e.strip()]
    unknown = [e for e in events if e not in WEBHOOK_EVENTS]
    if unknown or not events:
        raise UsageError(
            f"--events takes a comma-separated list of {', '.join(WEBHOOK_EVENTS)}"
            + (f" (not {', '.join(unknown)})" if unknown else "")
        )
    return events


def _webhook_verify(args: argparse.Namespace) -> int:
    """Check a received delivery's signature with the Standard Webhooks library."""
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    if not args.secret:
        raise UsageError("give the tenant's secret: --secret or RUNYARD_WEBHOOK_SECRET")
    try:
        body = sys.stdin.buffer.read() if args.body == "-" else Path(args.body).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read the body: {exc}") from exc
    headers = {
        "webhook-id": args.id,
        "webhook-timestamp": args.timestamp,
        "webhook-signature": args.signature,
    }
    try:
        Webhook(args.secret).verify(body, headers)
    except WebhookVerificationError as exc:
        say(f"signature NOT valid: {exc}")
        return EXIT_FAILED
    except ValueError as exc:
        raise UsageError(f"cannot verify: {exc}") from exc
    say("signature valid")
    return EXIT_OK


def _add_webhook_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    webhook = sub.add_parser("webhook", help="tenant webhooks: set the default, verify one")
    actions = webhook.add_subparsers(dest="webhook_command", required=True, metavar="ACTION")
    set_ = actions.add_parser(
        "set",
        parents=[common],
        help="set a tenant's default webhook URL (admin key); prints a new secret once",
    )
    set_.add_argument("tenant")
    set_.add_argument(
        "webhook_url",
        nargs="?",
        metavar="URL",
        help="the default for runs without a callback_url (omit: no default)",
    )
    set_.add_argument("--rotate-secret", action="store_true", help="make a new signing secret")
    set_.add_argument(
        "--events",
        metavar="LIST",
        help="the events it receives, comma-separated: run.started, run.deadline_approaching, "
        "run.completed, sandbox.ended (omit: keep them)",
    )
    set_.add_argument(
        "--deadline-lead",
        type=int,
        metavar="SECONDS",
        help="send run.deadline_approaching this long before an attempt's deadline (omit: keep)",
    )
    set_.set_defaults(func=_webhook_set)
    verify = actions.add_parser(
        "verify",
        help="check a delivery's signature (exit 0: valid, 1: not)",
        description="Verify a received delivery: its body (a file, or - for stdin) and its "
        "webhook-id, webhook-timestamp and webhook-signature headers, with the tenant's "
        "secret (or RUNYARD_WEBHOOK_SECRET). The timestamp must be within 5 minutes.",
    )
    verify.add_argument("body", help="file with the body exactly as received, or -")
    verify.add_argument("--id", required=True, help="the webhook-id header")
    verify.add_argument("--timestamp", required=True, help="the webhook-timestamp header")
    verify.add_argument("--signature", required=True, help="the webhook-signature header")
    verify.add_argument("--secret", default=os.environ.get("RUNYARD_WEBHOOK_SECRET"))
    verify.set_defaults(func=_webhook_verify)


def _tools(args: argparse.Namespace) -> int:
    tools = [as_json(tool) for tool in client_for(args).tools()]
    human = "\n".join(
        f"{t['name']:12}  {t['timeout_seconds']:>5}s  {t['memory_mb']:>5}MB  {t['description']}"
        for t in tools
    )
    emit(args, tools, human)
    return 0


def add_global_flags(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """``--url``, ``--api-key`` and ``--json``: on the top parser (``suppress=False``: with
    their defaults) and again on each subcommand (``suppress=True``: no default, so a flag given
    before the subcommand is not overwritten by the subcommand's default)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--url",
        default=default(None),
        help="the API (default: RUNYARD_URL, else http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--api-key", default=default(None), help="the API key (default: RUNYARD_API_KEY)"
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="machine-readable output"
    )


def _add_client_commands(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    add_global_flags(common, suppress=True)
    submit = sub.add_parser(
        "submit",
        parents=[common],
        help="submit a run of a tool",
        description="Submit a run. stdout: the run id; with --wait, the run's result "
        "(JSON, nothing if it has none); with --json, the run. The run's status goes to stderr.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    submit.add_argument("tool")
    submit.add_argument("--input", default="{}", help="JSON, or @file with JSON")
    submit.add_argument(
        "--wait",
        action="store_true",
        help="wait for the end (long-polls the API); the exit code tells the outcome",
    )
    submit.add_argument(
        "--idempotency-key",
        help="retries with the same key and input return the first run (default with --wait: "
        "a fresh key)",
    )
    submit.add_argument(
        "--callback-url", help="http(s) URL that gets the run, signed, when it ends"
    )
    submit.add_argument(
        "--after",
        action="append",
        metavar="RUN_ID",
        help="start only once this run has succeeded (repeatable; queue mode)",
    )
    submit.add_argument(
        "--at", metavar="TIME", help="not before this RFC 3339 time, e.g. 2026-12-01T09:00:00Z"
    )
    submit.add_argument("--concurrency-key", metavar="KEY", help="the run's flow-control key")
    submit.set_defaults(func=_submit)
    get = sub.add_parser("get", parents=[common], help="show a run")
    get.add_argument("run_id")
    get.set_defaults(func=_get)
    ls = sub.add_parser("ls", parents=[common], help="list runs, newest first")
    ls.add_argument("--status")
    ls.add_argument("--tool")
    ls.add_argument("--limit", type=int, default=20)
    ls.set_defaults(func=_ls)
    logs = sub.add_parser(
        "logs",
        parents=[common],
        help="show (or --follow) a run's output",
        description="Print a run's stdout and stderr. With --follow, stream them live until "
        "the run ends; the exit code then tells the outcome.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    logs.add_argument("run_id")
    logs.add_argument("--follow", "-f", action="store_true", help="stream live until the end")
    logs.add_argument("--stream", choices=["stdout", "stderr", "both"], default="both")
    logs.set_defaults(func=_logs)
    cancel = sub.add_parser("cancel", parents=[common], help="cancel a run")
    cancel.add_argument("run_id")
    cancel.set_defaults(func=_cancel)
    tools = sub.add_parser("tools", parents=[common], help="list the registered tools")
    tools.set_defaults(func=_tools)
    rm = sub.add_parser(
        "rm", parents=[common], help="delete terminal runs with their events and deliveries"
    )
    rm.add_argument("run_ids", nargs="+", metavar="run_id")
    rm.set_defaults(func=_rm)
    artifacts = sub.add_parser(
        "artifacts",
        parents=[common],
        help="list a finished run's artifacts, or download them all (--out DIR)",
    )
    artifacts.add_argument("run_id")
    artifacts.add_argument(
        "--out", metavar="DIR", help="download every artifact into DIR, keeping subdirectories"
    )
    artifacts.set_defaults(func=_artifacts)
    _add_webhook_commands(sub, common)
    add_workflow_commands(sub, common)
    add_build_commands(sub, common)
    add_schedule_commands(sub, common)
    add_sandbox_commands(sub, common)
    add_usage_commands(sub, common)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand that is not a service."""
    parser = argparse.ArgumentParser(
        prog="runyard",
        description="runyard tool execution platform",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"runyard {package_version()}")
    add_global_flags(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in SERVICES.items():
        service = sub.add_parser(name, help=help_text, add_help=False)
        service.set_defaults(func=_service_first)
    migrate = sub.add_parser("migrate", help="upgrade the database schema (alembic upgrade)")
    migrate.add_argument("revision", nargs="?", default="head")
    migrate.set_defaults(func=_migrate)
    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="create a key and print it once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--admin", action="store_true", help="the key sees every tenant")
    create.add_argument("--name", help="a label for the key")
    create.add_argument(
        "--max-priority",
        type=int,
        default=0,
        help="the highest run priority the key may ask for (default 0; admin keys: any)",
    )
    create.add_argument(
        "--tools",
        metavar="LIST",
        help="the only tools the key may run, list and schedule, comma-separated "
        "(default: every tool)",
    )
    create.set_defaults(func=_keys_create)
    set_tools = keys_sub.add_parser("set-tools", help="limit a key to some tools, or lift it")
    set_tools.add_argument("key", help="the key's prefix, as `keys ls` shows it")
    set_tools.add_argument("tools", nargs="?", help="comma-separated tool names")
    set_tools.add_argument("--all", action="store_true", help="let the key run every tool")
    set_tools.set_defaults(func=_keys_set_tools)
    set_priority = keys_sub.add_parser(
        "set-priority", help="set the highest run priority a key may ask for"
    )
    set_priority.add_argument("key", help="the key's prefix, as `keys ls` shows it")
    set_priority.add_argument("max_priority", type=int)
    set_priority.set_defaults(func=_keys_set_priority)
    ls = keys_sub.add_parser(
        "ls", help="list keys (prefix, tenant, scopes, created, last used), never a secret"
    )
    ls.add_argument("--tenant", help="only this tenant's keys")
    ls.add_argument("--all", action="store_true", help="revoked keys too")
    ls.add_argument("--limit", type=int, default=200)
    ls.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    ls.set_defaults(func=_keys_ls)
    revoke = keys_sub.add_parser(
        "revoke",
        help="revoke a key by its prefix (or the whole key); API processes refuse it "
        "within the auth cache time (5 s)",
    )
    revoke.add_argument("key", help="the key's prefix, as `keys ls` shows it")
    revoke.set_defaults(func=_keys_revoke)
    _add_client_commands(sub)
    add_doctor_command(sub)
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh or fish)",
        description="Print the completion script of a shell. bash: "
        'eval "$(runyard completion bash)" in ~/.bashrc; zsh: runyard completion zsh > '
        '"${fpath[1]}/_runyard"; fish: runyard completion fish > '
        "~/.config/fish/completions/runyard.fish",
    )
    completion.add_argument("shell", choices=["bash", "zsh", "fish"])
    completion.set_defaults(func=_completion)
    return parser


def package_version() -> str:
    """The installed distribution's version (the source tree's when it is not installed)."""
    try:
        return metadata.version("runyard")
    except metadata.PackageNotFoundError:
        return runyard.__version__


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a service's ``main`` or run a management command; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list and args_list[0] in SERVICES:
            module, _ = SERVICES[args_list[0]]
            return _service_main(module)(args_list[1:])
        args = build_parser().parse_args(args_list)
        func = cast(Callable[[argparse.Namespace], int], args.func)
        return func(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except UsageError as exc:
        say(f"runyard: error: {exc}")
        return EXIT_USAGE
    except RunyardError as exc:
        say(f"error: {exc}")
        return error_exit(exc)
    except ValidationError as exc:
        say(f"error: the API's answer is not what this client reads: {exc}")
        return EXIT_API_ERROR
    except Exception as exc:
        if os.environ.get("RUNYARD_DEBUG"):
            raise
        line, code = describe_failure(exc)
        say(line)
        return code


if __name__ == "__main__":
    sys.exit(main())
