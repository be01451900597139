"""Files of a sandbox on the real engine: binary round trips, directories as tars, and the
path rules (no traversal, no link along the way)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Iterator

import pytest

from tests.integration.sandboxes.conftest import Stack

pytestmark = pytest.mark.docker


@pytest.mark.slow  # a sandbox held for seconds
def test_files__binary_round_trip_and_a_directory_as_tar(stack: Stack):
    sid = stack.create()["id"]
    payload = os.urandom(3 * 1_048_576 + 17)

    put = stack.client.put(f"/v1/sandboxes/{sid}/files/data/blob.bin", content=payload)
    got = stack.client.get(f"/v1/sandboxes/{sid}/files/data/blob.bin")
    seen = stack.run(sid, ["sh", "-c", "sha256sum data/blob.bin; ls -ld data | cut -c1-10"])
    made = stack.run(sid, ["sh", "-c", "echo made > data/note && touch data/more"])
    tar = stack.client.get(f"/v1/sandboxes/{sid}/files/data")

    assert put.status_code == 200, put.text
    assert put.json() == {"path": "data/blob.bin", "size": len(payload)}
    assert got.status_code == 200 and got.content == payload
    digest = hashlib.sha256(payload).hexdigest()
    assert seen["stdout"].split()[0] == digest and "drwxr-xr-x" in seen["stdout"]
    assert made["exit_code"] == 0  # the uploaded directory belongs to the sandbox's user
    assert tar.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(tar.content)) as archive:
        names = sorted(archive.getnames())
        note = archive.extractfile("data/note")
        assert note is not None and note.read() == b"made\n"
    assert names == ["data", "data/blob.bin", "data/more", "data/note"]


def test_files__traversal_absolute_paths_and_links_are_refused(stack: Stack):
    sid = stack.create()["id"]
    stack.run(sid, ["sh", "-c", "ln -s /etc out && ln -s /runyard/input.json in && mkdir d"])
    base = f"/v1/sandboxes/{sid}/files"

    answers = {
        "up-dots": stack.client.put(f"{base}/d%2F..%2F..%2Fescape", content=b"x"),
        "down-dots": stack.client.get(f"{base}/d%2F..%2F..%2F..%2Fetc%2Fpasswd"),
        "up-through-link": stack.client.put(f"{base}/out/evil", content=b"x"),
        "down-through-link": stack.client.get(f"{base}/out/passwd"),
        "down-link": stack.client.get(f"{base}/in"),
    }
    missing = stack.client.get(f"{base}/nothing-here")

    codes = {name: (a.status_code, a.json()["code"]) for name, a in answers.items()}
    assert codes == {
        "up-dots": (422, "invalid_path"),
        "down-dots": (422, "invalid_path"),
        "up-through-link": (422, "link_in_path"),
        "down-through-link": (422, "link_in_path"),
        "down-link": (422, "link_in_path"),
    }
    assert missing.status_code == 404 and missing.json()["code"] == "file_not_found"


@pytest.mark.slow
def test_files__a_100_mb_file_round_trips_intact(stack: Stack):
    sid = stack.create()["id"]
    block = os.urandom(1_048_576)
    digest = hashlib.sha256(block * 100).hexdigest()

    def body() -> Iterator[bytes]:
        for _ in range(100):
            yield block

    put = stack.client.put(f"/v1/sandboxes/{sid}/files/big.bin", content=body())
    read = hashlib.sha256()
    with stack.client.stream("GET", f"/v1/sandboxes/{sid}/files/big.bin") as answer:
        for chunk in answer.iter_bytes():
            read.update(chunk)

    assert put.status_code == 200, put.text
    assert read.hexdigest() == digest
