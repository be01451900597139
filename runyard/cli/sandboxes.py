"""``runyard sandbox create|exec|cp|ls|rm``: sandboxes through the Python SDK."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from runyard.cli.common import EXIT_FAILED, EXIT_OK, UsageError, as_json, client_for, emit

# ``ID:path`` names a file of a sandbox in ``cp``.
REMOTE_PREFIX = ":"


def _create(args: argparse.Namespace) -> int:
    box = client_for(args).create_sandbox(
        args.tool,
        ttl_seconds=args.ttl,
        idle_timeout_seconds=args.idle_timeout,
        wait=not args.no_wait,
    )
    info = as_json(box.info)
    emit(args, info, info["id"])
    return EXIT_OK


def _exec(args: argparse.Namespace) -> int:
    """Stream the command's output to stdout and stderr; exit with its exit code."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("name a command after the sandbox id (runyard sandbox exec ID -- cmd)")
    stdin = sys.stdin.buffer.read() if args.stdin else b""
    box = client_for(args).sandbox(args.sandbox_id)
    code: int | None = None
    for event in box.exec_stream(command, stdin=stdin, cwd=args.cwd, timeout_seconds=args.timeout):
        if event.stream == "stdout":
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif event.stream == "stderr":
            sys.stderr.write(event.text)
            sys.stderr.flush()
        else:
            code = event.exit_code
            if event.error:
                sys.stderr.write(f"runyard: {event.error}\n")
    # A command its sandbox's end cut short has no exit code: it exits like a failure.
    return EXIT_FAILED if code is None else code


def _split(target: str) -> tuple[str, str] | None:
    """``ID:path`` as (id, path); None for a local path."""
    head, sep, rest = target.partition(REMOTE_PREFIX)
    if not sep or "/" in head or len(head) != 36:
        return None
    return head, rest


def _cp(args: argparse.Namespace) -> int:
    """Copy a local file into a sandbox (``ID:path``) or a sandbox's file out."""
    source, dest = _split(args.source), _split(args.dest)
    if (source is None) == (dest is None):
        raise UsageError("copy between a local path and ID:path (one of each)")
    client = client_for(args)
    if dest is not None:
        try:
            data = Path(args.source).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read {args.source}: {exc.strerror}") from exc
        client.sandbox(dest[0]).upload(dest[1], data)
        emit(args, {"path": dest[1], "size": len(data)}, f"{len(data)} bytes to {args.dest}")
        return EXIT_OK
    assert source is not None
    data = client.sandbox(source[0]).download(source[1])
    Path(args.dest).write_bytes(data)
    emit(args, {"path": args.dest, "size": len(data)}, f"{len(data)} bytes to {args.dest}")
    return EXIT_OK


def _ls(args: argparse.Namespace) -> int:
    found = [as_json(s) for s in client_for(args).list_sandboxes(limit=args.limit)]
    rows = [f"{'ID':36}  {'TOOL':12}  {'STATUS':8}  {'ENDED':16}  CREATED"]
    rows += [
        f"{s['id']:36}  {s['tool'][:12]:12}  {s['status']:8}  {s['end_reason'] or '':16}  "
        f"{s['created_at']}"
        for s in found
    ]
    emit(args, found, "\n".join(rows))
    return EXIT_OK


def _rm(args: argparse.Namespace) -> int:
    client = client_for(args)
    for sandbox_id in args.sandbox_ids:
        client.sandbox(sandbox_id).close()
        emit(args, {"id": sandbox_id, "deleted": True}, f"deleted {sandbox_id}")
    return EXIT_OK


def add_sandbox_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``runyard sandbox ...``: create, exec, cp, ls, rm."""
    sandbox = sub.add_parser("sandbox", help="long-lived containers: create, exec, cp, ls, rm")
    actions = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create", parents=[common], help="create a sandbox of a tool; prints its id"
    )
    create.add_argument("tool")
    create.add_argument("--ttl", type=int, help="seconds it may live (the tool's by default)")
    create.add_argument("--idle-timeout", type=int, help="seconds unused before it ends")
    create.add_argument("--no-wait", action="store_true", help="do not wait for it to run")
    create.set_defaults(func=_create)
    exec_ = actions.add_parser(
        "exec",
        parents=[common],
        help="run a command in a sandbox, streaming its output; exits with its code",
    )
    exec_.add_argument("sandbox_id")
    exec_.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    exec_.add_argument("--cwd", help="directory under the workspace")
    exec_.add_argument("--timeout", type=int, help="kill it after this many seconds")
    exec_.add_argument("--stdin", action="store_true", help="send this process's stdin")
    exec_.set_defaults(func=_exec)
    cp = actions.add_parser(
        "cp", parents=[common], help="copy a file in (LOCAL ID:PATH) or out (ID:PATH LOCAL)"
    )
    cp.add_argument("source")
    cp.add_argument("dest")
    cp.set_defaults(func=_cp)
    ls = actions.add_parser("ls", parents=[common], help="list sandboxes, newest first")
    ls.add_argument("--limit", type=int, default=50)
    ls.set_defaults(func=_ls)
    rm = actions.add_parser("rm", parents=[common], help="delete sandboxes (records stay)")
    rm.add_argument("sandbox_ids", nargs="+", metavar="sandbox_id")
    rm.set_defaults(func=_rm)
