"""What tests/integration/queue/test_webhook_dns.py runs inside its network namespace, where
the only name server is tests/dns_stub.py: prints one JSON line of what it saw.

``deliver DATABASE_URL RUN_ID AT_LEAST AT_MOST``: a receiver on the namespace's 127.0.0.1:8080
and the real deliverer (bounded resolver and all) for AT_LEAST seconds and until RUN_ID's
delivery arrived, or AT_MOST seconds; reports when it arrived and the most lookup threads
seen at once.

``submit DATABASE_URL``: the API app (queue mode) takes runs and a batch whose callback hosts
the name server never answers for; reports how long each request took.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from api.main import create_app
from runyard.domain.webhook_fairness import Caps
from runyard.platform.db import make_engine
from runyard.platform.settings import Settings
from runyard.registry.tools import load_registry
from runyard.tenancy.auth import create_api_key
from runyard.webhooks.delivery import WebhookConfig, WebhookDeliverer
from runyard.webhooks.urls import DestinationPolicy
from tests.webhook_receiver import receiver_on

ROOT = Path(__file__).resolve().parents[1]
RECEIVER_PORT = 8080
CONFIG = WebhookConfig(
    timeout_seconds=2.0,
    lease_seconds=10.0,
    backoff_base_seconds=0.5,
    backoff_max_seconds=1.0,
    concurrency=8,
    poll_seconds=0.2,
    caps=Caps(per_tenant=4, per_destination=4),
    resolver_threads=8,
    policy=DestinationPolicy(allow_loopback=True),
)


def lookup_threads() -> int:
    """Name lookups in progress in this process."""
    return sum(1 for t in threading.enumerate() if t.name == "runyard-resolve")


def deliver(database_url: str, run_id: str, at_least: float, at_most: float) -> dict[str, Any]:
    """Run the deliverer until ``run_id``'s delivery arrived and ``at_least`` seconds passed,
    or ``at_most`` seconds passed."""
    engine = make_engine(database_url, pool_size=CONFIG.concurrency + 2, max_overflow=0)
    deliverer = WebhookDeliverer(engine, CONFIG)
    most = 0
    arrived_after: float | None = None
    with receiver_on(RECEIVER_PORT) as receiver:
        started = time.monotonic()
        thread = threading.Thread(target=deliverer.run_forever, daemon=True)
        thread.start()
        while (elapsed := time.monotonic() - started) < at_most:
            most = max(most, lookup_threads())
            if arrived_after is None and any(
                got.run()["id"] == run_id for got in receiver.received
            ):
                arrived_after = elapsed
            if arrived_after is not None and elapsed >= at_least:
                break
            time.sleep(0.01)
        deliverer.stop()
        thread.join(timeout=30)
    engine.dispose()
    return {"arrived_after": arrived_after, "most_lookup_threads": most}


def submit(database_url: str) -> dict[str, Any]:
    """Runs and a batch with callback hosts DNS never answers for, through the API."""
    engine = make_engine(database_url)
    settings = Settings(database_url=database_url, webhook_allow_loopback=True)
    registry = load_registry(ROOT / "tests" / "tools.toml", settings)
    acme = {"Authorization": f"Bearer {create_api_key(engine, 'acme')}"}
    admin = {"Authorization": f"Bearer {create_api_key(engine, 'ops', admin=True)}"}
    took: dict[str, Any] = {}
    with TestClient(create_app(settings, engine=engine, registry=registry)) as client:
        put = client.put("/v1/tenants/acme/webhook", json={"url": None}, headers=admin)
        assert put.status_code == 200, put.text
        started = time.monotonic()
        run = client.post(
            "/v1/runs",
            json={"tool": "echo", "input": {}, "callback_url": "http://never-1.test/hook"},
            headers=acme,
        )
        took["run"] = [run.status_code, time.monotonic() - started]
        runs = [
            {"tool": "echo", "input": {}, "callback_url": f"http://never-{i}.test/hook"}
            for i in range(10)
        ]
        started = time.monotonic()
        batch = client.post("/v1/batches", json={"runs": runs}, headers=acme)
        took["batch"] = [batch.status_code, time.monotonic() - started]
        started = time.monotonic()
        took["healthz"] = [client.get("/healthz").status_code, time.monotonic() - started]
    engine.dispose()
    return took


def main(argv: Sequence[str]) -> int:
    """Dispatch on the mode; print the report."""
    mode, database_url, *rest = argv
    if mode == "deliver":
        report = deliver(database_url, str(uuid.UUID(rest[0])), float(rest[1]), float(rest[2]))
    else:
        report = submit(database_url)
    print(json.dumps(report), flush=True)  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
