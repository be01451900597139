"""``runyard schedule create|ls|get|pause|resume|rm``: recurring schedules over the API."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from runyard.cli.common import EXIT_OK, UsageError, as_json, client_for, emit, read_input


def schedule_line(schedule: dict[str, Any]) -> str:
    """``<id>  <tool>  <cadence>  <state>  next <slot>  fired <n>``: one schedule in a list."""
    cadence = schedule["cron"] or f"every {schedule['every_seconds']}s"
    if schedule["cron"] and schedule["timezone"] != "UTC":
        cadence += f" ({schedule['timezone']})"
    state = "paused" if schedule["paused"] else "active"
    if schedule["next_slot_at"] is None:
        state = "finished"
    line = (
        f"{schedule['id']}  {schedule['tool']}  {cadence}  {state}"
        f"  next {schedule['next_slot_at'] or '-'}  fired {schedule['fired']}"
    )
    if schedule.get("last_error"):
        line += f"  last error: {schedule['last_error']}"
    return line


def _time(raw: str | None, flag: str) -> datetime | None:
    if raw is None:
        return None
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise UsageError(f"{flag}: not an RFC 3339 time: {raw!r}") from exc
    if moment.tzinfo is None:
        raise UsageError(f"{flag}: give a time zone, e.g. {raw}Z or {raw}+01:00")
    return moment


def _create(args: argparse.Namespace) -> int:
    if (args.cron is None) == (args.every is None):
        raise UsageError("give one of --cron and --every")
    schedule = client_for(args).create_schedule(
        args.tool,
        read_input(args.input),
        cron=args.cron,
        every_seconds=args.every,
        timezone=args.timezone,
        start_at=_time(args.start_at, "--start-at"),
        end_at=_time(args.end_at, "--end-at"),
        catch_up=args.catch_up,
        priority=args.priority,
    )
    shown = as_json(schedule)
    emit(args, shown, schedule_line(shown))
    return EXIT_OK


def _ls(args: argparse.Namespace) -> int:
    found = [as_json(s) for s in client_for(args).list_schedules(limit=args.limit)]
    emit(args, found, "\n".join(schedule_line(s) for s in found))
    return EXIT_OK


def _one(action: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        client = client_for(args)
        method = {
            "get": client.get_schedule,
            "pause": client.pause_schedule,
            "resume": client.resume_schedule,
        }[action]
        shown = as_json(method(args.schedule_id))
        emit(args, shown, schedule_line(shown))
        return EXIT_OK

    return run


def _rm(args: argparse.Namespace) -> int:
    client_for(args).delete_schedule(args.schedule_id)
    emit(args, {"id": args.schedule_id, "deleted": True}, f"deleted {args.schedule_id}")
    return EXIT_OK


def add_schedule_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``runyard schedule ACTION``."""
    schedule = sub.add_parser("schedule", help="recurring schedules: each slot makes one run")
    actions = schedule.add_subparsers(dest="schedule_command", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create",
        parents=[common],
        help="run a tool at each slot of a cron expression or every N seconds",
    )
    create.add_argument("tool")
    create.add_argument("--input", default="{}", help="JSON, or @file with JSON")
    create.add_argument("--cron", help="five fields: minute hour day month weekday")
    create.add_argument("--every", type=int, metavar="SECONDS", help="a slot every N seconds")
    create.add_argument("--timezone", help="IANA time zone of --cron (default UTC)")
    create.add_argument("--start-at", help="RFC 3339 time of the first --every slot")
    create.add_argument("--end-at", help="RFC 3339 time after which no slot fires")
    create.add_argument(
        "--catch-up",
        choices=["none", "one", "all"],
        help="slots missed while no scheduler ran: skip (default), run the latest, run each",
    )
    create.add_argument("--priority", type=int)
    create.set_defaults(func=_create)
    ls = actions.add_parser("ls", parents=[common], help="list your schedules, newest first")
    ls.add_argument("--limit", type=int, default=100)
    ls.set_defaults(func=_ls)
    for action, text in (
        ("get", "show a schedule"),
        ("pause", "stop firing a schedule's slots"),
        ("resume", "fire a paused schedule's slots again, from now on"),
    ):
        one = actions.add_parser(action, parents=[common], help=text)
        one.add_argument("schedule_id")
        one.set_defaults(func=_one(action))
    rm = actions.add_parser("rm", parents=[common], help="delete a schedule (its runs stay)")
    rm.add_argument("schedule_id")
    rm.set_defaults(func=_rm)
