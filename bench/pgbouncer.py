"""A PgBouncer of the benchmark's (or test's) own: transaction pooling on a free loopback port.

Its config lives in a temporary directory; ``stop`` ends exactly the process started here and
removes the directory. The executable comes from ``scripts/ensure-pgbouncer`` (Debian's
package); the system service is never used.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

SEARCH_PATH = "/usr/sbin:/usr/local/sbin:/usr/bin:/usr/local/bin"


def find_pgbouncer() -> str | None:
    """``$RUNYARD_PGBOUNCER``, else ``pgbouncer`` on PATH or in the sbin directories."""
    named = os.environ.get("RUNYARD_PGBOUNCER")
    if named:
        return named if os.access(named, os.X_OK) else None
    return shutil.which("pgbouncer", path=os.environ.get("PATH", "") + ":" + SEARCH_PATH)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class PgBouncer:
    """A running pgbouncer in front of one Postgres server."""

    port: int
    user: str
    password: str
    directory: Path
    proc: subprocess.Popen[bytes]
    stopped: bool = field(default=False)

    def url(self, database: str) -> str:
        """A libpq URL of ``database`` through the pooler."""
        auth = quote(self.user, safe="")
        if self.password:
            auth += ":" + quote(self.password, safe="")
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def show(self, what: str) -> list[dict[str, str]]:
        """``SHOW <what>`` on the admin console (simple query protocol, as it wants)."""
        import psycopg

        with psycopg.connect(self.url("pgbouncer"), autocommit=True, connect_timeout=5) as conn:
            return console_rows(conn, what)

    def log(self) -> str:
        """What pgbouncer wrote so far."""
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """End the process (SIGINT: immediate shutdown) and remove the directory."""
        if self.stopped:
            return
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)


def console_rows(conn: Any, what: str) -> list[dict[str, str]]:
    """``SHOW <what>`` on an admin console connection, through libpq's simple query protocol
    (the console answers no other)."""
    result = conn.pgconn.exec_(f"SHOW {what}".encode())
    names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    return [
        {name: (result.get_value(r, c) or b"").decode() for c, name in enumerate(names)}
        for r in range(result.ntuples)
    ]


def _server_of(server_url: str) -> dict[str, str]:
    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(server_url).items() if v is not None}
    return params


def _run_as(host: str) -> str | None:
    """pgbouncer will not run as root: as root, the owner of a socket directory (who can reach
    the socket), else ``nobody``."""
    if os.getuid() != 0:
        return None
    if host.startswith("/"):
        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    return "nobody"


def start_pgbouncer(
    server_url: str,
    *,
    pool_size: int = 20,
    max_client_conn: int = 2000,
    executable: str | None = None,
) -> PgBouncer:
    """Start pgbouncer in transaction mode in front of the server of ``server_url`` (any
    database on it passes through), wait until it answers, and return it."""
    exe = executable or find_pgbouncer()
    if exe is None:
        raise FileNotFoundError("no pgbouncer executable (scripts/ensure-pgbouncer installs it)")
    server = _server_of(server_url)
    host = server.get("host", "127.0.0.1")
    user = server.get("user", "postgres")
    password = server.get("password", "")
    directory = Path(tempfile.mkdtemp(prefix="runyard-pgbouncer-"))
    directory.chmod(0o755)  # readable by the unprivileged user it runs as
    port = _free_port()
    target = f"host={host} port={server.get('port', '5432')}"
    if password:
        target += f" password={_quote(password)}"
    (directory / "userlist.txt").write_text(f'"{user}" "{password}"\n')
    settings = {
        "listen_addr": "127.0.0.1",
        "listen_port": str(port),
        "unix_socket_dir": "",
        "auth_type": "trust",
        "auth_file": str(directory / "userlist.txt"),
        "admin_users": user,
        "pool_mode": "transaction",
        "max_client_conn": str(max_client_conn),
        "default_pool_size": str(pool_size),
        "reserve_pool_size": "0",
        "server_lifetime": "3600",
        "ignore_startup_parameters": "extra_float_digits",
        "pidfile": "",
    }
    run_as = _run_as(host)
    if run_as is not None:
        settings["user"] = run_as
    lines = ["[databases]", f"* = {target}", "", "[pgbouncer]"]
    lines += [f"{k} = {v}" for k, v in settings.items()]
    config = directory / "pgbouncer.ini"
    config.write_text("\n".join(lines) + "\n")
    for path in directory.iterdir():
        path.chmod(0o644)
    log = (directory / "pgbouncer.log").open("ab")  # it logs to stderr
    proc = subprocess.Popen([exe, str(config)], stdout=log, stderr=log, start_new_session=True)
    log.close()
    bouncer = PgBouncer(port, user, password, directory, proc)
    deadline = time.monotonic() + 15
    while True:
        if proc.poll() is not None:
            text = bouncer.log()
            bouncer.stop()
            raise RuntimeError(f"pgbouncer exited at start ({proc.returncode}):\n{text}")
        with contextlib.suppress(Exception):
            bouncer.show("VERSION")
            return bouncer
        if time.monotonic() > deadline:
            text = bouncer.log()
            bouncer.stop()
            raise RuntimeError(f"pgbouncer did not answer within 15 s:\n{text}")
        time.sleep(0.1)
