"""Kept-alive engine connections: one pool for a unix socket, nothing changed over TCP."""

from __future__ import annotations

import docker

from runyard.docker.connection import SCHEME, SharedPoolAdapter, keep_alive


def test_keep_alive__a_unix_socket_gets_one_pool_for_every_url():
    api = docker.APIClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    keep_alive(api)
    adapter = api.get_adapter(f"{SCHEME}localhost/v1.41/containers/a/json")
    assert isinstance(adapter, SharedPoolAdapter) and api.trust_env is False
    first = adapter.get_connection(f"{SCHEME}localhost/v1.41/containers/a/json")
    second = adapter.get_connection(f"{SCHEME}localhost/v1.41/containers/b/start")
    assert first is second and first.socket_path == "/nonexistent/docker.sock"
    keep_alive(api)  # twice is once
    assert api.get_adapter(f"{SCHEME}localhost/x") is adapter
    api.close()


def test_keep_alive__tcp_engines_are_left_alone():
    api = docker.APIClient(base_url="tcp://127.0.0.1:1", version="1.41")
    keep_alive(api)
    assert api.trust_env is True
    assert not isinstance(api.get_adapter("http://127.0.0.1:1/x"), SharedPoolAdapter)
    api.close()
