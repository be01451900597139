"""What a broken or hostile server may send, in both flavours: the client neither crashes on
odd event streams, nor grows without bound on endless ones, nor writes an artifact outside
the directory it was given."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from runyard_client import (
    AsyncRunyard,
    InvalidResponseError,
    OtherEvent,
    Runyard,
    SkippedEvent,
    StatusEvent,
    StdoutEvent,
    UnsafePathError,
)
from runyard_client._files import target_path
from runyard_client._flow import MAX_EVENT_BYTES

URL = "http://yard.test"
RUN = "00000000-0000-0000-0000-000000000001"
AT = "2026-01-01T00:00:00+00:00"
# What a log chunk's data carries besides its text (the API always sends them).
CHUNK_FIELDS = f'"at": "{AT}", "attempt": 1, "until": "{AT}"'
Handler = Callable[[httpx2.Request], httpx2.Response]


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Pieces(httpx2.SyncByteStream, httpx2.AsyncByteStream):
    """A body sent in the given pieces, for either client; counts the bytes read."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._pieces = iter(pieces)
        self.read = 0

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._pieces:
            self.read += len(piece)
            yield piece

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self:
            yield piece


def answer(body: Pieces, content_type: str = "text/event-stream") -> httpx2.Response:
    return httpx2.Response(200, headers={"content-type": content_type}, stream=body)


def split(data: bytes, size: int | None) -> list[bytes]:
    size = size or len(data)
    return [data[start : start + size] for start in range(0, len(data), size)]


def call(flavour: str, handler: Handler, method: str, *args: Any, **kwargs: Any) -> Any:
    """``method`` of a client of that flavour over ``handler``: its list, or its value."""
    transport = httpx2.MockTransport(handler)
    if flavour == "sync":
        with Runyard(URL, max_retries=2, transport=transport) as client:
            result = getattr(client, method)(*args, **kwargs)
            return list(result) if isinstance(result, Iterator) else result

    async def main() -> Any:
        async with AsyncRunyard(URL, max_retries=2, transport=transport) as client:
            result = getattr(client, method)(*args, **kwargs)
            if hasattr(result, "__anext__"):
                return [item async for item in result]
            return await result

    return asyncio.run(main())


def chunk(text: str) -> str:
    """A log chunk's data as the API sends it."""
    return json.dumps({"at": AT, "attempt": 1, "until": AT, "text": text})


def message(event_id: str, kind: str, data: str, end: str = "\n") -> str:
    lines = [f"id: {event_id}", f"event: {kind}", *(f"data: {d}" for d in data.split("\n"))]
    return end.join(lines) + end + end


def status(event_id: int, value: str) -> str:
    return message(str(event_id), "status", json.dumps({"at": AT, "status": value}))


HOSTILE = "".join(
    [
        "retry: 1\n\n",
        ": keepalive\n\n",
        "foo: an unknown field\n\n",
        message("1", "stdout", chunk("one\n")),
        message("2", "stdout", "not json at all"),
        message("3", "stdout", "[1, 2]"),
        message("4", "stdout", json.dumps({"at": AT, "attempt": 1, "until": AT})),  # no text
        message("5", "claimed", json.dumps({"worker": "w"})),  # no at, no attempt
        message("6", "brand-new", "whatever"),
        message("7", "brand-new", json.dumps({"at": AT, "x": 1})),  # a newer type
        message("8", "stdout", "{" + CHUNK_FIELDS + ',\n"text": "two\\n"}'),  # two data lines
        message("9", "stderr", chunk("crlf"), end="\r\n"),
        message("10", "stdout", chunk("cr\n"), end="\r"),
        message("x1", "stdout", chunk("id")),  # an id that is no id
    ]
).encode()
# A JSON string with bytes that are not UTF-8: they are replaced, not raised.
BROKEN_UTF8 = (
    b"id: 12\nevent: stdout\ndata: {" + CHUNK_FIELDS.encode() + b', "text": "\xff\xfe"}\n\n'
)


@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_events__odd_messages_are_passed_over_and_reported_the_rest_typed(
    flavour: str, chunk: int | None
):
    skipped: list[SkippedEvent] = []
    body = HOSTILE + BROKEN_UTF8 + status(11, "failed").encode()
    events = call(
        flavour,
        lambda request: answer(Pieces(split(body, chunk))),
        "events",
        RUN,
        on_skip=skipped.append,
    )
    texts = [e.text for e in events if isinstance(e, StdoutEvent)]
    assert texts == ["one\n", "two\n", "cr\n", "\ufffd\ufffd"]
    assert [e.id for e in events if isinstance(e, OtherEvent)] == [7]
    assert isinstance(events[-1], StatusEvent) and events[-1].status == "failed"
    assert [(s.id, s.type) for s in skipped] == [
        ("2", "stdout"),
        ("3", "stdout"),
        ("4", "stdout"),
        ("5", "claimed"),
        ("6", "brand-new"),
        ("x1", "stdout"),
    ]
    assert all(s.error for s in skipped)


def test_events__a_stream_that_ends_early_resumes_after_the_last_event(flavour: str):
    streams = [
        "retry: 1\n\n" + message("5", "stdout", chunk("a")),
        message("3", "stdout", "broken") + "id: 9\nevent: stdout\ndata: {cut",  # no end
        status(4, "cancelled"),
    ]
    seen: list[str | None] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers.get("last-event-id"))
        return answer(Pieces([streams.pop(0).encode()]))

    events = call(flavour, handler, "events", RUN)
    assert [e.id for e in events] == [5, 4]
    assert seen == [None, "5", "3"]  # after the last event received, read or not


def test_events__a_data_line_of_several_mib_arrives(flavour: str):
    text = "y" * (3 * 1024 * 1024)
    body = message("1", "stdout", chunk(text)) + status(2, "succeeded")
    events = call(
        flavour, lambda request: answer(Pieces(split(body.encode(), 64 * 1024))), "events", RUN
    )
    assert isinstance(events[0], StdoutEvent) and events[0].text == text


def test_events__an_endless_line_ends_the_follow_with_bounded_memory(flavour: str):
    requests: list[httpx2.Request] = []
    bodies: list[Pieces] = []

    def endless() -> Iterator[bytes]:
        yield b"id: 1\nevent: stdout\ndata: "
        while True:
            yield b"w" * 65536

    def handler(request: httpx2.Request) -> httpx2.Response:
        requests.append(request)
        bodies.append(Pieces(endless()))
        return answer(bodies[-1])

    with pytest.raises(InvalidResponseError, match="cannot be read"):
        call(flavour, handler, "events", RUN)
    assert len(requests) == 1  # sending it again would not help
    assert bodies[0].read <= MAX_EVENT_BYTES + 2 * 65536


def test_events__an_answer_that_is_no_event_stream_is_refused_at_once(flavour: str):
    requests: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        requests.append(request)
        return answer(Pieces([b"<html>a proxy's page</html>"]), "text/html")

    with pytest.raises(InvalidResponseError, match="text/html"):
        call(flavour, handler, "events", RUN)
    assert len(requests) == 1


def ndjson(event_id: int, kind: str = "stdout") -> bytes:
    line = {"id": event_id, "type": kind, "at": AT, "data": {"text": f"line {event_id}"}}
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def test_events_ndjson__lines_as_sent_and_a_drop_resumed_after_the_last(flavour: str):
    params: list[dict[str, str]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        params.append(dict(request.url.params))
        if len(params) == 1:

            def dropping() -> Iterator[bytes]:
                yield ndjson(7) + b"\n" + ndjson(3)[:5]
                yield ndjson(3)[5:] + ndjson(9)[:10]
                raise httpx2.ReadError("connection dropped")

            return answer(Pieces(dropping()), "application/x-ndjson")
        return answer(Pieces(split(ndjson(9) + ndjson(12, "status")[:-1], 4)))

    lines = call(flavour, handler, "events_ndjson", RUN)
    assert lines == [ndjson(n).decode()[:-1] for n in (7, 3, 9)] + [
        ndjson(12, "status")[:-1].decode()
    ]
    assert params == [{"format": "ndjson"}, {"format": "ndjson", "after": "3"}]


def test_events_ndjson__an_endless_line_is_refused_with_bounded_memory(flavour: str):
    body = Pieces(iter(lambda: b"z" * 65536, None))

    with pytest.raises(InvalidResponseError, match="longer than"):
        call(flavour, lambda request: answer(body, "application/x-ndjson"), "events_ndjson", RUN)
    assert body.read <= MAX_EVENT_BYTES + 2 * 65536


@pytest.mark.parametrize("path", ["a.txt", "sub/dir/b.bin", "..x", "x..", "ünï code.txt"])
def test_target_path__plain_relative_paths_stay_inside(path: str, tmp_path: Path):
    assert target_path(tmp_path, path) == tmp_path / path


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/.", "", "a/", "nul\0byte"]
)
def test_target_path__refuses_anything_else(path: str, tmp_path: Path):
    with pytest.raises(UnsafePathError):
        target_path(tmp_path, path)


def listing(*paths: str) -> Handler:
    """An API whose run lists ``paths`` (each file holds its path) and serves them."""
    files = {path: path.encode() for path in paths}

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/artifacts"):
            artifacts = [
                {
                    "path": path,
                    "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "url": f"/v1/runs/{RUN}/artifacts/{index}",
                }
                for index, (path, data) in enumerate(files.items())
            ]
            body = {
                "run_id": RUN,
                "count": len(files),
                "total_bytes": sum(map(len, files.values())),
                "tar_url": f"/v1/runs/{RUN}/artifacts.tar",
                "artifacts": artifacts,
            }
            return httpx2.Response(200, json=body)
        index = int(request.url.path.rsplit("/", 1)[-1])
        return httpx2.Response(200, content=list(files.values())[index])

    return handler


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("hostile", ["../escaped", "/tmp/absolute", "a/../../escaped", "a//b"])
def test_download_all__a_hostile_path_is_refused_before_any_byte_is_written(
    flavour: str, hostile: str, tmp_path: Path
):
    out = tmp_path / "out"
    with pytest.raises(UnsafePathError):
        call(flavour, listing("fine.txt", hostile), "download_all", RUN, out)
    assert tree(tmp_path) == ["out"]  # not even the harmless file


def test_download_all__never_writes_through_a_link_in_the_directory(flavour: str, tmp_path: Path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "sub").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="not a directory"):
        call(flavour, listing("sub/planted.txt"), "download_all", RUN, out)
    assert list(elsewhere.iterdir()) == []


def test_download_all__keeps_plain_paths_under_the_directory(flavour: str, tmp_path: Path):
    written = call(flavour, listing("a.txt", "d/e/f.bin"), "download_all", RUN, tmp_path / "o")
    assert written == [tmp_path / "o" / "a.txt", tmp_path / "o" / "d" / "e" / "f.bin"]
    assert (tmp_path / "o" / "d" / "e" / "f.bin").read_bytes() == b"d/e/f.bin"


@pytest.mark.parametrize("hostile", ["a/..", "a/.", "dir/"])
def test_download__into_a_directory_refuses_a_path_without_a_file_name(
    flavour: str, hostile: str, tmp_path: Path
):
    with pytest.raises(UnsafePathError):
        call(flavour, listing(hostile), "download", RUN, hostile, tmp_path)
    assert tree(tmp_path) == []
