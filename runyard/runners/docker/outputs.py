"""Reading an attempt's outputs from the engine: the multiplexed log stream and result.json.

These talk to docker-py's low-level client without the inspect it makes before every log
request (to learn whether the container has a TTY: runyard's never do).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator, Mapping
from typing import Any

from docker.types import CancellableStream

from runyard.domain.tool_json import DEFAULT_MAX_DEPTH, decode_result
from runyard.platform.capture import HeadTailBuffer
from runyard.registry.redact import Redactor, StreamRedactor
from runyard.runners.docker.live_logs import timestamp_key
from runyard.runners.docker.socket_api import SocketApi

STDOUT_FRAME = 1
STDERR_FRAME = 2
_READ_PIECE = 64 * 1024


def _log_params(
    *, stdout: bool, stderr: bool, follow: bool, timestamps: bool, since: int | None
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "stdout": int(stdout),
        "stderr": int(stderr),
        "follow": int(follow),
        "timestamps": int(timestamps),
        "tail": "all",
    }
    if since is not None and since > 0:
        params["since"] = since
    return params


class ContainerLogs:
    """The log endpoint of one container, shaped like docker-py's ``Container.logs``."""

    def __init__(self, api: Any, container_id: str) -> None:
        self._api = api
        self._id = container_id

    def logs(
        self,
        *,
        stdout: bool = True,
        stderr: bool = True,
        stream: bool = True,
        follow: bool = False,
        timestamps: bool = False,
        since: int | None = None,
    ) -> CancellableStream:
        """A stream of one or both demultiplexed streams' payloads (docker-py's helpers)."""
        assert stream, "only streaming reads are supported"
        url = self._api._url("/containers/{0}/logs", self._id)
        params = _log_params(
            stdout=stdout, stderr=stderr, follow=follow, timestamps=timestamps, since=since
        )
        response = self._api._get(url, params=params, stream=True)
        self._api._raise_for_status(response)
        # The same reader docker-py uses for a non-TTY container (no socket timeout: a quiet
        # tool must not end its follow stream).
        return CancellableStream(self._api._multiplexed_response_stream_helper(response), response)


def _read_exactly(raw: Any, size: int) -> bytes:
    data = b""
    while len(data) < size:
        piece = raw.read(size - len(data))
        if not piece:
            break
        data += piece
    return data


def _frame_sizes(raw: Any) -> Iterator[tuple[int, int]]:
    """``(stream id, payload size)`` of each frame header; the caller reads the payload."""
    while True:
        header = _read_exactly(raw, 8)
        if len(header) < 8:
            return
        yield header[0], int.from_bytes(header[4:8], "big")


def _payload(raw: Any, size: int) -> Iterator[bytes]:
    """A frame's payload in pieces (fewer bytes if the stream ends first)."""
    while size > 0:
        piece = raw.read(min(size, _READ_PIECE))
        if not piece:
            return
        size -= len(piece)
        yield piece


def frames(raw: Any) -> Iterator[tuple[int, bytes]]:
    """``(stream id, payload piece)`` from Docker's multiplexed stream format."""
    for stream_id, size in _frame_sizes(raw):
        for piece in _payload(raw, size):
            yield stream_id, piece


def frame_heads(raw: Any, size: int) -> Iterator[bytes]:
    """The first ``size`` bytes of each frame's payload in Docker's multiplexed stream (the
    rest of each frame read and dropped)."""
    for _, left in _frame_sizes(raw):
        head = _read_exactly(raw, min(left, size))
        for _ in _payload(raw, left - len(head)):
            pass
        yield head


# "2026-11-26T03:24:44.123456789Z ": a stamp and its space fit in this many bytes.
_STAMP_BYTES = 40


def latest_entry_stamp(api: Any, container_id: str, entries: int) -> str | None:
    """The latest engine timestamp among the container's last ``entries`` log entries, both
    streams (one request; None when it has no log)."""
    params = _log_params(stdout=True, stderr=True, follow=False, timestamps=True, since=None)
    params["tail"] = entries
    response = _open_logs(api, container_id, params)
    try:
        heads = frame_heads(response.raw, _STAMP_BYTES)
        stamps = (head.split(b" ", 1)[0].decode("ascii", errors="replace") for head in heads)
        return max((s for s in stamps if s[:4].isdigit()), key=timestamp_key, default=None)
    finally:
        response.close()


def stored_logs(
    api: Any, container_id: str, cap: int, redactor: Redactor | None = None
) -> tuple[HeadTailBuffer, HeadTailBuffer]:
    """stdout and stderr of a container as kept by its log driver, each capped and with the
    tool's secrets masked before they are kept, one request."""
    out, err = HeadTailBuffer(cap), HeadTailBuffer(cap)
    masks = {
        STDOUT_FRAME: StreamRedactor(redactor or Redactor(())),
        STDERR_FRAME: StreamRedactor(redactor or Redactor(())),
    }
    buffers = {STDOUT_FRAME: out, STDERR_FRAME: err}
    params = _log_params(stdout=True, stderr=True, follow=False, timestamps=False, since=None)
    response = _open_logs(api, container_id, params)
    try:
        for stream_id, piece in frames(response.raw):
            if stream_id in buffers:
                buffers[stream_id].write(masks[stream_id].feed(piece))
    finally:
        response.close()
    for stream_id, buffer in buffers.items():
        buffer.write(masks[stream_id].finish())
    return out, err


def _open_logs(api: Any, container_id: str, params: dict[str, Any]) -> Any:
    """The log endpoint's answer, its body in ``.raw`` (closed by the caller)."""
    if isinstance(api, SocketApi):
        return api.open_logs(container_id, params)
    response = api._get(api._url("/containers/{0}/logs", container_id), params=params, stream=True)
    try:
        api._raise_for_status(response)
    except BaseException:
        response.close()
        raise
    return response


# Go's ``os.ModeSymlink``: the bit of a path stat's ``mode`` that marks a link.
_GO_MODE_SYMLINK = 1 << 27


def stat_is_link(stat: dict[str, Any]) -> bool:
    """Whether the engine's stat of a path (``X-Docker-Container-Path-Stat``) is a link: by
    its mode. Docker fills ``linkTarget`` only for links; Podman fills it with the path
    itself for every file, so it alone decides only where no mode is given."""
    if "mode" in stat:
        return bool(int(stat["mode"]) & _GO_MODE_SYMLINK)
    return bool(stat.get("linkTarget"))


def parse_result_archive(
    stat: dict[str, Any], chunks: Any, cap: int, max_depth: int = DEFAULT_MAX_DEPTH
) -> tuple[Any, str | None]:
    """``out/result.json`` from its tar stream; anything but one small regular file fails."""
    if stat_is_link(stat):
        return None, "result.json is a link; only a regular file is accepted"
    if int(stat.get("size", 0)) > cap:
        return None, f"result.json is larger than {cap} bytes"
    raw = bytearray()
    for chunk in chunks:
        raw += chunk
        if len(raw) > cap + 64 * 1024:
            return None, f"result.json is larger than {cap} bytes"
    try:
        with tarfile.open(fileobj=io.BytesIO(bytes(raw)), mode="r:") as tar:
            members = tar.getmembers()
            if len(members) != 1:
                return None, "result.json must be a single regular file"
            member = members[0]
            if (
                not member.isreg()
                or member.name != "result.json"
                or member.name.startswith("/")
                or ".." in member.name.split("/")
            ):
                return None, "result.json must be a single regular file"
            if member.size > cap:
                return None, f"result.json is larger than {cap} bytes"
            handle = tar.extractfile(member)
            data = handle.read(cap + 1) if handle is not None else b""
    except tarfile.TarError as exc:
        return None, f"result.json could not be read: {exc}"
    return decode_result(data, max_depth=max_depth)


def tool_ids(user: str) -> tuple[int, int]:
    """The numeric ``uid[:gid]`` a tool runs as (the registry only allows numeric users)."""
    uid_text, _, gid_text = user.partition(":")
    return int(uid_text), int(gid_text or uid_text)


def workdir_archive(files: Mapping[str, bytes], user: str, now: float) -> bytes:
    """The attempt's files (``input.json``, ``deps.json``: root-owned, read-only) and
    ``out/`` (owned by the tool user)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        add_workdir(tar, files, user, now)
    return buffer.getvalue()


def add_workdir(tar: tarfile.TarFile, files: Mapping[str, bytes], user: str, now: float) -> None:
    """Add ``workdir_archive``'s members to an archive being written."""
    uid, gid = tool_ids(user)
    for name, payload in files.items():
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(payload), 0o444, now
        tar.addfile(info, io.BytesIO(payload))
    out = tarfile.TarInfo("out")
    out.type, out.mode, out.uid, out.gid, out.mtime = tarfile.DIRTYPE, 0o755, uid, gid, now
    tar.addfile(out)
