"""A traced run's trace id: in the API's run views, in ``runyard get``, and on the run page
linked through the configured trace viewer."""

from __future__ import annotations

import json
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from runyard.platform.tracing import TraceContext
from runyard.queue import JobQueue, NewRun
from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import create_api_key
from runyard.traces.context import with_trace
from tests.integration.api.cli_support import Api
from tests.integration.api.test_api_helpers import make_app
from tests.integration.api.test_ui_http import log_in

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CONTEXT = TraceContext(f"00-{TRACE}-00f067aa0ba902b7-01")


def traced_run(queue: JobQueue, context: TraceContext | None) -> uuid.UUID:
    """A run of acme whose snapshot carries ``context`` (as a traced submit writes it)."""
    spec = {"name": "echo"} if context is None else with_trace({"name": "echo"}, context)
    return queue.enqueue(NewRun(tenant="acme", tool="echo", spec=spec, input={})).run_id


@pytest.mark.slow  # a CLI command in a process of its own per step
def test_run_views__show_the_trace_id_of_a_traced_run(api: Api):
    traced = traced_run(api.queue, CONTEXT)
    plain = traced_run(api.queue, None)
    shown = api.run("get", str(traced))
    assert f"\ntrace {TRACE}\n" in shown.stdout + "\n", shown.stdout
    assert "trace" not in api.run("get", str(plain)).stdout
    listed = api.run("ls", "--json")
    by_id = {item["id"]: item.get("trace_id") for item in json.loads(listed.stdout)["items"]}
    assert by_id == {str(traced): TRACE, str(plain): None}


def test_run_page__links_the_trace_through_the_configured_viewer(
    database_url: str, engine: Engine, registry: ToolRegistry, queue: JobQueue
):
    run_id = traced_run(queue, CONTEXT)
    template = "https://traces.example/trace/{trace_id}?from=runyard"
    app = make_app(database_url, engine, registry, trace_url_template=template)
    with TestClient(app, follow_redirects=False) as client:
        log_in(client, create_api_key(engine, "acme"))
        page = client.get(f"/ui/runs/{run_id}").text
    assert f'href="https://traces.example/trace/{TRACE}?from=runyard"' in page
    assert f">{TRACE}</a>" in page
