"""``GET /v1/tools`` shows each tool's runtime and isolation tier."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from runyard.registry.tools import ToolRegistry
from tests.integration.api.test_api_helpers import bearer, make_app


def test_tools__show_each_tools_runtime_and_tier(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    echo = registry.tools["echo"]
    tools = {
        "echo": echo,
        "sandboxed": echo.model_copy(update={"name": "sandboxed", "runtime": "runsc"}),
        "odd": echo.model_copy(update={"name": "odd", "runtime": "kata"}),
    }
    app = make_app(database_url, engine, ToolRegistry(tools=tools))
    with TestClient(app) as client:
        answer = client.get("/v1/tools", headers=bearer(engine, "acme"))
    assert answer.status_code == 200, answer.text
    listed = {t["name"]: (t["runtime"], t["isolation"]) for t in answer.json()}
    assert listed == {
        "echo": (None, "namespaces"),
        "sandboxed": ("runsc", "gvisor"),
        "odd": ("kata", "runtime:kata"),
    }
