"""No-op container runs through runyard vs the same containers driven directly with docker-py.

runyard side: a real API process (``python -m api``) and a real worker process
(``python -m worker --concurrency C``). C client threads each submit
``POST /v1/runs?wait=60`` for the ``noop`` tool (``runyard/toolbox:latest``, command
``["true"]``) and submit the next one when the answer (the terminal run) comes back: latency
is submit -> terminal run in hand; throughput is runs / wall time of the round.

raw side: C threads each create the per-attempt volume, create the container with the same
hardening flags (checked field by field against a container made by runyard's DockerRunner
before anything is timed), start it, wait for it, then remove container and volume. Latency
is create -> wait returned; throughput counts through the removal, like the worker's slot.

Rounds alternate (runyard first, then raw first, ...) so machine noise hits both sides.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.common import (
    TOOLBOX_IMAGE,
    BackendCpu,
    BenchDatabase,
    Deadline,
    Http,
    Procs,
    base_parser,
    docker_client,
    free_port,
    install_signal_cleanup,
    load_line,
    machine_busy_seconds,
    median,
    note,
    out,
    percentile,
    pids_named,
    print_machine,
    process_cpu_seconds,
    remove_containers_of,
    table,
    wait_for_api,
    wait_until,
    write_tools_file,
)
from bench.otlp_sink import otlp_sink

NOOP = {"image": TOOLBOX_IMAGE, "command": ["true"], "timeout_seconds": 60}
RAW_LABEL = "io.runyard.bench"
ENGINE_DAEMONS = ("dockerd", "containerd")

# The platform's own cost per run and what it may take from the engine's throughput.
TARGET_RATIO = 0.95
TARGET_P50_OVERHEAD_MS = 30.0
TARGET_WORKER_CPU_MS = 5.0
TARGET_API_CPU_MS = 2.0


@dataclass
class RoundResult:
    """One round of one side at one concurrency."""

    side: str
    concurrency: int
    runs: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    # runyard only: per-run phases from the database clock (submit -> requested -> claimed
    # -> finalized -> answer in hand).
    phases: list[tuple[float, float, float, float]] = field(default_factory=list)
    # CPU seconds during the round: the whole machine, the engine daemons, and runyard's worker
    # and API processes.
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.runs / self.seconds if self.seconds > 0 else 0.0


# --- the raw side ---------------------------------------------------------------------------


def noop_definition(runtime: str | None = None) -> dict[str, Any]:
    """The ``noop`` tool's registry entry, under ``runtime`` if given (its isolation tier)."""
    return {**NOOP, "runtime": runtime} if runtime else dict(NOOP)


def noop_tool(runtime: str | None = None) -> dict[str, Any]:
    """The tool definition snapshot both sides use."""
    from runyard.registry.tools import ToolSpec

    return ToolSpec.model_validate({"name": "noop", **noop_definition(runtime)}).snapshot()


def raw_create_kwargs(
    tool: dict[str, Any], name: str, image_id: str, labels: dict[str, str]
) -> dict[str, Any]:
    """The hardening flags of runyard's Docker runner, written out for docker-py (under gVisor
    with the sandbox's allowance on the memory and pids limits, as the runner asks)."""
    from docker.types import LogConfig, Mount, Ulimit

    from runyard.domain.isolation import engine_memory_mb, engine_pids_limit

    runtime = tool.get("runtime")
    memory = f"{engine_memory_mb(int(tool['memory_mb']), runtime)}m"
    nofile = int(tool.get("nofile_limit", 1024))
    # No single file past the disk limit (or the /tmp size): as runyard's runner sets it.
    fsize = max(int(tool.get("disk_mb") or 1024), int(tool.get("tmpfs_mb", 16))) << 20
    run_id = str(uuid.uuid4())
    return {
        "image": image_id,
        "command": list(tool["command"]),
        "entrypoint": tool.get("entrypoint"),
        "working_dir": tool.get("workdir"),
        "name": name,
        "labels": labels,
        "environment": {
            **(tool.get("env") or {}),
            "RUNYARD_RUN_ID": run_id,
            "RUNYARD_ATTEMPT": "1",
            "RUNYARD_INPUT": "/runyard/input.json",
            "RUNYARD_OUTPUT_DIR": "/runyard/out",
        },
        "user": str(tool.get("user", "65534:65534")),
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,noexec,nosuid,nodev,size={int(tool.get('tmpfs_mb', 16))}m"},
        "network_mode": "none",
        "mem_limit": memory,
        "memswap_limit": memory,
        "nano_cpus": int(float(tool["cpus"]) * 1e9),
        "pids_limit": engine_pids_limit(int(tool["pids_limit"]), runtime),
        "runtime": runtime,
        "ulimits": [
            Ulimit(name="nofile", soft=nofile, hard=nofile),
            Ulimit(name="fsize", soft=fsize, hard=fsize),
        ],
        "init": True,
        "privileged": False,
        "mounts": [Mount(target="/runyard", source=name, type="volume")],
        "log_config": LogConfig(type="json-file", config={"max-size": "20m", "max-file": "1"}),
        "stop_signal": "SIGTERM",
        "detach": True,
    }


PARITY_FIELDS = (
    ("HostConfig", "CapDrop"),
    ("HostConfig", "SecurityOpt"),
    ("HostConfig", "ReadonlyRootfs"),
    ("HostConfig", "Tmpfs"),
    ("HostConfig", "NetworkMode"),
    ("HostConfig", "Memory"),
    ("HostConfig", "MemorySwap"),
    ("HostConfig", "NanoCpus"),
    ("HostConfig", "PidsLimit"),
    ("HostConfig", "Runtime"),
    ("HostConfig", "Ulimits"),
    ("HostConfig", "Init"),
    ("HostConfig", "Privileged"),
    ("HostConfig", "LogConfig"),
    ("HostConfig", "CapAdd"),
    ("HostConfig", "Binds"),
    ("Config", "User"),
    ("Config", "Cmd"),
    ("Config", "Entrypoint"),
    ("Config", "StopSignal"),
)


def bench_runner(client: Any, setting: str) -> Any:
    """runyard's DockerRunner with ``RUNYARD_HOST_WORKDIR_ROOT=setting`` applied."""
    from runyard.runners.docker.runner import DockerRunner

    runner = DockerRunner(client)
    runner.choose_inputs(setting)
    return runner


def check_parity(
    client: Any, tool: dict[str, Any], image_id: str, session: str, setting: str
) -> int:
    """Create one container through runyard's DockerRunner and one with the raw flags, compare
    the hardening fields of their configs, remove both. Returns the number of fields compared."""
    from runyard.domain.attempt import AttemptSpec

    runner = bench_runner(client, setting)
    spec = AttemptSpec(
        run_id=uuid.uuid4(),
        attempt=1,
        tool=tool,
        input={},
        deadline_at=datetime.now(UTC) + timedelta(seconds=60),
    )
    raw_name = f"runyard-bench-raw-{uuid.uuid4()}"
    created = runner._launcher.create(spec, None)  # the adapter's own create, never started
    try:
        assert isinstance(created, str), created
        ours = client.containers.get(created)
        client.volumes.create(raw_name, labels={RAW_LABEL: session})
        raw = client.containers.create(
            **raw_create_kwargs(tool, raw_name, image_id, {RAW_LABEL: session})
        )
        try:
            mismatches = []
            for section, key in PARITY_FIELDS:
                a = ours.attrs[section].get(key)
                b = raw.attrs[section].get(key)
                if a != b:
                    mismatches.append(f"{section}.{key}: runyard={a!r} raw={b!r}")
            # runyard names the image by its tag, raw by its id: both resolve to the same image.
            if ours.attrs["Image"] != raw.attrs["Image"]:
                mismatches.append(f"Image: runyard={ours.attrs['Image']} raw={raw.attrs['Image']}")
            mount_a = [(m["Type"], m["Destination"]) for m in ours.attrs["Mounts"]]
            mount_b = [(m["Type"], m["Destination"]) for m in raw.attrs["Mounts"]]
            if mount_a != mount_b:
                mismatches.append(f"Mounts: runyard={mount_a} raw={mount_b}")
            if mismatches:
                raise SystemExit("raw flags differ from runyard's:\n  " + "\n  ".join(mismatches))
        finally:
            raw.remove(force=True)
            client.api.remove_volume(raw_name, force=True)
    finally:
        runner.discard(spec.run_id, spec.attempt)
    return len(PARITY_FIELDS) + 2


def raw_round(
    client: Any,
    tool: dict[str, Any],
    image_id: str,
    session: str,
    concurrency: int,
    runs: int,
    deadline: Deadline,
) -> RoundResult:
    """``runs`` raw lifecycles by ``concurrency`` threads."""
    result = RoundResult("raw", concurrency, runs, 0.0)
    lock = threading.Lock()
    remaining = [runs]

    def one() -> None:
        name = f"runyard-bench-raw-{uuid.uuid4()}"
        labels = {RAW_LABEL: session}
        t0 = time.perf_counter()
        client.volumes.create(name, labels=labels)
        container = client.containers.create(**raw_create_kwargs(tool, name, image_id, labels))
        container.start()
        status = container.wait(timeout=60)
        t1 = time.perf_counter()
        container.remove(force=True)
        client.api.remove_volume(name, force=True)
        with lock:
            result.latencies.append(t1 - t0)
            if status.get("StatusCode") != 0:
                result.errors += 1

    def loop() -> None:
        while deadline.left() > 0:
            with lock:
                if remaining[0] <= 0:
                    return
                remaining[0] -= 1
            try:
                one()
            except Exception as exc:  # a failed lifecycle is counted, not fatal
                note(f"raw lifecycle failed: {exc}")
                with lock:
                    result.errors += 1

    result.seconds = _run_threads(loop, concurrency)
    return result


# --- the runyard side -----------------------------------------------------------------------


def runyard_round(
    port: int, engine: Any, concurrency: int, runs: int, deadline: Deadline
) -> RoundResult:
    """``runs`` submits with ``?wait`` by ``concurrency`` client threads."""
    from sqlalchemy import text

    result = RoundResult("runyard", concurrency, runs, 0.0)
    lock = threading.Lock()
    remaining = [runs]
    submitted: dict[str, tuple[float, float]] = {}

    def loop() -> None:
        http = Http(port)
        try:
            while deadline.left() > 0:
                with lock:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                wall = time.time()
                t0 = time.perf_counter()
                try:
                    status, body = http.request(
                        "POST", "/v1/runs?wait=60", {"tool": "noop", "input": {}}
                    )
                except OSError as exc:
                    note(f"submit failed: {exc}")
                    with lock:
                        result.errors += 1
                    continue
                t1 = time.perf_counter()
                ok = status == 200 and isinstance(body, dict) and body.get("status") == "succeeded"
                with lock:
                    if ok:
                        result.latencies.append(t1 - t0)
                        submitted[body["id"]] = (wall, wall + (t1 - t0))
                    else:
                        result.errors += 1
                        note(f"run not succeeded: {status} {str(body)[:300]}")
        finally:
            http.close()

    result.seconds = _run_threads(loop, concurrency)
    if submitted:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id::text AS id, extract(epoch FROM requested_at) AS req, "
                    "extract(epoch FROM started_at) AS sta, "
                    "extract(epoch FROM finished_at) AS fin "
                    "FROM tool_runs WHERE id = ANY(CAST(:ids AS uuid[]))"
                ),
                {"ids": list(submitted)},
            ).all()
        for row in rows:
            sent, answered = submitted[row.id]
            req, sta, fin = float(row.req), float(row.sta), float(row.fin)
            result.phases.append((req - sent, sta - req, fin - sta, answered - fin))
    return result


def _run_threads(target: Callable[[], None], n: int) -> float:
    threads = [threading.Thread(target=target, daemon=True) for _ in range(n)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


# --- where the time goes: Docker API calls, in-process -------------------------------------


class NullSink:
    """A live-log sink that keeps nothing (the worker's sink writes events to the database)."""

    def resume_point(self, stream: str) -> str | None:
        return None

    def write(self, stream: str, text: str, until: str) -> bool:
        return True


def _call_key(request: Any) -> str:
    return _request_key(request.method, request.path_url)


def _request_key(method: str, path_url: str) -> str:
    import re

    path = path_url.split("?", 1)[0]
    path = re.sub(r"^/v[0-9.]+", "", path)
    path = re.sub(r"/images/.+/json$", "/images/{x}/json", path)
    path = re.sub(r"/(containers|volumes|images)/[^/]+", r"/\1/{x}", path)
    query = path_url.partition("?")[2]
    if "follow=1" in query:
        path += " (follow)"
    return f"{method} {path}"


def docker_breakdown(
    client: Any, tool: dict[str, Any], image_id: str, session: str, runs: int, setting: str
) -> None:
    """Time every Docker API request of ``runs`` sequential attempts through runyard's
    DockerRunner (no database, a null log sink) and of the raw lifecycle, alternating."""
    from collections import defaultdict

    from runyard.domain.attempt import AttemptSpec
    from runyard.runner import AttemptControl, RunnerUnavailable
    from runyard.runners.docker.socket_api import SocketApi

    lost = 0
    calls: dict[str, dict[str, list[float]]] = {
        "runyard": defaultdict(list),
        "raw": defaultdict(list),
    }
    current: dict[str, list[float]] = defaultdict(list)  # this attempt's requests
    original = client.api.send

    def send(request: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(request, **kwargs)
        finally:
            current[_call_key(request)].append(time.perf_counter() - t0)

    def keep(side: str) -> None:
        for key, values in current.items():
            calls[side][key].extend(values)
        current.clear()

    runner = bench_runner(client, setting)
    client.api.send = send
    # The runner sends an attempt's hot calls over the socket directly (socket_api.py).
    lean = runner._api if isinstance(runner._api, SocketApi) else None
    if lean is not None:
        open_request = lean.open

        def timed_open(call: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return open_request(call)
            finally:
                query = "?" + "&".join(f"{k}={v}" for k, v in (call.params or {}).items())
                key = _request_key(call.method, call.path + query)
                current[key].append(time.perf_counter() - t0)

        lean.open = timed_open  # type: ignore[method-assign]
    walls: dict[str, list[float]] = {"runyard": [], "raw": []}
    terminal: dict[str, list[float]] = {"runyard": [], "raw": []}
    try:
        for _ in range(runs):
            current.clear()
            spec = AttemptSpec(
                run_id=uuid.uuid4(),
                attempt=1,
                tool=tool,
                input={},
                deadline_at=datetime.now(UTC) + timedelta(seconds=60),
            )
            t0 = time.perf_counter()
            try:
                outcome = runner.run(spec, AttemptControl(logs=NullSink()))
            except RunnerUnavailable as exc:
                # Someone else removed the container (a test suite's cleanup on this engine).
                note(f"breakdown: attempt lost ({exc}); skipped")
                lost += 1
                with contextlib.suppress(RunnerUnavailable):
                    runner.discard(spec.run_id, spec.attempt)
                continue
            t1 = time.perf_counter()
            runner.discard(spec.run_id, spec.attempt)
            keep("runyard")
            walls["runyard"].append(time.perf_counter() - t0)
            terminal["runyard"].append(t1 - t0)
            if outcome.exit_code != 0:
                note(f"breakdown: unexpected outcome {outcome}")
            t0 = time.perf_counter()
            name = f"runyard-bench-raw-{uuid.uuid4()}"
            client.volumes.create(name, labels={RAW_LABEL: session})
            container = client.containers.create(
                **raw_create_kwargs(tool, name, image_id, {RAW_LABEL: session})
            )
            container.start()
            container.wait(timeout=60)
            t1 = time.perf_counter()
            container.remove(force=True)
            client.api.remove_volume(name, force=True)
            keep("raw")
            walls["raw"].append(time.perf_counter() - t0)
            terminal["raw"].append(t1 - t0)
    finally:
        client.api.send = original
        if lean is not None:
            del lean.open
    keys = sorted(
        set(calls["runyard"]) | set(calls["raw"]), key=lambda k: -sum(calls["runyard"].get(k, []))
    )
    n_ours = max(len(terminal["runyard"]), 1)
    n_raw = max(len(terminal["raw"]), 1)
    rows: list[tuple[object, ...]] = []
    for key in keys:
        ours = calls["runyard"].get(key, [])
        raw = calls["raw"].get(key, [])
        rows.append(
            (
                key,
                len(ours) / n_ours,
                sum(ours) / n_ours * 1000,
                len(raw) / n_raw,
                sum(raw) / n_raw * 1000,
            )
        )
    rows.append(
        (
            "TOTAL requests",
            sum(len(v) for v in calls["runyard"].values()) / n_ours,
            sum(sum(v) for v in calls["runyard"].values()) / n_ours * 1000,
            sum(len(v) for v in calls["raw"].values()) / n_raw,
            sum(sum(v) for v in calls["raw"].values()) / n_raw * 1000,
        )
    )
    if lost:
        rows.append(
            (
                f"({lost} runyard attempts lost to another process's cleanup, skipped)",
                "",
                "",
                "",
                "",
            )
        )
    out("")
    out(
        f"Docker API requests per run, sequential, in-process ({runs} runs each; DockerRunner "
        "with a null log sink vs the raw lifecycle; follow streams count until their headers):"
    )
    out(table(["request", "runyard n/run", "runyard ms/run", "raw n/run", "raw ms/run"], rows))
    out(
        f"median ms to outcome: DockerRunner.run {median(terminal['runyard']) * 1000:.0f}, "
        f"raw create->wait {median(terminal['raw']) * 1000:.0f}; with removal: "
        f"{median(walls['runyard']) * 1000:.0f} vs {median(walls['raw']) * 1000:.0f}"
    )


# --- main -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line; with no flags, runyard's default configuration at the quick size."""
    parser = base_parser("containers", __doc__)
    parser.add_argument(
        "--traced",
        action="store_true",
        help="tracing on in the API and the worker, exporting to an OTLP sink on loopback",
    )
    parser.add_argument("--runs", type=int, default=20, help="runs per side per round (20)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per concurrency (2)")
    parser.add_argument("--concurrency", default="1,2,4", help="worker slots / raw threads")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per side per level")
    parser.add_argument(
        "--breakdown",
        type=int,
        default=10,
        help="runs of the in-process Docker call breakdown (10; 0 = skip)",
    )
    parser.add_argument(
        "--inputs",
        choices=("auto", "host", "upload"),
        default="auto",
        help="how the worker writes each input: 'auto' (runyard's default: no "
        "RUNYARD_HOST_WORKDIR_ROOT, the worker decides at start), 'host' (forced, a directory "
        "under the benchmark's temporary folder) or 'upload' (forced, the archive API)",
    )
    parser.add_argument(
        "--runtime",
        default=None,
        help="the noop tool's OCI runtime on both sides, i.e. its isolation tier ('runsc': "
        "gVisor); default the engine's (runc)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",") if x]
    deadline = Deadline(args.time_limit)
    install_signal_cleanup()

    db = BenchDatabase.open(args, "containers")
    procs = Procs()
    sink = contextlib.ExitStack()
    client = docker_client()
    session = uuid.uuid4().hex[:12]
    from sqlalchemy import create_engine

    engine = create_engine(db.sqlalchemy_url(), pool_size=2)
    results: list[RoundResult] = []
    since = datetime.now(UTC)
    breakdown = ""
    modes: set[str] = set()
    failed = True
    try:
        print_machine(db.url)
        tool = noop_tool(args.runtime)
        image_id = str(client.images.get(TOOLBOX_IMAGE).id)
        setting = {"auto": "auto", "upload": "upload", "host": str(procs.logs / "attempts")}[
            args.inputs
        ]
        fields = check_parity(client, tool, image_id, session, setting)
        out(f"hardening parity: {fields} container config fields identical (runyard vs raw)")
        if args.breakdown:
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                docker_breakdown(client, tool, image_id, session, args.breakdown, setting)
            breakdown = buffer.getvalue()

        tools_file = write_tools_file(procs.logs, {"noop": noop_definition(args.runtime)})
        port = free_port()
        procs.base_env = {
            "RUNYARD_DATABASE_URL": db.url,
            "RUNYARD_TOOLS_FILE": str(tools_file),
            "RUNYARD_AUTH_DISABLED": "true",
        }
        if args.traced:  # the API and the worker export every span to a sink on loopback
            procs.base_env["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.enter_context(otlp_sink())
        if args.inputs != "auto":  # auto: the setting left out, as a deployment would
            procs.base_env["RUNYARD_HOST_WORKDIR_ROOT"] = setting
        # The database's backends (the API's, the worker's, this process's), sampled.
        backends = sink.enter_context(BackendCpu(db.url))
        procs.spawn("api", ["-m", "api", "--port", str(port)])
        wait_for_api(port, procs, "api")
        out(
            f"runs per side per round: {args.runs}; rounds: {args.rounds}; levels: {levels}; "
            f"logs: {procs.logs}"
        )

        for c in levels:
            deadline.check(f"concurrency {c}")
            name = f"worker-c{c}"
            procs.spawn(
                name,
                ["-m", "worker", "--concurrency", str(c)],
                {"RUNYARD_WORKER_ID": f"bench-{session}-c{c}"},
            )
            _wait_worker(engine, f"bench-{session}-c{c}", procs, name)
            used = worker_inputs(procs, name)
            modes.add(used)
            out(f"inputs: {args.inputs} asked, the worker at c={c} uses {used}")
            if args.warmup:
                runyard_round(port, engine, c, args.warmup, deadline)
                raw_round(client, tool, image_id, session, c, args.warmup, deadline)
            for r in range(args.rounds):
                sides = ["runyard", "raw"] if r % 2 == 0 else ["raw", "runyard"]
                for side in sides:
                    deadline.check(f"{side} round {r} at {c}")
                    pids = {"worker": procs.pid(name), "api": procs.pid("api")}
                    before, backends_before = cpu_now(pids), backends.begin()
                    if side == "runyard":
                        res = runyard_round(port, engine, c, args.runs, deadline)
                    else:
                        res = raw_round(client, tool, image_id, session, c, args.runs, deadline)
                    after = cpu_now(pids)
                    res.cpu = {k: after[k] - before[k] for k in after}
                    res.cpu["postgres"] = backends.used_since(backends_before)
                    results.append(res)
                    note(
                        f"c={c} round {r} {side}: {res.rate:.2f} runs/s, "
                        f"p50 {median(res.latencies) * 1000:.0f} ms, errors {res.errors}"
                    )
            procs.stop(name)
        failed = False
    finally:
        procs.close()  # first: a worker still running would make containers after the cleanup
        _cleanup(client, engine, session, since)
        engine.dispose()
        sink.close()
        db.close(keep=args.keep_db)
        procs.keep_logs_if(failed)

    inputs = f"{args.inputs} -> {'/'.join(sorted(modes)) or '?'}"
    report(
        results, levels, breakdown, inputs + (f", runtime {args.runtime}" if args.runtime else "")
    )
    return 0


def cpu_now(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far: the machine's (``machine``), the engine daemons' (``engine``: dockerd
    and containerd with the children they reaped, such as runc) and each named process's."""
    engine = 0.0
    for pid in pids_named(*ENGINE_DAEMONS):
        with contextlib.suppress(OSError):
            engine += process_cpu_seconds(pid, reaped_children=True)
    return {"machine": machine_busy_seconds(), "engine": engine} | {
        name: process_cpu_seconds(pid) for name, pid in pids.items()
    }


def worker_inputs(procs: Procs, name: str) -> str:
    """The input mode the worker logged at start (``host`` or ``upload``)."""
    import json

    def logged() -> str | None:
        for line in (procs.logs / f"{name}.log").read_text(errors="replace").splitlines():
            if "worker started" in line:
                if line.startswith("{"):
                    return str(json.loads(line).get("inputs"))
                return line.rsplit("inputs=", 1)[-1].split()[0]
        return None

    wait_until(lambda: logged() is not None, 30, f"{name}'s start line", step=0.1)
    return logged() or "?"


def _wait_worker(engine: Any, worker_id: str, procs: Procs, name: str) -> None:
    from sqlalchemy import text

    def registered() -> bool:
        if not procs.alive(name):
            raise RuntimeError(f"{name} exited early:\n{procs.log_tail(name)}")
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    text("SELECT count(*) FROM workers WHERE id = :id AND stopped_at IS NULL"),
                    {"id": worker_id},
                ).scalar_one()
            )

    wait_until(registered, 60, f"{name} to register", step=0.1)


def _cleanup(client: Any, engine: Any, session: str, since: datetime) -> None:
    from sqlalchemy import text

    mine = {"label": f"{RAW_LABEL}={session}"}
    for entry in client.api.containers(all=True, filters=mine):
        with contextlib.suppress(Exception):
            client.api.remove_container(entry["Id"], force=True)
    for volume in (client.api.volumes(filters=mine) or {}).get("Volumes") or []:
        with contextlib.suppress(Exception):
            client.api.remove_volume(volume["Name"], force=True)
    try:
        with engine.connect() as conn:
            ids = [
                uuid.UUID(str(i))
                for i in conn.execute(
                    text("SELECT id FROM tool_runs WHERE tool = 'noop' AND requested_at >= :since"),
                    {"since": since},
                ).scalars()
            ]
        remove_containers_of(client, ids)
    except Exception as exc:
        note(f"cleanup of runyard containers skipped: {exc}")


def report(
    results: list[RoundResult], levels: list[int], breakdown: str = "", inputs: str = "auto"
) -> None:
    """Per-round table, summary per concurrency, the Docker breakdown, then the headline."""
    out("")
    out("rounds:")
    out(
        table(
            ["c", "side", "runs", "errors", "seconds", "runs/s", "p50 ms", "p95 ms"],
            [
                (
                    r.concurrency,
                    r.side,
                    r.runs,
                    r.errors,
                    r.seconds,
                    r.rate,
                    median(r.latencies) * 1000,
                    percentile(r.latencies, 95) * 1000,
                )
                for r in results
            ],
        )
    )
    rows = []
    phase_rows = []
    ratios: dict[int, float] = {}
    overheads: dict[int, float] = {}
    for c in levels:
        ours = [r for r in results if r.concurrency == c and r.side == "runyard"]
        raw = [r for r in results if r.concurrency == c and r.side == "raw"]
        if not ours or not raw:
            continue
        rate_ours = sum(r.runs for r in ours) / sum(r.seconds for r in ours)
        rate_raw = sum(r.runs for r in raw) / sum(r.seconds for r in raw)
        lat_ours = [x for r in ours for x in r.latencies]
        lat_raw = [x for r in raw for x in r.latencies]
        per_round = [o.rate / w.rate for o, w in zip(ours, raw, strict=False) if w.rate]
        ratios[c] = rate_ours / rate_raw
        overheads[c] = (median(lat_ours) - median(lat_raw)) * 1000
        rows.append(
            (
                c,
                rate_ours,
                rate_raw,
                ratios[c],
                f"{min(per_round):.2f}-{max(per_round):.2f}" if per_round else "-",
                median(lat_ours) * 1000,
                percentile(lat_ours, 95) * 1000,
                median(lat_raw) * 1000,
                percentile(lat_raw, 95) * 1000,
                overheads[c],
                sum(r.errors for r in ours + raw),
            )
        )
        phases = [p for r in ours for p in r.phases]
        if phases:
            phase_rows.append((c, *(median([p[i] for p in phases]) * 1000 for i in range(4))))
    out("")
    out("summary (throughput pooled over rounds; latency percentiles over all runs):")
    out(
        table(
            [
                "c",
                "runyard runs/s",
                "raw runs/s",
                "ratio",
                "ratio per round",
                "runyard p50 ms",
                "runyard p95 ms",
                "raw p50 ms",
                "raw p95 ms",
                "p50 overhead ms",
                "errors",
            ],
            rows,
        )
    )
    if phase_rows:
        out("")
        out("runyard latency by phase (medians, ms; database clock, same host):")
        out(
            table(
                [
                    "c",
                    "submit->enqueued",
                    "enqueued->claimed",
                    "claimed->finalized",
                    "finalized->answer",
                ],
                phase_rows,
            )
        )
    cpu_rows = []
    worker_cpu: dict[int, float] = {}
    api_cpu: dict[int, float] = {}
    for c in levels:
        per_run: dict[str, dict[str, float]] = {}
        for side in ("runyard", "raw"):
            rounds = [r for r in results if r.concurrency == c and r.side == side and r.cpu]
            runs = sum(len(r.latencies) for r in rounds)
            if runs:
                keys = rounds[0].cpu.keys()
                per_run[side] = {k: sum(r.cpu[k] for r in rounds) * 1000 / runs for k in keys}
        if len(per_run) == 2:
            ours_cpu, raw_cpu = per_run["runyard"], per_run["raw"]
            worker_cpu[c], api_cpu[c] = ours_cpu["worker"], ours_cpu["api"]
            cpu_rows.append(
                [
                    str(c),
                    f"{ours_cpu['machine']:.0f}",
                    f"{raw_cpu['machine']:.0f}",
                    f"{ours_cpu['machine'] - raw_cpu['machine']:+.0f}",
                    f"{ours_cpu['engine']:.0f}",
                    f"{raw_cpu['engine']:.0f}",
                    f"{ours_cpu['worker']:.1f}",
                    f"{ours_cpu['api']:.1f}",
                    f"{ours_cpu['postgres']:.1f}",
                ]
            )
    if cpu_rows:
        out("")
        out(
            "CPU per run, ms (machine: all processes on both cores, from /proc/stat; engine: "
            "dockerd and containerd with the children they reaped; Postgres: the backends of "
            "the benchmark's database, sampled every 0.1 s):"
        )
        out(
            table(
                [
                    "c",
                    "machine, runyard side",
                    "machine, raw side",
                    "difference",
                    "engine, runyard side",
                    "engine, raw side",
                    "runyard worker",
                    "runyard API",
                    "runyard Postgres",
                ],
                cpu_rows,
            )
        )
    if breakdown:
        out(breakdown.rstrip())
    out("")
    out(load_line())
    out(f"containers (inputs: {inputs}): " + verdict_line(ratios, overheads, worker_cpu, api_cpu))


def verdict_line(
    ratios: dict[int, float],
    overheads: dict[int, float],
    worker_cpu: dict[int, float],
    api_cpu: dict[int, float],
) -> str:
    """Each figure by concurrency and whether it meets its target at every concurrency."""

    def part(name: str, values: dict[int, float], fmt: str, met: bool, target: str) -> str:
        shown = ", ".join(f"c{c}={format(v, fmt)}" for c, v in values.items())
        return f"{name} {shown} {'met' if met and values else 'missed'} ({target})"

    return "; ".join(
        [
            part(
                "runyard/raw throughput",
                ratios,
                ".3f",  # 0.948 is not 0.95
                all(v >= TARGET_RATIO for v in ratios.values()),
                f">= {TARGET_RATIO:.2f} at every c",
            ),
            part(
                "p50 overhead ms",
                overheads,
                "+.0f",
                all(v <= TARGET_P50_OVERHEAD_MS for v in overheads.values()),
                f"<= {TARGET_P50_OVERHEAD_MS:.0f}",
            ),
            part(
                "worker CPU ms/run",
                worker_cpu,
                ".1f",
                all(v <= TARGET_WORKER_CPU_MS for v in worker_cpu.values()),
                f"<= {TARGET_WORKER_CPU_MS:.0f}",
            ),
            part(
                "API CPU ms/run",
                api_cpu,
                ".1f",
                all(v <= TARGET_API_CPU_MS for v in api_cpu.values()),
                f"<= {TARGET_API_CPU_MS:.0f}",
            ),
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
