"""Recovery after ``kill -9`` of a worker whose container then exits: seconds until the run is
final, with lease 3 s and reaper interval 1 s.

Real processes: one ``python -m reaper`` for the whole benchmark; per trial a
``python -m worker`` (A) that claims a run of a tool sleeping ``--tool-seconds``; once its
container is running (plus a random 0-1 s, so the kill lands anywhere in the heartbeat cycle)
A gets SIGKILL and a replacement worker (B) is started at once. The container exits on its
own; the reaper clears A's expired lease; B adopts the run from the exited container and
finalizes it. Times come from the database clock and Docker, on this host:

kill -> container exit -> lease cleared (reaper) -> adopted (B) -> final.

Other settings are the defaults (heartbeat = lease/3, worker poll 1 s +-20 %).
Target: kill -> final <= lease + reaper interval + 2 s.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bench.common import (
    TOOLBOX_IMAGE,
    BenchDatabase,
    Deadline,
    Procs,
    base_parser,
    docker_client,
    install_signal_cleanup,
    load_line,
    median,
    note,
    out,
    print_machine,
    remove_containers_of,
    table,
    wait_until,
)


@dataclass
class Trial:
    """One kill and what followed, in seconds after the kill."""

    run_id: uuid.UUID
    status: str
    exited: float
    cleared: float
    adopted: float
    final: float
    attempts: int


def _epoch(value: datetime | None) -> float:
    return value.timestamp() if value is not None else float("nan")


def _docker_finished(attrs: dict[str, Any]) -> float:
    from runyard.runners.docker.engine_calls import parse_docker_time

    finished = parse_docker_time(attrs["State"].get("FinishedAt"))
    return finished.timestamp() if finished else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("recovery", __doc__)
    parser.add_argument("--trials", type=int, default=3, help="kills (3)")
    parser.add_argument("--lease", type=float, default=3.0, help="RUNYARD_LEASE_SECONDS (3)")
    parser.add_argument(
        "--reaper-interval", type=float, default=1.0, help="RUNYARD_REAPER_INTERVAL_SECONDS (1)"
    )
    parser.add_argument(
        "--tool-seconds", type=float, default=2.0, help="how long the tool's container runs (2)"
    )
    args = parser.parse_args(argv)
    deadline = Deadline(args.time_limit)
    install_signal_cleanup()

    from sqlalchemy import create_engine, text

    from runyard.queue import JobQueue, NewRun
    from runyard.registry.tools import ToolSpec

    db = BenchDatabase.open(args, "recovery")
    procs = Procs()
    client = docker_client()
    engine = create_engine(db.sqlalchemy_url(), pool_size=2)
    queue = JobQueue(engine)
    trials: list[Trial] = []
    run_ids: list[uuid.UUID] = []
    failed = True
    session = uuid.uuid4().hex[:8]
    try:
        print_machine(db.url)
        procs.base_env = {
            "RUNYARD_DATABASE_URL": db.url,
            "RUNYARD_LEASE_SECONDS": str(args.lease),
            "RUNYARD_REAPER_INTERVAL_SECONDS": str(args.reaper_interval),
        }
        out(
            f"lease {args.lease:g} s, reaper interval {args.reaper_interval:g} s, heartbeat "
            f"{args.lease / 3:g} s, worker poll 1 s; tool runs {args.tool_seconds:g} s"
        )
        procs.spawn("reaper", ["-m", "reaper"])
        spec = ToolSpec(
            name="nap",
            image=TOOLBOX_IMAGE,
            command=["sleep", f"{args.tool_seconds:g}"],
            timeout_seconds=120,
        ).snapshot()
        for n in range(args.trials):
            deadline.check(f"trial {n}")
            a, b = f"worker-a{n}", f"worker-b{n}"
            procs.spawn(
                a,
                ["-m", "worker", "--concurrency", "1"],
                {"RUNYARD_WORKER_ID": f"bench-{session}-a{n}"},
            )
            run_id = queue.enqueue(
                NewRun(tenant="bench", tool="nap", spec=spec, input={}, timeout_seconds=120)
            ).run_id
            run_ids.append(run_id)
            name = f"runyard-{run_id}-1"

            def running(name: str = name, a: str = a) -> bool:
                if not procs.alive(a):
                    raise RuntimeError(f"{a} exited:\n{procs.log_tail(a)}")
                try:
                    return bool(client.containers.get(name).status == "running")
                except Exception:
                    return False

            wait_until(running, 60, f"the container of trial {n} to run", step=0.02)
            time.sleep(random.uniform(0.0, 1.0))
            killed = time.time()
            procs.kill9(a)
            procs.spawn(
                b,
                ["-m", "worker", "--concurrency", "1"],
                {"RUNYARD_WORKER_ID": f"bench-{session}-b{n}"},
            )
            exited = float("nan")

            def final(name: str = name, run_id: uuid.UUID = run_id) -> bool:
                nonlocal exited
                if exited != exited:  # NaN: not seen exited yet
                    try:
                        container = client.containers.get(name)
                        if container.status == "exited":
                            exited = _docker_finished(container.attrs)
                    except Exception:
                        pass
                with engine.connect() as conn:
                    status = conn.execute(
                        text("SELECT CAST(status AS text) FROM tool_runs WHERE id = :id"),
                        {"id": run_id},
                    ).scalar_one()
                return status in ("succeeded", "failed", "timed_out", "cancelled")

            wait_until(final, 60, f"trial {n} to become final", step=0.02)
            with engine.connect() as conn:
                row = conn.execute(
                    text(
                        "SELECT CAST(status AS text) AS status, finished_at, attempts "
                        "FROM tool_runs WHERE id = :id"
                    ),
                    {"id": run_id},
                ).one()
                events: dict[str, datetime] = dict(
                    conn.execute(
                        text(
                            "SELECT type, max(at) FROM tool_run_events WHERE run_id = :id "
                            "AND type IN ('lease_expired', 'adopted') GROUP BY type"
                        ),
                        {"id": run_id},
                    ).all()
                )
            trial = Trial(
                run_id=run_id,
                status=row.status,
                exited=exited - killed,
                cleared=_epoch(events.get("lease_expired")) - killed,
                adopted=_epoch(events.get("adopted")) - killed,
                final=_epoch(row.finished_at) - killed,
                attempts=row.attempts,
            )
            trials.append(trial)
            note(f"trial {n}: final {trial.final:.2f} s after the kill ({trial.status})")
            procs.stop(b)
        failed = False
    finally:
        procs.close()
        try:
            remove_containers_of(client, run_ids)
        except Exception as exc:
            note(f"container cleanup failed: {exc}")
        engine.dispose()
        db.close(keep=args.keep_db)
        procs.keep_logs_if(failed)

    target = args.lease + args.reaper_interval + 2.0
    out("")
    out("seconds after kill -9:")
    out(
        table(
            [
                "trial",
                "status",
                "attempts",
                "container exited",
                "lease cleared",
                "adopted",
                "final",
                "exit -> final",
            ],
            [
                (
                    i,
                    t.status,
                    t.attempts,
                    t.exited,
                    t.cleared,
                    t.adopted,
                    t.final,
                    t.final - t.exited,
                )
                for i, t in enumerate(trials)
            ],
        )
    )
    finals = [t.final for t in trials]
    out("")
    out(load_line())
    out(
        f"recovery: kill -9 -> final median {median(finals):.2f} s, max {max(finals):.2f} s "
        f"over {len(trials)} trials (target <= {target:g} s = lease {args.lease:g} + reaper "
        f"{args.reaper_interval:g} + 2)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
