"""Build commands of the ``runyard`` console script: ``build`` and ``builds``."""

from __future__ import annotations

import argparse
import time
from typing import Any

from runyard.cli.common import EXIT_FAILED, EXIT_OK, as_json, client_for, emit, say
from runyard_client import Runyard

POLL_SECONDS = 1.0
OPEN = ("queued", "building")


def engines_line(tool: str, build: dict[str, Any]) -> str:
    """``numstats  runyard-build/numstats:…  engine-a ready  engine-b building``."""
    engines = build.get("engines") or {}
    parts = [f"{engine} {status}" for engine, status in sorted(engines.items())]
    return f"{tool}  {build.get('tag', '')}  " + ("  ".join(parts) or "(no build yet)")


def tool_build(client: Runyard, tool: str) -> dict[str, Any]:
    """The tool's current build as ``GET /v1/tools`` shows it."""
    for item in client.tools():
        if item.name == tool:
            return as_json(item.build) if item.build is not None else {}
    return {}


def wait_for_build(
    client: Runyard, tool: str, timeout: float, poll_seconds: float = POLL_SECONDS
) -> dict[str, Any]:
    """Poll until no engine's build of the tool's digest is queued or building."""
    deadline = time.monotonic() + timeout
    shown = ""
    while True:
        build = tool_build(client, tool)
        line = engines_line(tool, build)
        if line != shown:
            say(line)
            shown = line
        statuses = set((build.get("engines") or {}).values())
        if not statuses & set(OPEN) or time.monotonic() >= deadline:
            return build
        time.sleep(poll_seconds)


def _build(args: argparse.Namespace) -> int:
    client = client_for(args)
    asked = as_json(client.build_tool(args.tool, force=args.force))
    if not args.wait:
        emit(args, asked, f"{asked['tag']}: {asked['queued']} build(s) queued")
        return EXIT_OK
    if asked["queued"] == 0:
        say(f"{asked['tag']}: nothing queued (no live worker of its queue, or built already)")
    build = wait_for_build(client, args.tool, args.timeout)
    statuses = set((build.get("engines") or {}).values())
    emit(args, build, engines_line(args.tool, build))
    return EXIT_OK if statuses and statuses == {"ready"} else EXIT_FAILED


def _builds(args: argparse.Namespace) -> int:
    client = client_for(args)
    if args.build_id:
        build = as_json(client.get_build(args.build_id))
        human = (
            f"{build['id']}  {build['tag']}  {build['engine_id']}  {build['status']}"
            f"  attempts {build['attempts']}\n{build.get('log') or ''}"
        )
        if build.get("error"):
            human += f"\nerror: {build['error']}"
        emit(args, build, human)
        return EXIT_OK
    builds = [
        as_json(b) for b in client.list_builds(tool=args.tool, status=args.status, limit=args.limit)
    ]
    rows = [f"{'ID':36}  {'TOOL':14}  {'DIGEST':12}  {'ENGINE':20}  {'STATUS':8}  CREATED"]
    rows += [
        f"{b['id']:36}  {b['tool'][:14]:14}  {b['digest'][:12]}  {b['engine_id'][:20]:20}  "
        f"{b['status']:8}  {b['created_at']}"
        for b in builds
    ]
    emit(args, builds, "\n".join(rows))
    return EXIT_OK


def add_build_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``runyard build TOOL [--wait] [--force]`` and ``runyard builds [BUILD_ID]``."""
    build = sub.add_parser(
        "build",
        parents=[common],
        help="build a tool built from source ahead of runs, or again after a failure (admin)",
        description="Queue the build of the tool's current source on every engine with a live "
        "worker of its queue. With --wait, wait until none is queued or building; exit 0 when "
        "every engine has it ready, 1 otherwise.",
    )
    build.add_argument("tool")
    build.add_argument("--wait", action="store_true", help="wait for the builds to end")
    build.add_argument("--force", action="store_true", help="build again where it is ready")
    build.add_argument("--timeout", type=float, default=900.0, help="--wait at most this long")
    build.set_defaults(func=_build)
    builds = sub.add_parser(
        "builds", parents=[common], help="list builds, newest first, or show one with its log"
    )
    builds.add_argument("build_id", nargs="?", help="show this build and its log's tail")
    builds.add_argument("--tool")
    builds.add_argument("--status", choices=["queued", "building", "ready", "failed"])
    builds.add_argument("--limit", type=int, default=20)
    builds.set_defaults(func=_builds)
