"""``runyard-client`` installs on its own: a fresh virtualenv (no system site packages) gets
the client and its few dependencies, and nothing of the server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = {
    "runyard",
    "docker",
    "sqlalchemy",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "fastapi",
    "starlette",
    "uvicorn",
    "alembic",
    "prometheus-client",
}
# What the installed client reports about itself.
REPORT = """
import importlib.metadata as md, json, runyard_client, runyard_client.testing
print(json.dumps({
    "version": runyard_client.__version__,
    "requires": md.requires("runyard-client") or [],
    "installed": sorted(d.metadata["Name"].lower() for d in md.distributions()),
}))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_install__a_fresh_venv_gets_the_client_and_no_server_dependency(tmp_path: Path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--disable-pip-version-check", str(ROOT / "sdk/python")],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    found = subprocess.run(
        [python, "-I", "-c", REPORT],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=tmp_path,
    )
    report = json.loads(found.stdout)
    assert report["version"] == "0.1.0"
    direct = [line for line in report["requires"] if "extra ==" not in line]
    assert 1 <= len(direct) <= 4, direct
    assert not SERVER_ONLY & set(report["installed"]), report["installed"]
    assert {"runyard-client", "httpx2", "pydantic"} <= set(report["installed"])


def test_version__the_package_and_its_metadata_agree():
    import tomllib

    import runyard_client

    project = tomllib.loads((ROOT / "sdk/python/pyproject.toml").read_text())["project"]
    assert project["version"] == runyard_client.__version__ == "0.1.0"
    assert len(project["dependencies"]) <= 4
