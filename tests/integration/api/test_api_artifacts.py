"""The artifact routes against real Postgres, with sync-mode runs whose fake tool keeps files:
the list, downloads (whole, ranges, 416), the tar, tenancy, non-terminal runs, deletion."""

from __future__ import annotations

import hashlib
import html
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_api_helpers import bearer, count, live_server, make_app
from tests.integration.api.test_ui_http import log_in

BIG = os.urandom(3 * (1 << 20) + 12345)  # several Postgres chunks and a partial one
FILES = {
    "big.bin": BIG,
    "reports/summary & notes?.txt": b"all good\n",
    "reports/empty": b"",
    "ünï/çödé #1.txt": b"unicode",
}


def keep_files(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
    assert control.artifacts is not None
    writer = control.artifacts.writer(spec.run_id)
    for path, data in FILES.items():
        writer.add(path, (data[i : i + 100_000] for i in range(0, len(data), 100_000)))
    writer.done()
    return AttemptResult(RunStatus.SUCCEEDED, exit_code=0, artifact_set=writer.set_id)


@pytest.fixture(params=["postgres", "local_dir"])
def client(
    request: pytest.FixtureRequest,
    database_url: str,
    engine: Engine,
    registry: ToolRegistry,
    tmp_path: Path,
) -> Iterator[TestClient]:
    extra: dict[str, Any] = {}
    if request.param == "local_dir":
        extra["artifacts_dir"] = str(tmp_path / "artifacts")
    app = make_app(
        database_url, engine, registry, FakeRunner(keep_files), queue_enabled=False, **extra
    )
    with TestClient(app) as test_client:
        yield test_client


def finished(client: TestClient, headers: dict[str, str]) -> str:
    response = client.post(
        "/v1/runs", params={"wait": 30}, json={"tool": "echo", "input": {}}, headers=headers
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "succeeded"
    return str(response.json()["id"])


def test_artifacts__listed_with_hashes_and_urls_then_downloaded_byte_identical(
    client: TestClient, engine: Engine
):
    acme = bearer(engine, "acme")
    run_id = finished(client, acme)
    listing = client.get(f"/v1/runs/{run_id}/artifacts", headers=acme)
    assert listing.status_code == 200, listing.text
    body = listing.json()
    assert body["count"] == 4 and body["total_bytes"] == sum(map(len, FILES.values()))
    assert body["tar_url"] == f"/v1/runs/{run_id}/artifacts.tar"
    assert [a["path"] for a in body["artifacts"]] == sorted(FILES)
    for artifact in body["artifacts"]:
        data = FILES[artifact["path"]]
        assert artifact["sha256"] == hashlib.sha256(data).hexdigest()
        assert artifact["url"] == f"/v1/runs/{run_id}/artifacts/{quote(artifact['path'])}"
        download = client.get(artifact["url"], headers=acme)
        assert download.status_code == 200
        assert download.content == data
        assert download.headers["content-type"] == "application/octet-stream"
        assert download.headers["content-length"] == str(len(data))
        assert download.headers["etag"] == f'"{artifact["sha256"]}"'
        assert download.headers["accept-ranges"] == "bytes"


@pytest.mark.parametrize(
    ("header", "start", "stop"),
    [
        ("bytes=0-0", 0, 1),
        ("bytes=1048570-1048600", 1048570, 1048601),  # across the first chunk boundary
        ("bytes=2097000-", 2097000, len(BIG)),
        ("bytes=-5000", len(BIG) - 5000, len(BIG)),
    ],
)
def test_artifacts__a_range_answers_206_with_just_those_bytes(
    client: TestClient, engine: Engine, header: str, start: int, stop: int
):
    acme = bearer(engine, "acme")
    run_id = finished(client, acme)
    response = client.get(f"/v1/runs/{run_id}/artifacts/big.bin", headers={**acme, "Range": header})
    assert response.status_code == 206
    assert response.content == BIG[start:stop]
    assert response.headers["content-range"] == f"bytes {start}-{stop - 1}/{len(BIG)}"
    assert response.headers["content-length"] == str(stop - start)


def test_artifacts__a_range_past_the_end_is_416(client: TestClient, engine: Engine):
    acme = bearer(engine, "acme")
    run_id = finished(client, acme)
    response = client.get(
        f"/v1/runs/{run_id}/artifacts/big.bin", headers={**acme, "Range": f"bytes={len(BIG)}-"}
    )
    assert response.status_code == 416
    assert response.json()["code"] == "range_not_satisfiable"
    assert response.headers["content-range"] == f"bytes */{len(BIG)}"


@pytest.mark.parametrize(
    ("header", "status", "start"),
    [
        ("bytes=" + "9" * 100 + "-", 416, None),  # starts past any file
        ("bytes=" + "9" * 90 + "-" + "9" * 90, 416, None),
        ("bytes=100-" + "9" * 150, 206, 100),  # to the end
        ("bytes=-" + "9" * 150, 206, 0),  # the whole file
        ("bytes=" + "2" + "0" * 19 + "-" + "1" + "0" * 19, 200, 0),  # backwards: ignored
        ("bytes=" + "9" * 5000 + "-", 200, 0),  # longer than any one range: ignored
        ("bytes=" + " " * 16_000, 200, 0),
    ],
)
def test_artifacts__a_range_of_long_positions_is_answered_not_a_500(
    client: TestClient, engine: Engine, header: str, status: int, start: int | None
):
    acme = bearer(engine, "acme")
    run_id = finished(client, acme)
    response = client.get(f"/v1/runs/{run_id}/artifacts/big.bin", headers={**acme, "Range": header})
    assert response.status_code == status, response.text
    if start is None:
        assert response.headers["content-range"] == f"bytes */{len(BIG)}"
    else:
        assert response.content == BIG[start:]


def test_artifacts__the_tar_holds_every_file(client: TestClient, engine: Engine):
    acme = bearer(engine, "acme")
    run_id = finished(client, acme)
    response = client.get(f"/v1/runs/{run_id}/artifacts.tar", headers=acme)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-tar"
    assert response.headers["content-length"] == str(len(response.content))
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert got == FILES


def test_artifacts__another_tenants_run_and_unknown_paths_are_404(
    client: TestClient, engine: Engine
):
    acme, globex = bearer(engine, "acme"), bearer(engine, "globex")
    theirs = finished(client, globex)
    for path in ("artifacts", "artifacts.tar", "artifacts/big.bin", "artifacts/nope"):
        response = client.get(f"/v1/runs/{theirs}/{path}", headers=acme)
        assert response.status_code == 404, path
        assert response.json()["code"] == "run_not_found"
    admin = bearer(engine, "root", admin=True)
    assert client.get(f"/v1/runs/{theirs}/artifacts", headers=admin).json()["count"] == 4
    mine = finished(client, acme)
    for path in ("nope", "../big.bin", "reports", "%2e%2e/etc/passwd"):
        response = client.get(f"/v1/runs/{mine}/artifacts/{path}", headers=acme)
        assert response.status_code == 404, path
    missing = client.get(f"/v1/runs/{uuid.uuid4()}/artifacts", headers=acme)
    assert missing.json()["code"] == "run_not_found"


def test_artifacts__deleting_the_run_deletes_them(
    client: TestClient, engine: Engine, tmp_path: Path
):
    acme = bearer(engine, "acme")
    run_id = finished(client, acme)
    assert client.delete(f"/v1/runs/{run_id}", headers=acme).status_code == 204
    assert client.get(f"/v1/runs/{run_id}/artifacts", headers=acme).status_code == 404
    assert count(engine, "SELECT count(*) FROM run_artifact_chunks") == 0
    assert count(engine, "SELECT count(*) FROM run_artifacts") == 0
    assert not (tmp_path / "artifacts" / run_id).exists()


def test_artifacts__a_run_not_finished_is_409(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    with TestClient(make_app(database_url, engine, registry)) as client:
        acme = bearer(engine, "acme")
        run_id = client.post("/v1/runs", json={"tool": "echo", "input": {}}, headers=acme).json()[
            "id"
        ]
        for path in ("artifacts", "artifacts.tar", "artifacts/x"):
            response = client.get(f"/v1/runs/{run_id}/{path}", headers=acme)
            assert response.status_code == 409, path
            assert response.json()["code"] == "run_not_finished"
            assert response.json()["run_status"] == "queued"


@pytest.mark.slow  # a CLI command in a process of its own per step
def test_cli__lists_and_downloads_every_artifact_into_a_directory(
    database_url: str, engine: Engine, registry: ToolRegistry, tmp_path: Path
):
    app = make_app(database_url, engine, registry, FakeRunner(keep_files), queue_enabled=False)
    key = create_api_key(engine, "acme")
    with live_server(app) as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
        env |= {"RUNYARD_URL": url, "RUNYARD_API_KEY": key}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            command = [sys.executable, "-m", "runyard.cli", *args]
            return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

        submitted = cli("submit", "echo", "--wait", "--json")
        assert submitted.returncode == 0, submitted.stderr
        run_id = json.loads(submitted.stdout)["id"]
        listed = cli("artifacts", run_id)
        assert listed.returncode == 0, listed.stderr
        assert [line.split("  ")[-1] for line in listed.stdout.splitlines()] == sorted(FILES)
        as_json = cli("artifacts", run_id, "--json")
        sent = httpx2.get(
            f"{url}/v1/runs/{run_id}/artifacts", headers={"Authorization": f"Bearer {key}"}
        )
        assert as_json.stdout == json.dumps(sent.json(), indent=2) + "\n"  # as the API wrote it
        out = tmp_path / "got"
        fetched = cli("artifacts", run_id, "--out", str(out))
        assert fetched.returncode == 0, fetched.stderr
        assert "downloaded 4 files" in fetched.stdout
        got = {
            str(path.relative_to(out)): path.read_bytes()
            for path in out.rglob("*")
            if path.is_file()
        }
        assert got == FILES
        unknown = cli("artifacts", str(uuid.uuid4()))
        assert unknown.returncode != 0 and "no run" in unknown.stderr


def test_dashboard__run_page_lists_artifacts_with_working_links(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    app = make_app(database_url, engine, registry, FakeRunner(keep_files), queue_enabled=False)
    with TestClient(app, follow_redirects=False) as client:
        mine = finished(client, bearer(engine, "acme"))
        theirs = finished(client, bearer(engine, "globex"))
        log_in(client, create_api_key(engine, "acme"))
        page = client.get(f"/ui/runs/{mine}")
        assert page.status_code == 200
        links = re.findall(r'<a class="mono" href="([^"]+)" download>', page.text)
        assert len(links) == len(FILES)
        for link in links:
            got = client.get(html.unescape(link))
            assert got.status_code == 200, link
            assert got.content in FILES.values()
        assert f'href="/ui/runs/{mine}/artifacts.tar"' in page.text
        tar = client.get(f"/ui/runs/{mine}/artifacts.tar")
        assert tar.status_code == 200 and len(tar.content) > len(BIG)
        for path in (f"/ui/runs/{theirs}/artifacts/big.bin", f"/ui/runs/{theirs}/artifacts.tar"):
            assert client.get(path).status_code == 404
        assert client.get(f"/ui/runs/{mine}/artifacts/none").status_code == 404
