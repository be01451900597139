"""Resident memory of the worker and the API with 8 runs in flight.

Real processes: ``python -m api`` (auth disabled) and ``python -m worker --concurrency 8``.
First ``--warm-runs`` no-op runs go through both (so caches, pools and threads exist), then 8
clients each submit ``POST /v1/runs?wait=120`` of a tool that sleeps ``--hold`` seconds: 8
containers run, the worker holds 8 attempts (slot threads, log followers, heartbeats) and the
API holds 8 waiting requests. While all 8 are running, VmRSS of both processes is sampled from
/proc every 0.25 s; the table shows idle, in-flight maximum and the peak (the larger of
VmHWM and the sampled maximum: the kernel's per-thread RSS counters make VmHWM lag a little).
Target: worker <= 150 MB RSS, API <= 150 MB RSS.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

from bench.common import (
    TOOLBOX_IMAGE,
    BenchDatabase,
    Deadline,
    Http,
    Procs,
    base_parser,
    docker_client,
    free_port,
    install_signal_cleanup,
    load_line,
    note,
    out,
    print_machine,
    proc_status,
    remove_containers_of,
    table,
    wait_for_api,
    wait_until,
    write_tools_file,
)

MB = 1024.0  # /proc reports kB


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("memory", __doc__)
    parser.add_argument("--in-flight", type=int, default=8, help="runs in flight (8)")
    parser.add_argument("--hold", type=float, default=12.0, help="seconds each run sleeps (12)")
    parser.add_argument("--warm-runs", type=int, default=16, help="no-op runs first (16)")
    parser.add_argument(
        "--sample-seconds",
        type=float,
        default=4.0,
        help="how long to sample while all runs are in flight (4)",
    )
    args = parser.parse_args(argv)
    deadline = Deadline(args.time_limit)
    install_signal_cleanup()
    n = args.in_flight

    db = BenchDatabase.open(args, "memory")
    procs = Procs()
    client = docker_client()
    from sqlalchemy import create_engine, text

    engine = create_engine(db.sqlalchemy_url(), pool_size=1)
    samples: dict[str, dict[str, Any]] = {}
    since = datetime.now(UTC)
    failed = True
    answers: list[int] = []
    try:
        print_machine(db.url)
        tools_file = write_tools_file(
            procs.logs,
            {
                "noop": {"image": TOOLBOX_IMAGE, "command": ["true"]},
                "hold": {
                    "image": TOOLBOX_IMAGE,
                    "command": ["sleep", f"{args.hold:g}"],
                    "timeout_seconds": int(args.hold) + 60,
                },
            },
        )
        procs.base_env = {
            "RUNYARD_DATABASE_URL": db.url,
            "RUNYARD_TOOLS_FILE": str(tools_file),
            "RUNYARD_AUTH_DISABLED": "true",
        }
        port = free_port()
        procs.spawn("api", ["-m", "api", "--port", str(port)])
        procs.spawn("worker", ["-m", "worker", "--concurrency", str(n)])
        wait_for_api(port, procs, "api")
        time.sleep(2.0)
        pids = {"api": procs.pid("api"), "worker": procs.pid("worker")}
        idle = {name: proc_status(pid) for name, pid in pids.items()}

        def submit(tool: str, count: int) -> None:
            http = Http(port)
            try:
                for _ in range(count):
                    status, body = http.request(
                        "POST", "/v1/runs?wait=120", {"tool": tool, "input": {}}
                    )
                    answers.append(status)
                    if status != 200:
                        note(f"unexpected answer {status}: {str(body)[:200]}")
            finally:
                http.close()

        if args.warm_runs:
            warm = [
                threading.Thread(target=submit, args=("noop", args.warm_runs // 4 or 1))
                for _ in range(4)
            ]
            for t in warm:
                t.start()
            for t in warm:
                t.join(timeout=max(deadline.left(), 1))
        warm_rss = {name: proc_status(pid) for name, pid in pids.items()}

        clients = [threading.Thread(target=submit, args=("hold", 1), daemon=True) for _ in range(n)]
        for t in clients:
            t.start()

        def all_running() -> bool:
            with engine.connect() as conn:
                running = conn.execute(
                    text(
                        "SELECT count(*) FROM tool_runs WHERE tool = 'hold' AND status = 'running'"
                    )
                ).scalar_one()
            containers = client.containers.list(
                filters={"label": "io.runyard.tool=hold", "status": "running"}
            )
            return bool(running >= n and len(containers) >= n)

        took = wait_until(
            all_running, min(60.0, max(deadline.left(), 1)), f"{n} runs in flight", step=0.1
        )
        note(f"{n} runs in flight after {took:.1f} s; sampling")
        peak: dict[str, dict[str, int]] = {name: {} for name in pids}
        end = time.monotonic() + args.sample_seconds
        while time.monotonic() < end:
            for name, pid in pids.items():
                st = proc_status(pid)
                for key, value in st.items():
                    peak[name][key] = max(peak[name].get(key, 0), value)
            time.sleep(0.25)
        still = all_running()
        for t in clients:
            t.join(timeout=args.hold + 60)
        final = {name: proc_status(pid) for name, pid in pids.items()}
        for name in pids:
            samples[name] = {
                "idle": idle[name],
                "warm": warm_rss[name],
                "flight": peak[name],
                "final": final[name],
                "still": still,
            }
        failed = False
    finally:
        procs.close()
        try:
            with engine.connect() as conn:
                ids = list(
                    conn.execute(
                        text(
                            "SELECT id FROM tool_runs WHERE tool IN ('noop', 'hold') "
                            "AND requested_at >= :since"
                        ),
                        {"since": since},
                    ).scalars()
                )
            remove_containers_of(client, ids)
        except Exception as exc:
            note(f"container cleanup failed: {exc}")
        engine.dispose()
        db.close(keep=args.keep_db)
        procs.keep_logs_if(failed)

    out("")
    out(
        f"resident memory, MB (VmRSS from /proc; {n} runs in flight, {args.warm_runs} no-op runs "
        f"before; answers: {sum(1 for a in answers if a == 200)} x 200 of {len(answers)})"
    )
    out(
        table(
            [
                "process",
                "idle RSS",
                "after warm-up",
                f"{n} in flight: max RSS",
                "anon",
                "file",
                "threads",
                "peak (VmHWM)",
            ],
            [
                (
                    name,
                    s["idle"]["VmRSS"] / MB,
                    s["warm"]["VmRSS"] / MB,
                    s["flight"]["VmRSS"] / MB,
                    s["flight"].get("RssAnon", 0) / MB,
                    s["flight"].get("RssFile", 0) / MB,
                    s["flight"].get("Threads", 0),
                    max(s["final"]["VmHWM"], s["flight"]["VmRSS"]) / MB,
                )
                for name, s in samples.items()
            ],
        )
    )
    if not all(s["still"] for s in samples.values()):
        out("note: not every run was still in flight at the end of the sampling window")
    worker = samples["worker"]["flight"]["VmRSS"] / MB
    api = samples["api"]["flight"]["VmRSS"] / MB
    out("")
    out(load_line())
    out(
        f"memory: worker {worker:.0f} MB, API {api:.0f} MB RSS with {n} runs in flight "
        f"(target <= 150 MB each)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
