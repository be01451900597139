"""Kept-alive connections to an engine on a unix socket.

docker-py's unix-socket adapter keys its connection pools by the request's whole URL, so
every request naming a new container opens a new connection (and a pool) and closes one
later: the seven requests of an attempt cost seven connects. One shared pool reuses them,
as docker-py already does for an engine over TCP. Proxy and netrc lookups from the
environment, which requests repeats for every request, mean nothing on a local socket.
"""

from __future__ import annotations

from typing import Any

import docker
from docker.transport import UnixHTTPAdapter

SCHEME = "http+docker://"
# Idle connections kept: a worker's slots plus their log followers and its own chores.
MAX_POOL_SIZE = 64


class SharedPoolAdapter(UnixHTTPAdapter):  # type: ignore[misc]
    """The unix-socket adapter with one pool for every request."""

    def get_connection(self, url: str, proxies: Any = None) -> Any:
        """The one pool, whatever the URL (the socket is the only destination)."""
        return super().get_connection(SCHEME + "localhost", proxies)


def keep_alive(api: docker.APIClient) -> None:
    """Give ``api`` one pool of kept-alive connections if it talks over a unix socket."""
    adapter = api.adapters.get(SCHEME)
    if not isinstance(adapter, UnixHTTPAdapter) or isinstance(adapter, SharedPoolAdapter):
        return
    shared = SharedPoolAdapter(
        "http+unix://" + adapter.socket_path, adapter.timeout, max_pool_size=MAX_POOL_SIZE
    )
    api.mount(SCHEME, shared)
    api._custom_adapter = shared
    api.trust_env = False
    adapter.close()
