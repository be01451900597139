"""The engine calls every attempt makes, sent straight over the engine's unix socket.

docker-py sends each request through requests and urllib3 (a session's settings merged, a
connection pool made for every new URL, the answer's headers parsed twice): about 0.9 ms of
the worker's CPU per request, eight or nine requests per attempt. ``SocketApi`` sends the
hot ones (ping, inspect, start, wait, the stored log, the removals) itself, their answers
read by httptools' parser (``answers``), for a tenth of that, and hands every other call to
docker-py unchanged.

What callers see stays docker-py's: the same answers, ``docker.errors`` for the engine's
refusals (made by docker-py's own ``create_api_error_from_http_exception``), and requests'
``ConnectionError``/``ReadTimeout`` for a socket that fails or times out. Each request has a
connection of its own, closed after the answer, as docker-py's are: an engine that is
shutting down still answers on open connections while it stops its containers, and the
runner must see it gone.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote, urlencode

import docker
import docker.errors
import requests
import requests.exceptions
from docker.transport import UnixHTTPAdapter

from runyard.runners.docker.answers import SocketAnswer, send_request
from runyard.runners.docker.connection import SCHEME

# An answer the worker reads whole (an inspect document, a wait's status) is never this big;
# a larger one is the engine's fault, not a reason to hold it all in memory.
MAX_ANSWER_BYTES = 8 << 20


@dataclass(frozen=True)
class Call:
    """One request to the engine: ``path`` under the API version unless not ``versioned``."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    body: str | None = None
    timeout: float | None = None
    versioned: bool = True


def connect(socket_path: str, timeout: float | None) -> socket.socket:
    """A connection to the unix socket (a refused or missing one raises ``OSError``)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(socket_path)
    except BaseException:
        sock.close()
        raise
    return sock


class Answer:
    """An answer whose body is read as a stream (a log); closing it closes its connection."""

    def __init__(self, sock: socket.socket, answer: SocketAnswer) -> None:
        self._sock = sock
        self._answer = answer

    @property
    def raw(self) -> Answer:
        """The body to read, as requests' streamed answers name it."""
        return self

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes of the body (b"" at its end)."""
        try:
            return self._answer.read(size)
        except OSError as exc:
            raise _transport_error(exc) from exc

    def read_all(self, limit: int) -> bytes:
        """The body to its end, or its first ``limit`` bytes."""
        pieces: list[bytes] = []
        left = limit
        while left > 0:
            piece = self.read(left)
            if not piece:
                break
            pieces.append(piece)
            left -= len(piece)
        return b"".join(pieces)

    def close(self) -> None:
        """Close the answer's connection."""
        self._sock.close()


class SocketApi:
    """docker-py's ``APIClient`` with its hot calls sent over the unix socket directly."""

    def __init__(
        self,
        client: docker.APIClient,
        socket_path: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._socket_path = socket_path
        self._prefix = f"/v{client._version}"
        self._clock = clock
        # When the engine last answered a new connection (monotonic), if ever.
        self._answered_at: float | None = None

    def answered_within(self, seconds: float) -> bool:
        """Whether the engine answered a request sent less than ``seconds`` ago: the head
        of an answer only (a wait's exit, which an engine that stops sends on old
        connections, counts for nothing)."""
        answered = self._answered_at
        return answered is not None and self._clock() - answered < seconds

    def __getattr__(self, name: str) -> Any:
        # Every call not written out here is docker-py's own.
        return getattr(self._client, name)

    # --- the calls of every attempt ---

    def ping(self) -> bool:
        """``GET /_ping``: True if the engine says OK."""
        return self.exchange(Call("GET", "/_ping", versioned=False)) == b"OK"

    def inspect_container(self, container: str) -> dict[str, Any]:
        """The container's inspect document (``docker.errors.NotFound`` if there is none)."""
        answer: dict[str, Any] = json.loads(
            self.exchange(Call("GET", _path("/containers/{}/json", container)))
        )
        return answer

    def create_container(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """docker-py's ``create_container`` (the config built as it builds it), sent from
        here by ``create_container_from_config``."""
        create = docker.APIClient.create_container  # looked up now: a wrapper of it applies
        answer: dict[str, Any] = cast(Any, create)(self, *args, **kwargs)
        return answer

    def create_container_from_config(
        self, config: dict[str, Any], name: str | None = None, platform: str | None = None
    ) -> dict[str, Any]:
        """``POST /containers/create`` with ``config`` (its None fields left out, as
        docker-py leaves them)."""
        if platform:
            answer: dict[str, Any] = self._client.create_container_from_config(
                config, name, platform
            )
            return answer
        body = json.dumps({key: value for key, value in config.items() if value is not None})
        params = {"name": name} if name is not None else None
        answer = json.loads(self.exchange(Call("POST", "/containers/create", params, body)))
        return answer

    def start(self, container: str) -> None:
        """Start the container."""
        self.exchange(Call("POST", _path("/containers/{}/start", container)))

    def wait(self, container: str, timeout: float | None = None) -> dict[str, Any]:
        """Block until the container exits (requests' ``ReadTimeout`` after ``timeout``)."""
        body = self.exchange(Call("POST", _path("/containers/{}/wait", container), timeout=timeout))
        answer: dict[str, Any] = json.loads(body)
        return answer

    def remove_container(self, container: str, force: bool = False) -> None:
        """Remove the container (``docker.errors.NotFound`` if it is gone already)."""
        params = {"v": "False", "link": "False", "force": str(force)}
        self.exchange(Call("DELETE", _path("/containers/{}", container), params))

    def remove_volume(self, name: str, force: bool = False) -> None:
        """Remove the named volume."""
        params = {"force": str(force)} if force else None
        self.exchange(Call("DELETE", _path("/volumes/{}", name), params))

    def open_logs(self, container: str, params: dict[str, Any]) -> Answer:
        """The container's log endpoint as a stream of Docker's multiplexed frames."""
        return self.open(Call("GET", _path("/containers/{}/logs", container), params))

    # --- the exchange ---

    def exchange(self, call: Call) -> bytes:
        """Send one request on a connection of its own; the whole body of a success."""
        answer = self.open(call)
        try:
            content = answer.read_all(MAX_ANSWER_BYTES + 1)
        finally:
            answer.close()
        if len(content) > MAX_ANSWER_BYTES:
            raise requests.exceptions.ContentDecodingError(
                f"the engine's answer to {call.method} {call.path} is larger than "
                f"{MAX_ANSWER_BYTES} bytes"
            )
        return content

    def open(self, call: Call) -> Answer:
        """Send one request; its answer to read (engine refusals raised as docker-py's)."""
        method, params, body, timeout = call.method, call.params, call.body, call.timeout
        path = self._prefix + call.path if call.versioned else call.path
        target = path + ("?" + urlencode(params) if params else "")
        sock: socket.socket | None = None
        try:
            sock = connect(self._socket_path, self._client.timeout if timeout is None else timeout)
            send_request(sock, method, target, None if body is None else body.encode("utf-8"))
            response = SocketAnswer(sock)
            response.read_head()
        except BaseException as exc:
            if sock is not None:
                sock.close()
            if isinstance(exc, OSError):
                raise _transport_error(exc) from exc
            raise
        self._answered_at = self._clock()
        answer = Answer(sock, response)
        if response.status >= 400:
            try:
                refusal = answer.read_all(MAX_ANSWER_BYTES)
            finally:
                answer.close()
            _raise_refusal(response.status, response.reason, refusal, target)
        return answer


def socket_api(client: docker.APIClient) -> Any:
    """``client`` with its hot calls sent straight over its unix socket; ``client`` itself
    when it talks to the engine any other way (TCP, TLS, SSH)."""
    adapters = getattr(client, "adapters", None)  # a stand-in for docker-py has none
    adapter = adapters.get(SCHEME) if isinstance(adapters, dict) else None
    if not isinstance(adapter, UnixHTTPAdapter):
        return client
    return SocketApi(client, adapter.socket_path)


def _path(pattern: str, name: str) -> str:
    """``pattern`` with ``name`` quoted into it, as docker-py's ``_url`` does."""
    return pattern.format(quote(name, safe="/:"))


def _transport_error(exc: BaseException) -> requests.exceptions.RequestException:
    """The requests error docker-py raises for the same failure of the socket."""
    if isinstance(exc, TimeoutError):
        return requests.exceptions.ReadTimeout(f"the engine's socket timed out: {exc}")
    return requests.exceptions.ConnectionError(f"the engine's socket failed: {exc!r}")


def _raise_refusal(status: int, reason: str, body: bytes, target: str) -> None:
    """Raise what docker-py raises for this error answer (``NotFound``, ``ImageNotFound``,
    ``APIError``), with its status, reason and the engine's message."""
    answer = requests.Response()
    answer.status_code = status
    answer.reason = reason
    answer.url = f"{SCHEME}localhost{target}"
    answer.encoding = "utf-8"
    answer._content = body
    try:
        answer.raise_for_status()
    except requests.exceptions.HTTPError as exc:
        docker.errors.create_api_error_from_http_exception(exc)
    raise docker.errors.APIError(f"unexpected answer {status}", response=answer)
