"""The engine calls sent straight over the unix socket answer and fail as docker-py's do."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
import requests.exceptions

from runyard.runners.docker import runner as runner_module
from runyard.runners.docker.outputs import latest_entry_stamp, stored_logs
from runyard.runners.docker.runner import DockerRunner
from runyard.runners.docker.socket_api import MAX_ANSWER_BYTES, SocketApi, socket_api

# (status, body, chunked) for a request line such as "GET /v1.41/containers/x/json".
Reply = tuple[int, bytes, bool]


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class Engine:
    """A stand-in engine on a unix socket: answers each request with what ``reply`` says,
    and keeps every request it was sent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.requests: list[tuple[str, str, bytes]] = []
        self.reply: Callable[[str, str], Reply] = lambda method, target: (200, b"{}", False)
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                engine.requests.append((self.command, self.path, self.rfile.read(length)))
                status, body, chunked = engine.reply(self.command, self.path)
                self.send_response(status)
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for start in range(0, len(body), 7):
                        piece = body[start : start + 7]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _Server(str(path), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    stub = Engine(tmp_path / "docker.sock")
    yield stub
    stub.close()


@pytest.fixture
def api(engine: Engine) -> Iterator[SocketApi]:
    client = docker.APIClient(base_url=f"unix://{engine.path}", version="1.41", timeout=5)
    made = socket_api(client)
    assert isinstance(made, SocketApi)
    yield made
    client.close()


def test_socket_api__tcp_engines_keep_docker_pys_client():
    client = docker.APIClient(base_url="tcp://127.0.0.1:1", version="1.41")
    assert socket_api(client) is client
    client.close()


def test_inspect__the_document_from_the_versioned_path(engine: Engine, api: SocketApi):
    engine.reply = lambda method, target: (200, b'{"State": {"Status": "exited"}}', True)
    assert api.inspect_container("runyard-a b") == {"State": {"Status": "exited"}}
    assert engine.requests == [("GET", "/v1.41/containers/runyard-a%20b/json", b"")]


def test_refusals__raised_as_docker_pys_errors(engine: Engine, api: SocketApi):
    answers = {
        "/v1.41/containers/gone/json": (404, b'{"message": "No such container: gone"}', False),
        "/v1.41/containers/x/start": (
            409,
            b'{"message": "container is marked for removal"}',
            False,
        ),
        "/v1.41/containers/create?name=n": (404, b'{"message": "No such image: a:b"}', False),
        "/v1.41/volumes/v?force=True": (500, b"plain words", False),
    }
    engine.reply = lambda method, target: answers[target]
    with pytest.raises(docker.errors.NotFound) as missing:
        api.inspect_container("gone")
    assert missing.value.explanation == "No such container: gone"
    with pytest.raises(docker.errors.APIError) as conflict:
        api.start("x")
    assert conflict.value.status_code == 409
    assert "container is marked for removal" in str(conflict.value)
    with pytest.raises(docker.errors.ImageNotFound):
        api.create_container(image="a:b", command=["true"], name="n")
    with pytest.raises(docker.errors.APIError) as failed:
        api.remove_volume("v", force=True)
    assert failed.value.status_code == 500 and failed.value.explanation == "plain words"


def test_create__docker_pys_config_posted_as_json_without_empty_fields(
    engine: Engine, api: SocketApi
):
    engine.reply = lambda method, target: (201, b'{"Id": "c0ffee", "Warnings": []}', False)
    host_config = api.create_host_config(read_only=True, cap_drop=["ALL"])
    made = api.create_container(
        image="img", command=["true"], name="runyard-x", labels={"k": "v"}, host_config=host_config
    )
    assert made["Id"] == "c0ffee"
    ((method, target, body),) = engine.requests
    assert (method, target) == ("POST", "/v1.41/containers/create?name=runyard-x")
    config = json.loads(body)
    assert config["Image"] == "img" and config["Labels"] == {"k": "v"}
    assert config["HostConfig"]["ReadonlyRootfs"] is True
    assert None not in config.values()


def test_wait_and_removals__the_paths_and_flags_docker_py_sends(engine: Engine, api: SocketApi):
    engine.reply = lambda method, target: (
        (200, b'{"StatusCode": 3}', True) if target.endswith("/wait") else (204, b"", False)
    )
    assert api.wait("c", timeout=2)["StatusCode"] == 3
    api.remove_container("c", force=True)
    api.remove_volume("v")
    assert [(m, t) for m, t, _ in engine.requests] == [
        ("POST", "/v1.41/containers/c/wait"),
        ("DELETE", "/v1.41/containers/c?v=False&link=False&force=True"),
        ("DELETE", "/v1.41/volumes/v"),
    ]


def test_ping__unversioned(engine: Engine, api: SocketApi):
    engine.reply = lambda method, target: (200, b"OK", False)
    assert api.ping() is True
    assert engine.requests[0][1] == "/_ping"


def test_stored_logs__frames_read_from_a_chunked_stream(engine: Engine, api: SocketApi):
    def frame(stream: int, payload: bytes) -> bytes:
        return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload

    body = frame(1, b"out line\n") + frame(2, b"err line\n") + frame(1, b"more\n")
    engine.reply = lambda method, target: (200, body, True)
    out, err = stored_logs(api, "c", cap=1024)
    assert (out.text(), err.text()) == ("out line\nmore\n", "err line\n")
    assert engine.requests[0][1].startswith("/v1.41/containers/c/logs?stdout=1&stderr=1")


def test_latest_entry_stamp__the_last_entries_with_their_stamps(engine: Engine, api: SocketApi):
    def frame(stream: int, payload: bytes) -> bytes:
        return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload

    body = frame(1, b"2026-11-26T03:24:44.542Z three\n") + frame(2, b"2026-11-26T03:24:44.5Z two\n")
    engine.reply = lambda method, target: (200, body, True)
    assert latest_entry_stamp(api, "c", 64) == "2026-11-26T03:24:44.542Z"
    target = engine.requests[0][1]
    assert "timestamps=1" in target and "tail=64" in target


def test_answer__larger_than_the_cap_is_refused(engine: Engine, api: SocketApi):
    engine.reply = lambda method, target: (200, b" " * (MAX_ANSWER_BYTES + 1), False)
    with pytest.raises(requests.exceptions.RequestException, match="larger than"):
        api.inspect_container("c")


def test_a_silent_engine__times_out_as_requests_does(tmp_path: Path):
    path = tmp_path / "silent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    client = docker.APIClient(base_url=f"unix://{path}", version="1.41", timeout=5)
    try:
        with pytest.raises(requests.exceptions.ReadTimeout):
            socket_api(client).wait("c", timeout=0.2)
    finally:
        listener.close()
        client.close()


def test_no_engine__a_connection_error(tmp_path: Path):
    client = docker.APIClient(base_url=f"unix://{tmp_path}/none.sock", version="1.41")
    with pytest.raises(requests.exceptions.ConnectionError):
        socket_api(client).ping()
    client.close()


def test_answered_within__the_head_of_a_fresh_answer_counts_for_a_while(engine: Engine):
    now = [10.0]
    client = docker.APIClient(base_url=f"unix://{engine.path}", version="1.41", timeout=5)
    api = SocketApi(client, str(engine.path), clock=lambda: now[0])
    assert not api.answered_within(0.5)
    engine.reply = lambda method, target: (404, b'{"message": "No such container"}', False)
    with pytest.raises(docker.errors.NotFound):
        api.inspect_container("c")  # a refusal is an answer too
    now[0] += 0.4
    assert api.answered_within(0.5)
    now[0] += 0.2
    assert not api.answered_within(0.5)
    client.close()


def test_runner_ping__skipped_right_after_an_answer_asked_otherwise(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
):
    client = docker.DockerClient(base_url=f"unix://{engine.path}", version="1.41")
    runner = DockerRunner(client)
    engine.reply = lambda method, target: (200, b"OK", False)
    runner.ping()
    runner.ping()  # the first one's answer is fresh
    monkeypatch.setattr(runner_module, "FRESH_ANSWER_SECONDS", 0.0)
    runner.ping()
    assert [target for _, target, _ in engine.requests] == ["/_ping", "/_ping"]
    client.close()


# --- answers read by the parser: bounded, and never a short body ---


def raw_answer(tmp_path: Path, pieces: list[bytes]) -> SocketApi:
    """A SocketApi whose engine answers one request with ``pieces`` (sent one by one), then
    closes the connection."""
    path = tmp_path / "raw.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            received = b""
            while b"\r\n\r\n" not in received:
                received += conn.recv(65536)
            for piece in pieces:
                conn.sendall(piece)
        listener.close()

    threading.Thread(target=answer, daemon=True).start()
    client = docker.APIClient(base_url=f"unix://{path}", version="1.41", timeout=5)
    return SocketApi(client, str(path))


def test_answer__read_whole_whatever_pieces_it_comes_in(tmp_path: Path):
    body = json.dumps({"Id": "c", "Name": "x" * 5000}).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    whole = head + b"\r\n" + chunked
    api = raw_answer(tmp_path, [whole[i : i + 7] for i in range(0, len(whole), 7)])
    assert api.inspect_container("c") == json.loads(body)


def test_answer__a_body_that_ends_with_the_connection_is_read_to_its_end(tmp_path: Path):
    api = raw_answer(tmp_path, [b"HTTP/1.1 200 OK\r\n\r\n", b'{"Id": ', b'"c"}'])
    assert api.inspect_container("c") == {"Id": "c"}


@pytest.mark.parametrize(
    ("pieces", "said"),
    [
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b'{"Id": "c"}'], "before its"),
        ([b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"Id"'], "before its"),
        ([b"HTTP/1.1 200 OK\r\nContent-Le"], "before its"),
        ([b"SSH-2.0-OpenSSH_9.2\r\n"], "not HTTP/1.1"),
        ([b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (70 << 10) + b"\r\n\r\n{}"], "head over"),
        ([b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 101 + b"\r\n{}"], "header fields"),
    ],
    ids=["short-length", "short-chunks", "short-head", "not-http", "huge-head", "many-headers"],
)
def test_answer__cut_short_or_unreadable_is_a_connection_error(
    tmp_path: Path, pieces: list[bytes], said: str
):
    api = raw_answer(tmp_path, pieces)
    with pytest.raises(requests.exceptions.ConnectionError, match=said):
        api.inspect_container("c")
