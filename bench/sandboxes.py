"""Sandboxes: how long one takes to be ready, how long a command's round trip takes, and how
fast files move, through a real API process and a real worker process.

- create: ``POST /v1/sandboxes`` until ``GET`` says ``running`` (its container up, the
  workspace made), against a raw ``docker run -d`` of the same image with the same keeper
  until the engine says it runs, both looked for every 10 ms; alternating, one at a time,
  each side given a moment to settle (its follow-up engine calls) before the other's.
- exec round trip: ``POST .../exec`` of ``true`` then ``GET .../execs/{id}?wait=`` until it
  finished, from 1 and from 4 client threads on one sandbox (``max_execs`` 4), with the
  worker's and the API's CPU per command.
- files: one upload and one download of ``--file-mb`` MiB of random bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import threading
import time
import uuid
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
    median,
    out,
    percentile,
    print_machine,
    process_cpu_seconds,
    remove_containers_of,
    table,
    wait_for_api,
    wait_until,
    write_tools_file,
)
from runyard.sandbox_engine import KEEPER

SANDBOX_TOOL = {
    "image": TOOLBOX_IMAGE,
    "command": ["sh"],
    "sandbox": True,
    "timeout_seconds": 900,
    "memory_mb": 256,
    "cpus": 1.0,
    "disk_mb": 2048,
}
RAW_LABEL = "io.runyard.bench-sandbox"
# Between two creates: the owner opens its exec session after its sandbox is ready, the
# engine follows a started container's logs; neither should land in the other side's time.
SETTLE_SECONDS = 0.3
# Both sides look for "running" this often.
POLL_STEP = 0.01


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    parser = base_parser("sandboxes", __doc__)
    parser.add_argument("--creates", type=int, default=8, help="sandboxes made per side")
    parser.add_argument("--execs", type=int, default=200, help="commands per concurrency level")
    parser.add_argument("--file-mb", type=int, default=64, help="size of the file moved")
    return parser


def create_sandbox(api: Http) -> tuple[str, float]:
    """A sandbox made and waited for: its id and the seconds it took."""
    start = time.perf_counter()
    status, made = api.request("POST", "/v1/sandboxes", {"tool": "box", "ttl_seconds": 900})
    assert status == 201, made

    def running() -> bool:
        _, found = api.request("GET", f"/v1/sandboxes/{made['id']}")
        return bool(found["status"] == "running")

    wait_until(running, 120, "the sandbox to run", step=POLL_STEP)
    return str(made["id"]), time.perf_counter() - start


def raw_create(client: Any, session: str) -> float:
    """``docker run -d`` of the same image and keeper until the engine says it runs."""
    start = time.perf_counter()
    container = client.containers.run(
        TOOLBOX_IMAGE,
        ["-c", KEEPER.replace("/runyard/out", "/tmp")],
        entrypoint=["/bin/sh"],
        detach=True,
        labels={RAW_LABEL: session},
        user="65534:65534",
        network_mode="none",
    )
    while container.status != "running":
        time.sleep(POLL_STEP)
        container.reload()
    return time.perf_counter() - start


def exec_round_trips(port: int, sandbox_id: str, count: int, threads: int) -> list[float]:
    """Seconds per command (POST then waited GET), ``count`` of them over ``threads``."""
    times: list[float] = []
    lock = threading.Lock()
    left = [count]

    def client() -> None:
        api = Http(port)
        while True:
            with lock:
                if left[0] == 0:
                    break
                left[0] -= 1
            start = time.perf_counter()
            _, made = api.request("POST", f"/v1/sandboxes/{sandbox_id}/exec", {"command": ["true"]})
            path = f"/v1/sandboxes/{sandbox_id}/execs/{made['id']}?wait=30"
            while api.request("GET", path)[1]["status"] != "finished":
                pass
            with lock:
                times.append(time.perf_counter() - start)
        api.close()

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return times


def move_file(port: int, sandbox_id: str, size_mb: int) -> tuple[float, float]:
    """MiB/s of one upload and one download of ``size_mb`` MiB."""
    payload = os.urandom(size_mb * 1_048_576)
    path = f"/v1/sandboxes/{sandbox_id}/files/bench.bin"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    start = time.perf_counter()
    conn.request("PUT", path, body=payload, headers={"Content-Type": "application/octet-stream"})
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 200, answer.status
    up = time.perf_counter() - start
    start = time.perf_counter()
    conn.request("GET", path)
    answer = conn.getresponse()
    got = answer.read()
    down = time.perf_counter() - start
    conn.close()
    assert got == payload, "the downloaded file differs"
    return size_mb / up, size_mb / down


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; prints its tables and a headline."""
    args = build_parser().parse_args(argv)
    deadline = Deadline(args.time_limit)
    install_signal_cleanup()
    db = BenchDatabase.open(args, "sandboxes")
    procs = Procs()
    client = docker_client()
    session = uuid.uuid4().hex[:12]
    sandboxes: list[str] = []
    failed = True
    try:
        print_machine(db.url)
        port = free_port()
        procs.base_env = {
            "RUNYARD_DATABASE_URL": db.url,
            "RUNYARD_TOOLS_FILE": str(write_tools_file(procs.logs, {"box": SANDBOX_TOOL})),
            "RUNYARD_AUTH_DISABLED": "true",
        }
        procs.spawn("api", ["-m", "api", "--port", str(port)])
        wait_for_api(port, procs, "api")
        procs.spawn("worker", ["-m", "worker", "--concurrency", str(args.creates + 1)])
        api = Http(port)

        ours, raw = [], []
        for _ in range(args.creates):
            deadline.check("creates")
            sandbox_id, seconds = create_sandbox(api)
            sandboxes.append(sandbox_id)
            ours.append(seconds)
            time.sleep(SETTLE_SECONDS)
            raw.append(raw_create(client, session))
            time.sleep(SETTLE_SECONDS)
        out(
            table(
                ["create", "p50 s", "max s"],
                [
                    ["runyard sandbox", f"{median(ours):.3f}", f"{max(ours):.3f}"],
                    ["raw docker run -d", f"{median(raw):.3f}", f"{max(raw):.3f}"],
                ],
            )
        )
        rows = []
        for threads in (1, 4):
            deadline.check(f"execs at {threads}")
            cpu_before = [process_cpu_seconds(procs.pid(name)) for name in ("worker", "api")]
            times = exec_round_trips(port, sandboxes[0], args.execs, threads)
            cpu = [
                (process_cpu_seconds(procs.pid(name)) - before) * 1000 / len(times)
                for name, before in zip(("worker", "api"), cpu_before, strict=True)
            ]
            rows.append(
                [
                    str(threads),
                    f"{median(times) * 1000:.0f}",
                    f"{percentile(times, 99) * 1000:.0f}",
                    f"{len(times) / sum(times) * threads:.1f}",
                    f"{cpu[0]:.1f}",
                    f"{cpu[1]:.1f}",
                ]
            )
        head = ["exec concurrency", "p50 ms", "p99 ms", "execs/s", "worker CPU ms", "API CPU ms"]
        out(table(head, rows))
        up, down = move_file(port, sandboxes[0], args.file_mb)
        out(table(["files", "MiB/s"], [["upload", f"{up:.0f}"], ["download", f"{down:.0f}"]]))
        out(
            f"headline: create p50 {median(ours):.2f} s (raw {median(raw):.2f} s), exec round "
            f"trip p50 {rows[0][1]} ms at 1 / {rows[1][1]} ms at 4, files {up:.0f} / {down:.0f} "
            "MiB/s up / down"
        )
        for sandbox_id in sandboxes:
            api.request("DELETE", f"/v1/sandboxes/{sandbox_id}")
        failed = False
    finally:
        for entry in client.api.containers(all=True, filters={"label": f"{RAW_LABEL}={session}"}):
            with contextlib.suppress(Exception):
                client.api.remove_container(entry["Id"], force=True)
        procs.close()
        remove_containers_of(client, [uuid.UUID(s) for s in sandboxes])
        db.close(keep=args.keep_db)
        procs.keep_logs_if(failed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
