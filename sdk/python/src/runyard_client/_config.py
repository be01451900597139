"""What both clients are built from: the URL, the key, timeouts and the retry policy."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2

from runyard_client._calls import DEFAULT_URL, Call
from runyard_client._retry import RetryPolicy
from runyard_client._version import __version__
from runyard_client.errors import (
    InvalidResponseError,
    RunyardError,
    connection_error,
    error_from_response,
)

USER_AGENT = f"runyard-client/{__version__}"


@dataclass(frozen=True)
class ClientConfig:
    """A client's settings; ``timeout`` bounds connecting and each read of a plain call."""

    url: str = DEFAULT_URL
    api_key: str | None = None
    timeout: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: object
    ) -> ClientConfig:
        """``RUNYARD_URL`` (default ``http://127.0.0.1:8000``) and ``RUNYARD_API_KEY``; the
        ``overrides`` that are not None win."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {
            "url": env.get("RUNYARD_URL") or DEFAULT_URL,
            "api_key": env.get("RUNYARD_API_KEY") or None,
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)  # type: ignore[arg-type]

    @property
    def base_url(self) -> str:
        """The API's root URL."""
        return self.url.rstrip("/")

    def headers(self) -> dict[str, str]:
        """The headers of every request."""
        headers = {"User-Agent": USER_AGENT}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def read_timeout(self, read: float | None) -> httpx2.Timeout:
        """The client's timeouts with another read bound (None: wait as long as it takes)."""
        return httpx2.Timeout(self.timeout, read=read)

    def call_timeout(self, call: Call[Any]) -> httpx2.Timeout:
        """The timeouts of one call: a long-poll's read waits as long as the API may hold
        the answer, and then the usual bound; a submit's as long as it takes."""
        if call.unbounded_read:
            return self.read_timeout(None)
        return self.read_timeout(self.timeout + max(call.held_seconds, 0.0))


def error_of(response: httpx2.Response) -> RunyardError:
    """The error of a (read) answer of 400 or more."""
    return error_from_response(response.status_code, response.headers, response.content)


def transport_error(exc: httpx2.TransportError) -> RunyardError:
    """The error of a request that got no (whole) answer, chained to its cause."""
    error = connection_error(exc)
    error.__cause__ = exc
    return error


def stream_error(exc: httpx2.SSEError) -> RunyardError:
    """The error of an event stream that cannot be read (an event over the size bound, an
    answer that is no event stream): sending the request again would not help."""
    return InvalidResponseError(f"the event stream cannot be read: {exc}")
