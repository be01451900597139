"""Shared plumbing of the benchmarks: databases, child processes, statistics, tables.

Nothing here is imported by runyard; the benchmarks drive the real entry points
(``python -m api``, ``python -m worker``, ``python -m reaper``) as child processes, or the
queue in-process, against a Postgres on loopback and the local Docker engine.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import http.client
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK_SERVER = "postgresql://postgres@127.0.0.1:55432/postgres"
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", ""}
TOOLBOX_IMAGE = "runyard/toolbox:latest"
BENCH_TENANT = "dev"  # the tenant of RUNYARD_AUTH_DISABLED=true
TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")


def out(*parts: object) -> None:
    """Print and flush (tables are read while a long benchmark still runs)."""
    print(*parts, flush=True)  # noqa: T201


def note(message: str) -> None:
    """A progress line on stderr, so stdout stays the table and the headline."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)  # noqa: T201


# --- arguments and deadlines ---------------------------------------------------------------


def base_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The flags every benchmark takes."""
    parser = argparse.ArgumentParser(
        prog=f"python -m bench.{name}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="database to use as it is (default: $RUNYARD_DATABASE_URL, else a fresh database "
        f"bench_{name}_* made on --server-url, or on an embedded Postgres when that is not "
        "given either; dropped at the end)",
    )
    parser.add_argument(
        "--server-url",
        default=None,
        help=f"a Postgres server on which to make the fresh database (e.g. {LOOPBACK_SERVER}); "
        "default: an embedded one (pgserver, the 'embedded' extra) in a temporary directory, "
        "removed at the end",
    )
    parser.add_argument("--keep-db", action="store_true", help="do not drop the fresh database")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=900.0,
        help="hard bound on the whole benchmark in seconds (default 900)",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a database host that is not loopback (benchmarks are loopback-only)",
    )
    return parser


class Deadline:
    """A monotonic deadline for the whole benchmark."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.seconds = seconds

    def left(self) -> float:
        """Seconds left (may be negative)."""
        return self.at - time.monotonic()

    def check(self, what: str) -> None:
        """Raise if the benchmark ran out of time."""
        if self.left() <= 0:
            raise TimeoutError(f"benchmark time limit ({self.seconds:.0f} s) reached during {what}")


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, step: float = 0.05
) -> float:
    """Poll ``condition`` until true; returns the seconds it took; raises on timeout."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)
    return time.monotonic() - start


def wait_for_count(
    count: Callable[[], int], target: int, timeout: float, what: str, finest: float = 0.002
) -> float:
    """Wait until ``count()`` reaches ``target``; the seconds it took; raises on timeout.

    It sleeps a quarter of the time the progress so far says is left (at most 0.05 s, at
    least ``finest``): a few dozen wake-ups a second while much is left, and the end seen
    within ``finest``. A fixed fine step would cost the process measured around it real CPU
    (some 20 ms a second at 2 ms on a slow core) and take the GIL from the threads it waits
    for.
    """
    start = time.monotonic()
    while (done := count()) < target:
        elapsed = time.monotonic() - start
        if elapsed > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        left = elapsed / done * (target - done) if done else 0.05
        time.sleep(min(0.05, max(finest, left / 4)))
    return time.monotonic() - start


# --- databases ------------------------------------------------------------------------------


def libpq(url: str) -> str:
    """A URL psycopg accepts (no SQLAlchemy driver suffix)."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def check_loopback(url: str, allow_remote: bool) -> None:
    """Benchmarks send traffic to loopback only unless told otherwise."""
    host = urlsplit(libpq(url)).hostname or ""
    if host not in LOOPBACK_HOSTS and not host.startswith("/") and not allow_remote:
        raise SystemExit(
            f"refusing database host {host!r}: benchmarks talk to loopback only "
            "(pass --allow-remote to override)"
        )


@dataclass(frozen=True)
class DatabaseChoice:
    """Where a benchmark's database comes from: ``url`` is the database itself (given), the
    server to make a fresh one on (server), or None (embedded: a Postgres of its own)."""

    kind: Literal["given", "server", "embedded"]
    url: str | None


def choose_database(
    database_url: str | None, server_url: str | None, env: Mapping[str, str]
) -> DatabaseChoice:
    """``--database-url``, else ``$RUNYARD_DATABASE_URL``, else a fresh database on
    ``--server-url``, else an embedded Postgres: a benchmark run with no flags needs no
    server of its own."""
    given = database_url or env.get("RUNYARD_DATABASE_URL") or None
    if given:
        return DatabaseChoice("given", given)
    if server_url:
        return DatabaseChoice("server", server_url)
    return DatabaseChoice("embedded", None)


def start_embedded_postgres() -> tuple[str, Callable[[], None]]:
    """A throwaway Postgres (pgserver) in a temporary directory: its URL and how to remove it."""
    try:
        with warnings.catch_warnings():  # its import warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from pgserver.postgres_server import get_server
    except ImportError as exc:
        raise SystemExit(
            "no database given and no embedded Postgres to start: install the 'embedded' extra "
            "(pip install -e '.[embedded]'), or pass --server-url or --database-url"
        ) from exc
    parent = Path(tempfile.mkdtemp(prefix="runyard-bench-pg-"))
    note(f"no database given: starting an embedded Postgres in {parent}")
    server = get_server(parent / "pgdata", cleanup_mode="delete")

    def remove() -> None:
        server.cleanup()
        shutil.rmtree(parent, ignore_errors=True)

    return str(server.get_uri()), remove


def _fresh_database(server_url: str, bench: str) -> tuple[str, str]:
    """Create ``bench_<bench>_<stamp>`` on the server; its name and URL."""
    import psycopg

    name = f"bench_{bench}_{time.strftime('%Y%m%d%H%M%S')}_{os.getpid()}"
    with psycopg.connect(libpq(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(libpq(server_url))
    return name, urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


@dataclass
class BenchDatabase:
    """The database a benchmark writes to: given, or created fresh and dropped at the end."""

    url: str
    owned: bool
    server_url: str = ""
    name: str = ""
    stop_server: Callable[[], None] | None = None

    @classmethod
    def open(cls, args: argparse.Namespace, bench: str) -> BenchDatabase:
        """The database ``choose_database`` picks (a fresh one is made); migrated."""
        from runyard.platform.db import migrate

        choice = choose_database(args.database_url, args.server_url, os.environ)
        stop_server: Callable[[], None] | None = None
        if choice.kind == "given":
            assert choice.url is not None
            check_loopback(choice.url, args.allow_remote)
            db = cls(url=libpq(choice.url), owned=False)
        else:
            if choice.url is not None:
                check_loopback(choice.url, args.allow_remote)
                server_url = libpq(choice.url)
            else:
                server_url, stop_server = start_embedded_postgres()
            name, url = _fresh_database(server_url, bench)
            db = cls(url, owned=True, server_url=server_url, name=name, stop_server=stop_server)
            note(f"created database {name}")
        migrate(db.url)
        return db

    def close(self, keep: bool = False) -> None:
        """Drop the database if this benchmark created it; stop an embedded server."""
        if not self.owned:
            return
        if keep and self.stop_server is None:
            note(f"kept database {self.name}: {self.url}")
            return
        if keep:
            note("--keep-db: the embedded Postgres is removed all the same (use --server-url)")
        import psycopg

        try:
            with psycopg.connect(self.server_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        except psycopg.Error as exc:
            note(f"could not drop database {self.name}: {exc}")
        if self.stop_server is not None:
            self.stop_server()

    def sqlalchemy_url(self) -> str:
        """The same database with the psycopg 3 driver named."""
        return "postgresql+psycopg://" + self.url[len("postgresql://") :]


# --- child processes ------------------------------------------------------------------------


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Procs:
    """Child processes started by a benchmark; ``close`` ends exactly those, by pid."""

    logs: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="runyard-bench-")))
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    base_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        atexit.register(self.close)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The parent's environment without RUNYARD_*, plus the benchmark's settings."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
        return {**base, **self.base_env, **(extra or {})}

    def spawn(self, name: str, argv: Sequence[str], extra: dict[str, str] | None = None) -> int:
        """Start ``python <argv>`` from the repository root; returns its pid."""
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, *argv], env=self.env(extra), stdout=log, stderr=log, cwd=ROOT
        )
        log.close()
        self.procs[name] = proc
        return proc.pid

    def pid(self, name: str) -> int:
        """The pid of a started process."""
        return self.procs[name].pid

    def alive(self, name: str) -> bool:
        """Whether the process is still running."""
        return self.procs[name].poll() is None

    def kill9(self, name: str) -> None:
        """SIGKILL and reap."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self, name: str, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
        proc = self.procs.get(name)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
        return proc.returncode

    def log_tail(self, name: str, lines: int = 20) -> str:
        """The last lines a process wrote."""
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        """Stop every process still running (SIGCONT first, in case one is stopped)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)

    def cleanup_logs(self) -> None:
        """Remove the log directory (kept when a benchmark fails, for diagnosis)."""
        shutil.rmtree(self.logs, ignore_errors=True)

    def keep_logs_if(self, failed: bool) -> None:
        """Keep the logs of a failed benchmark (and say where), else remove them."""
        if failed:
            note(f"logs kept in {self.logs}")
        else:
            self.cleanup_logs()


def install_signal_cleanup() -> None:
    """SIGTERM/SIGINT end the benchmark through the normal cleanup path (atexit/finally)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def write_tools_file(directory: Path, tools: dict[str, dict[str, Any]]) -> Path:
    """A tool registry TOML with the given tools (values: str, int, float, list of str)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"unsupported TOML value {v!r}")

    lines: list[str] = []
    for name, entry in tools.items():
        lines.append(f"[tools.{name}]")
        lines.extend(f"{key} = {value(v)}" for key, v in entry.items())
        lines.append("")
    path = directory / "bench-tools.toml"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# --- a small HTTP client (keep-alive, no dependency) ---------------------------------------


class Http:
    """One keep-alive connection to the API on loopback; reconnects once on a broken one."""

    def __init__(self, port: int, headers: dict[str, str] | None = None, timeout: float = 120):
        self._port = port
        self._timeout = timeout
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Send and read one request; returns (status, parsed JSON or text)."""
        payload = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(
                    "127.0.0.1", self._port, timeout=self._timeout
                )
            try:
                self._conn.request(method, path, body=payload, headers=self._headers)
                response = self._conn.getresponse()
                raw = response.read()
                break
            except (http.client.HTTPException, ConnectionError, OSError):
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise
        try:
            data: Any = json.loads(raw) if raw else None
        except ValueError:
            data = raw.decode(errors="replace")
        return response.status, data

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def wait_for_api(port: int, procs: Procs, name: str, timeout: float = 60.0) -> float:
    """Wait until ``GET /readyz`` answers 200 (the process must stay alive); returns seconds."""

    def ready() -> bool:
        if not procs.alive(name):
            raise RuntimeError(f"{name} exited early:\n{procs.log_tail(name)}")
        try:
            status, _ = Http(port, timeout=2).request("GET", "/readyz")
        except OSError:
            return False
        return status == 200

    return wait_until(ready, timeout, f"{name} to be ready", step=0.1)


# --- statistics and tables ------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    """The 50th percentile."""
    return percentile(values, 50)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (so it pastes into docs/benchmarks.md as it is)."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            if math.isnan(v):
                return "-"
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    text_rows = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text_rows)) for i, h in enumerate(headers)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for r in text_rows:
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
    return "\n".join(lines)


# --- the machine ----------------------------------------------------------------------------


def _run(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def machine_info(database_url: str | None = None) -> dict[str, str]:
    """nproc, memory, kernel, Docker and Postgres versions, load average."""
    info: dict[str, str] = {
        "nproc": str(os.cpu_count()),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory"] = f"{int(line.split()[1]) // 1024} MiB"
        model = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        if model:
            info["cpu"] = model[0]
    info["docker"] = _run(["docker", "version", "--format", "{{.Server.Version}}"])
    if database_url:
        with contextlib.suppress(Exception):
            import psycopg

            with psycopg.connect(libpq(database_url), connect_timeout=5) as conn:
                row = conn.execute("SHOW server_version").fetchone()
                info["postgres"] = str(row[0]) if row else "?"
    info["loadavg"] = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    return info


def load_line() -> str:
    """The load average now (other work on this machine shows up here)."""
    return "load average now: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def print_machine(database_url: str | None) -> dict[str, str]:
    """One line describing the machine, at the top of every benchmark."""
    info = machine_info(database_url)
    out("machine: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    return info


# --- processes' memory ----------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile (kB) of a process, from /proc."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "Threads"):
            values[key] = int(rest.split()[0])
    return values


def children_of(pid: int) -> list[int]:
    """Direct children of a process (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found.append(int(entry.name))
    return found


# --- Docker ---------------------------------------------------------------------------------


def docker_client() -> Any:
    """A docker-py client the standard way (DOCKER_HOST or the local socket)."""
    import docker

    return docker.from_env(timeout=60)


def remove_containers_of(
    client: Any, run_ids: Sequence[uuid.UUID], workdir_root: Path | None = None
) -> int:
    """Remove leftover containers, volumes and host work directories of the given runs (only
    those). Uses the plain listing (no inspect per container), so containers removed meanwhile
    by someone else do not fail the cleanup. A worker stopped mid-run hands its attempts over
    and leaves their directories under ``workdir_root`` (the workers' default root)."""
    from runyard.domain.attempt import container_name
    from runyard.runner import RunnerUnavailable
    from runyard.runners.docker.host_workdirs import HostWorkdirs
    from runyard.runners.docker.inputs import DEFAULT_ROOT

    wanted = {str(r) for r in run_ids}
    removed = 0
    label = {"label": "io.runyard.managed=true"}
    for entry in client.api.containers(all=True, filters=label):
        if (entry.get("Labels") or {}).get("io.runyard.run_id") in wanted:
            with contextlib.suppress(Exception):
                client.api.remove_container(entry["Id"], force=True)
                removed += 1
    for volume in (client.api.volumes(filters=label) or {}).get("Volumes") or []:
        if (volume.get("Labels") or {}).get("io.runyard.run_id") in wanted:
            with contextlib.suppress(Exception):
                client.api.remove_volume(volume["Name"], force=True)
    workdirs = HostWorkdirs(workdir_root or Path(DEFAULT_ROOT))
    with contextlib.suppress(OSError):
        for run_id, attempt in workdirs.attempts():
            if str(run_id) in wanted:
                with contextlib.suppress(RunnerUnavailable):
                    workdirs.remove(container_name(run_id, attempt))
    return removed


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    """``with timed() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    box: list[float] = []
    start = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - start)


# --- CPU accounting -------------------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores; idle and iowait excluded)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


class BackendCpu:
    """CPU seconds used by the Postgres backends of one database, sampled from /proc.

    The server on loopback may be shared, so its own counters would mix in other databases'
    work: this samples the pids connected to our database (every ``interval`` seconds) and
    keeps the last CPU reading of each, so a backend that exits is counted up to its last
    sample. Works when Postgres runs on this host; otherwise ``total`` is NaN.
    """

    def __init__(self, database_url: str, interval: float = 0.1) -> None:
        self._url = libpq(database_url)
        self._interval = interval
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ok = True
        # The sampler thread's own CPU so far (it runs in the measuring process, whose CPU a
        # benchmark may report: ``own_cpu_s`` lets it leave this part out).
        self._own_cpu_s = 0.0

    def _sample(self, conn: Any) -> None:
        pids = [
            r[0]
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        ]
        for pid in pids:
            try:
                fields = _stat_fields(int(pid))
            except (OSError, ValueError):
                continue
            self._seen[int(pid)] = (int(fields[11]) + int(fields[12])) / _CLK_TCK
        self._own_cpu_s = time.thread_time()

    def _run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self._url, autocommit=True, connect_timeout=5) as conn:
                while True:
                    self._sample(conn)
                    if self._stop.wait(self._interval):
                        self._sample(conn)
                        return
        except (OSError, psycopg.Error):
            self._ok = False

    def __enter__(self) -> BackendCpu:
        self._thread = threading.Thread(target=self._run, name="bench-backend-cpu", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def begin(self) -> dict[int, float]:
        """A snapshot to subtract: the CPU already used by backends alive now."""
        return dict(self._seen)

    def own_cpu_s(self) -> float:
        """CPU seconds the sampler thread itself has used, as of its last sample."""
        return self._own_cpu_s

    def used_since(self, snapshot: dict[int, float]) -> float:
        """CPU seconds used since ``snapshot`` by our database's backends."""
        if not self._ok or not self._seen:
            return math.nan
        return sum(cpu - snapshot.get(pid, 0.0) for pid, cpu in self._seen.items())


def process_cpu_seconds(pid: int, *, reaped_children: bool = False) -> float:
    """utime + stime of one process (all its threads); with ``reaped_children``, plus what
    the children it has waited for used."""
    fields = _stat_fields(pid)
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _CLK_TCK


def pids_named(*names: str) -> list[int]:
    """The pids of the processes whose command name is one of ``names``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in names:
                    found.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile
    return found


# --- sampling profiles (py-spy) -------------------------------------------------------------


def start_py_spy(
    pid: int, seconds: float, path: Path, rate: int = 250
) -> subprocess.Popen[bytes] | None:
    """Start ``py-spy record`` on a process: collapsed stacks of the thread holding the GIL
    (where the process spends CPU in Python), full file names."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        note("py-spy not installed (pip install -e '.[bench]'): no profile")
        return None
    return subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(max(1, seconds))),
            "--rate",
            str(rate),
            "--format",
            "raw",
            "--output",
            str(path),
            "--nonblocking",
            "--full-filenames",
            "--gil",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _library_of(frame: str) -> str:
    location = frame.rsplit("(", 1)[-1]
    if "/sqlalchemy/" in location:
        return "SQLAlchemy"
    if "/psycopg/" in location or "psycopg_pool" in location:
        return "psycopg"
    if "/fastapi/" in location or "/starlette/" in location:
        return "FastAPI/Starlette"
    if "/pydantic" in location:
        return "pydantic"
    if "/uvicorn/" in location or "/h11/" in location or "/httptools/" in location:
        return "uvicorn/h11"
    if "/anyio/" in location or "/asyncio/" in location or "concurrent/futures" in location:
        return "anyio/asyncio/threads"
    if "/jsonschema" in location or "/referencing/" in location or "/rpds" in location:
        return "jsonschema"
    if "/logging/" in location or "/runyard/platform/logs.py" in location:
        return "logging"
    if "/docker/" in location or "/requests/" in location or "/urllib3/" in location:
        return "docker-py/requests"
    for own in ("/runyard/", "/api/", "/worker/", "/reaper/"):
        if own in location:
            return "runyard (" + own.strip("/") + ")"
    if "site-packages" in location:
        return "other libraries"
    return "stdlib/other"


def summarize_py_spy(
    path: Path, top: int = 12
) -> tuple[list[tuple[str, float]], list[tuple[str, float]], int]:
    """Self samples by library and by function (percent), from a collapsed-stack file."""
    by_lib: dict[str, int] = {}
    by_func: dict[str, int] = {}
    total = 0
    if not path.exists():
        return [], [], 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        leaf = frames[-1]
        # Attribute the sample to the innermost frame and to the library that frame lives in.
        total += count
        by_lib[_library_of(leaf)] = by_lib.get(_library_of(leaf), 0) + count
        name = leaf.split(" (", 1)[0] + " (" + leaf.rsplit("/", 1)[-1] if "(" in leaf else leaf
        by_func[name] = by_func.get(name, 0) + count
    libs = sorted(((k, v / total * 100) for k, v in by_lib.items()), key=lambda kv: -kv[1])
    funcs = sorted(((k, v / total * 100) for k, v in by_func.items()), key=lambda kv: -kv[1])
    return libs, funcs[:top], total


def inclusive_top(path: Path, prefixes: Sequence[str], top: int = 15) -> list[tuple[str, float]]:
    """Percent of samples whose stack passes through each frame of our own code (inclusive
    time), for frames whose file is under one of ``prefixes``."""
    hits: dict[str, int] = {}
    total = 0
    if not path.exists():
        return []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        seen = set()
        for frame in stack.split(";"):
            location = frame.rsplit("(", 1)[-1]
            if any(p in location for p in prefixes):
                name = (
                    frame.split(" (", 1)[0]
                    + " ("
                    + location.rsplit("/", 2)[-2]
                    + "/"
                    + location.rsplit("/", 1)[-1].split(":")[0]
                    + ")"
                )
                if name not in seen:
                    seen.add(name)
                    hits[name] = hits.get(name, 0) + count
    ranked = sorted(hits.items(), key=lambda kv: -kv[1])[:top]
    return [(k, v / total * 100 if total else 0.0) for k, v in ranked]


# --- runyard's named statements -------------------------------------------------------------

NOW_SQL = "coalesce(CAST(:now AS timestamptz), now())"


def statement_modules() -> list[Any]:
    """The modules that hold runyard's named queue statements (they moved once already)."""
    import importlib

    found = []
    for name in ("runyard.queue.sql", "runyard.queue.batch_sql", "runyard.queue"):
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            continue
    return found


def queue_statement(name: str) -> Any:
    """A named statement of runyard's queue (``ENQUEUE``, ``CLAIM``, ...), wherever it lives."""
    for module in statement_modules():
        value = getattr(module, name, None)
        if value is not None and hasattr(value, "compile"):
            return value
    raise AttributeError(f"runyard has no queue statement {name}")


def sql_text(statement: str) -> Any:
    """A statement written like runyard's (``{NOW}`` = injected-or-database clock)."""
    from sqlalchemy import text

    return text(statement.replace("{NOW}", NOW_SQL))


def psycopg_sql(statement: Any) -> str:
    """A SQLAlchemy text statement compiled for plain psycopg (``%(name)s`` parameters)."""
    from sqlalchemy.dialects.postgresql import psycopg as pg_dialect

    return str(statement.compile(dialect=pg_dialect.dialect()))  # type: ignore[no-untyped-call]
