"""requests' per-request environment lookups switched off for an engine on a unix socket.

For every request requests looks through the environment for proxies and reads ``.netrc``
(``trust_env``): about 2 ms of a worker's CPU per attempt, for settings that mean nothing
on a local socket. Connections stay one per request, as docker-py makes them: a dockerd
that is shutting down still answers on open connections while it stops its containers, and
the runner must see it gone, not read their exits as the tools' own.
"""

from __future__ import annotations

import docker
from docker.transport import UnixHTTPAdapter

SCHEME = "http+docker://"


def skip_environment_lookups(api: docker.APIClient) -> None:
    """No proxy or netrc lookups for ``api`` if it talks over a unix socket."""
    if isinstance(api.adapters.get(SCHEME), UnixHTTPAdapter):
        api.trust_env = False
