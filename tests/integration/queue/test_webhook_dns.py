"""Webhooks against a name server that answers slowly or never, for real: each test makes a
network namespace whose only resolver is a UDP name server on its own loopback
(tests/dns_stub.py), and runs the code under test inside it (tests/netns_webhooks.py), the
deliverer and the API reaching the test's Postgres through a Unix socket."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Engine, make_url, text

from runyard.queue import JobQueue
from runyard.webhooks.tenant import TenantWebhooks
from tests.integration.queue.test_webhooks import deliveries, finish, webhook_events
from tests.netns import NETNS_ETC, Namespace, UnixBridge, can_make_namespaces, network_namespace
from tests.netns_webhooks import CONFIG, RECEIVER_PORT

pytestmark = pytest.mark.skipif(
    not can_make_namespaces(), reason="network namespaces need root and ip"
)

# slow: answers after 1 s (within the 2 s attempt timeout); sluggish: after 4 s (past it);
# never: never answers (the system resolver waits 20 s before it gives up).
RULES = ["slow=1:127.0.0.1", "sluggish=4:127.0.0.1", "never=-"]


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    with network_namespace() as made:
        name_server = made.start(
            [sys.executable, "-m", "tests.dns_stub", *(f"--rule={r}" for r in RULES)]
        )
        assert name_server.stdout is not None
        assert name_server.stdout.readline().strip() == "ready"
        yield made
    assert not (NETNS_ETC / made.name).exists()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert made.name not in listed.stdout


@pytest.fixture
def inside_url(database_url: str) -> Iterator[str]:
    """The test's database as the namespace reaches it: through a Unix socket."""
    url = make_url(database_url)
    assert url.host is not None and url.port is not None
    bridge = UnixBridge(url.host, url.port)
    try:
        inside = URL.create(
            url.drivername,
            username=url.username,
            password=url.password,
            database=url.database,
            query={"host": bridge.directory},
        )
        yield inside.render_as_string(hide_password=False)
    finally:
        bridge.close()


def run_inside(namespace: Namespace, *args: str, timeout: float = 90) -> dict[str, Any]:
    done = subprocess.run(
        namespace.command([sys.executable, "-m", "tests.netns_webhooks", *args]),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow  # a 6 s delivery window behind lookups that never end
def test_dns__names_that_never_resolve_cost_their_tenant_and_slow_ones_still_deliver(
    queue: JobQueue, engine: Engine, namespace: Namespace, inside_url: str
):
    for tenant in ("flood", "quiet", "other"):
        TenantWebhooks(engine).configure(tenant, None)
    flood = [
        finish(queue, now=None, tenant="flood", callback_url=f"http://never-{i}.test:8080/h")
        for i in range(12)
    ]
    sluggish = finish(queue, now=None, tenant="other", callback_url="http://sluggish.test:8080/h")
    quiet = finish(
        queue, now=None, tenant="quiet", callback_url=f"http://slow.test:{RECEIVER_PORT}/h"
    )
    # Six seconds: long enough for the flood's stuck lookups to fill its share of them.
    report = run_inside(namespace, "deliver", inside_url, str(quiet), "6", "30")
    # The quiet tenant's delivery, behind 12 whose names never resolve, arrives within a few
    # seconds: its lookup (1 s) is not stuck behind theirs.
    assert report["arrived_after"] is not None and report["arrived_after"] < 10, report
    [delivered] = deliveries(engine, quiet)
    assert delivered["status"] == "delivered"
    # Lookups that never end (each holds its thread for 20 s) are bounded: the flood's by its
    # share, the rest by what the others asked for.
    assert report["most_lookup_threads"] <= CONFIG.caps.per_tenant + 2, report
    # A name that answers past the attempt's timeout fails at the timeout, with a clear error.
    [first, *_] = webhook_events(engine, sluggish)
    assert first["error"] == (
        "refused: cannot resolve sluggish.test: no answer from the name server within 2 s"
    )
    # The flood's attempts end at their timeout while the tenant has lookups to spare, then at
    # once: never one without a clear reason.
    errors = [e["error"] for run in flood for e in webhook_events(engine, run)]
    timed_out = [e for e in errors if e.endswith("no answer from the name server within 2 s")]
    at_once = [e for e in errors if e.endswith("already waiting for an answer; not resolving now")]
    assert timed_out and at_once, errors
    assert len(timed_out) + len(at_once) == len(errors), errors
    assert all(e.startswith("refused: cannot resolve never-") for e in errors), errors


@pytest.mark.slow  # sits out a slow name server
def test_dns__submit_never_waits_for_the_name_server(
    engine: Engine, namespace: Namespace, inside_url: str
):
    report = run_inside(namespace, "submit", inside_url)
    for what in ("run", "batch", "healthz"):
        status, seconds = report[what]
        assert status in (200, 202), report
        assert seconds < 2, report  # a lookup of these names would take 20 s
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT callback_url FROM tool_runs")).scalars().all()
    assert len(stored) == 11 and all(url.startswith("http://never-") for url in stored)
