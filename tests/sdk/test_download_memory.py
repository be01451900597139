"""A download streams to disk: 48 MiB through either flavour allocate a small fraction of
that (tracemalloc's peak), and the file arrives whole with its SHA-256 checked. The server
here is a transport that makes the bytes as they are read, so only the client is measured
(``bench/sdk_download.py`` does 1 GiB against the real API and measures the RSS). The async
flavour writes, hashes and makes directories on worker threads, never on its event loop."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import threading
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

import runyard_client._async_client as async_client
from runyard_client import AsyncRunyard, Runyard
from runyard_client._files import VerifiedFile

MIB = 1 << 20
PIECE = 64 * 1024
SIZE = 48 * MIB
RUN_ID = "00000000-0000-0000-0000-000000000001"
URL = f"/v1/runs/{RUN_ID}/artifacts/big.bin"
# The peak the download path may allocate: far below the file's size.
BOUND = 4 * MIB


def piece(index: int) -> bytes:
    """The index-th 64 KiB of the file: different from its neighbours, made on demand."""
    return index.to_bytes(8, "big") * (PIECE // 8)


def content() -> Iterator[bytes]:
    return (piece(i) for i in range(SIZE // PIECE))


def digest() -> str:
    sha = hashlib.sha256()
    for chunk in content():
        sha.update(chunk)
    return sha.hexdigest()


class Generated(httpx2.SyncByteStream, httpx2.AsyncByteStream):
    """A body made while it is read."""

    def __iter__(self) -> Iterator[bytes]:
        return content()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in content():
            yield chunk


class ArtifactServer(httpx2.BaseTransport, httpx2.AsyncBaseTransport):
    """Answers the artifact list and streams the one artifact."""

    def __init__(self, sha256: str) -> None:
        self.sha256 = sha256

    def answer(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path == URL:
            headers = {"content-type": "application/octet-stream", "content-length": str(SIZE)}
            return httpx2.Response(200, headers=headers, stream=Generated())
        listing = {
            "run_id": RUN_ID,
            "count": 1,
            "total_bytes": SIZE,
            "tar_url": f"/v1/runs/{RUN_ID}/artifacts.tar",
            "artifacts": [{"path": "big.bin", "size": SIZE, "sha256": self.sha256, "url": URL}],
        }
        return httpx2.Response(200, content=json.dumps(listing).encode())

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        return self.answer(request)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return self.answer(request)


@pytest.fixture(scope="module")
def sha256() -> str:
    return digest()


def peak_while(run: object) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        assert callable(run)
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_download__sync_streams_with_a_small_peak(sha256: str, tmp_path: Path):
    with Runyard("http://artifacts.test", transport=ArtifactServer(sha256)) as client:
        target = tmp_path / "big.bin"
        peak = peak_while(lambda: client.download(RUN_ID, "big.bin", target))
    assert target.stat().st_size == SIZE
    assert peak < BOUND, f"the download allocated {peak / MIB:.1f} MiB at its peak"


def test_download__async_streams_with_a_small_peak(sha256: str, tmp_path: Path):
    async def download() -> None:
        async with AsyncRunyard(
            "http://artifacts.test", transport=ArtifactServer(sha256)
        ) as client:
            await client.download(RUN_ID, "big.bin", tmp_path / "big.bin")

    peak = peak_while(lambda: asyncio.run(download()))
    assert (tmp_path / "big.bin").stat().st_size == SIZE
    assert peak < BOUND, f"the download allocated {peak / MIB:.1f} MiB at its peak"


def test_download__async_writes_hashes_and_makes_directories_off_the_event_loop(
    sha256: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    threads: dict[str, set[int]] = {}

    def spied(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def run(*args: Any, **kwargs: Any) -> Any:
            threads.setdefault(name, set()).add(threading.get_ident())
            return call(*args, **kwargs)

        return run

    for method in ("__init__", "begin", "write", "finish"):
        monkeypatch.setattr(VerifiedFile, method, spied(method, getattr(VerifiedFile, method)))
    for name in ("plan", "make_parents", "destination"):
        monkeypatch.setattr(async_client, name, spied(name, getattr(async_client, name)))

    async def download() -> int:
        async with AsyncRunyard(
            "http://artifacts.test", transport=ArtifactServer(sha256)
        ) as client:
            await client.download(RUN_ID, "big.bin", tmp_path / "one.bin")
            await client.download_all(RUN_ID, tmp_path / "all")
        return threading.get_ident()

    loop_thread = asyncio.run(download())
    assert set(threads) == {
        "__init__",
        "begin",
        "write",
        "finish",
        "plan",
        "make_parents",
        "destination",
    }
    assert all(loop_thread not in seen for seen in threads.values()), threads
    assert (tmp_path / "all" / "big.bin").stat().st_size == SIZE
