"""An in-memory runyard for unit tests: no server, no Docker, no database.

``FakeRunyard`` and ``AsyncFakeRunyard`` are the real clients (``Runyard``,
``AsyncRunyard``) talking to a ``FakeBackend`` through an in-memory transport, so code under
test meets the same methods, models, errors and retries. Tools are Python callables::

    def double(input):
        return {"n": input["n"] * 2}

    with FakeRunyard({"double": double}) as client:
        assert client.run("double", {"n": 21}).result == {"n": 42}

A tool that raises makes its run fail (``error_code`` ``tool_failed``, ``error`` its
message); one that takes a second argument gets a ``ToolContext`` to print log lines and keep
artifacts. Queued runs run when the next request comes in (``auto_run=False``: only on
``backend.run_pending()``). Sandboxes of any registered tool are ready at once; their
commands are answered by ``FakeBackend(sandbox_commands=...)`` (a callable given a
``FakeExecCall``, returning ``(exit_code, stdout, stderr)``). Not modelled: input schemas,
webhooks (and a tenant's webhook settings), builds, sync mode, retries of failed attempts,
``running`` as a lasting state, a sandbox's TTL and idle end.
"""

from __future__ import annotations

from collections.abc import Mapping

from runyard_client._async_client import AsyncRunyard
from runyard_client._client import Runyard
from runyard_client.testing._backend import FakeBackend
from runyard_client.testing._http import FakeTransport
from runyard_client.testing._sandboxes import FakeExecCall
from runyard_client.testing._tools import FakeTool, ToolContext, ToolOutcome, run_tool

FAKE_URL = "http://runyard.fake"

__all__ = [
    "FAKE_URL",
    "AsyncFakeRunyard",
    "FakeBackend",
    "FakeExecCall",
    "FakeRunyard",
    "FakeTool",
    "FakeTransport",
    "ToolContext",
    "ToolOutcome",
    "fake_transport",
    "run_tool",
]


def fake_transport(backend: FakeBackend) -> FakeTransport:
    """A transport (for either client) that answers every request from ``backend``."""
    return FakeTransport(backend)


class FakeRunyard(Runyard):
    """``Runyard`` against an in-memory ``FakeBackend`` (``.backend``)."""

    def __init__(
        self,
        tools: Mapping[str, FakeTool] | None = None,
        *,
        backend: FakeBackend | None = None,
        max_retries: int = 3,
    ) -> None:
        self.backend = backend or FakeBackend(tools)
        if backend is not None:
            for name, call in (tools or {}).items():
                backend.register(name, call)
        super().__init__(
            FAKE_URL,
            self.backend.api_key,
            max_retries=max_retries,
            transport=fake_transport(self.backend),
        )


class AsyncFakeRunyard(AsyncRunyard):
    """``AsyncRunyard`` against an in-memory ``FakeBackend`` (``.backend``)."""

    def __init__(
        self,
        tools: Mapping[str, FakeTool] | None = None,
        *,
        backend: FakeBackend | None = None,
        max_retries: int = 3,
    ) -> None:
        self.backend = backend or FakeBackend(tools)
        if backend is not None:
            for name, call in (tools or {}).items():
                backend.register(name, call)
        super().__init__(
            FAKE_URL,
            self.backend.api_key,
            max_retries=max_retries,
            transport=fake_transport(self.backend),
        )
