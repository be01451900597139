"""Engine clients: no environment lookups per request on a unix socket, none changed over TCP."""

from __future__ import annotations

import docker

from runyard.runners.docker.connection import skip_environment_lookups


def test_skip_environment_lookups__a_unix_socket_client_stops_trusting_the_environment():
    api = docker.APIClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    skip_environment_lookups(api)
    assert api.trust_env is False
    api.close()


def test_skip_environment_lookups__tcp_engines_keep_their_proxies():
    api = docker.APIClient(base_url="tcp://127.0.0.1:1", version="1.41")
    skip_environment_lookups(api)
    assert api.trust_env is True
    api.close()
