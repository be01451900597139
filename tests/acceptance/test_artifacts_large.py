"""A real worker keeps 500 files (about 91 MB) from one run in the Postgres store; the API
lists them and serves each, and the tar of all, byte-identical to what the tool wrote (the
tool's own sha256sum is the witness). The worker's memory never grows by the set's size."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.acceptance.cluster import Cluster, Expected
from tests.integration.api.test_api_helpers import bearer, make_app

pytestmark = pytest.mark.docker

FILES = 500
# File i holds 180000 + 8 i random bytes: 90,998,000 bytes in all, under the 100 MB default.
TOTAL = FILES * 180_000 + 8 * sum(range(FILES))
MAKE = (
    "cd /runyard/out && i=0; while [ $i -lt 500 ]; do d=d$((i % 10)); mkdir -p $d; "
    "head -c $((180000 + i * 8)) /dev/urandom > $d/f$i.bin; i=$((i + 1)); done; "
    "find . -type f | sort | xargs sha256sum"
)


@pytest.fixture
def api(cluster: Cluster) -> Iterator[TestClient]:
    with TestClient(make_app(cluster.database_url, cluster.engine, cluster.registry)) as client:
        yield client


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_artifacts__500_files_90_mb_listed_and_downloaded_byte_identical(
    cluster: Cluster, api: TestClient
):
    cluster.start_worker("w-artifacts", concurrency=1)
    warmup = cluster.submit("echo", {}, Expected("succeeded", exit_code=0))
    cluster.wait_for(lambda: cluster.status(warmup) == "succeeded", 60, "the warm-up run")
    pid = cluster.procs["w-artifacts"].pid
    before = peak_rss_kib(pid)

    run_id = cluster.submit("shell", {"script": MAKE}, Expected("succeeded", exit_code=0))
    cluster.wait_for(lambda: cluster.status(run_id) == "succeeded", 180, "the large run")
    grown_mib = (peak_rss_kib(pid) - before) / 1024
    assert grown_mib < 48, f"the worker's peak memory grew by {grown_mib:.0f} MiB"

    witness = {}
    for line in str(cluster.run_row(run_id).stdout).splitlines():
        digest, _, name = line.partition("  ")
        witness[name.removeprefix("./")] = digest
    assert len(witness) == FILES

    admin = bearer(cluster.engine, "root", admin=True)
    listing = api.get(f"/v1/runs/{run_id}/artifacts", headers=admin).json()
    assert (listing["count"], listing["total_bytes"]) == (FILES, TOTAL)
    assert {a["path"]: a["sha256"] for a in listing["artifacts"]} == witness
    for artifact in listing["artifacts"]:
        body = api.get(artifact["url"], headers=admin).content
        assert len(body) == artifact["size"]
        assert hashlib.sha256(body).hexdigest() == witness[artifact["path"]], artifact["path"]

    tar_bytes = api.get(f"/v1/runs/{run_id}/artifacts.tar", headers=admin).content
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        from_tar = {
            member.name: hashlib.sha256(tar.extractfile(member).read()).hexdigest()  # type: ignore[union-attr]
            for member in tar
        }
    assert from_tar == witness
    cluster.check_invariants()
