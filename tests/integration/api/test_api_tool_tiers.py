"""``GET /v1/tools`` shows each tool's runtime, isolation tier and egress allow-list."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from runyard.registry.tools import ToolRegistry
from tests.integration.api.test_api_helpers import bearer, make_app


def test_tools__show_each_tools_runtime_tier_and_egress(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    echo = registry.tools["echo"]
    tools = {
        "echo": echo,
        "sandboxed": echo.model_copy(update={"name": "sandboxed", "runtime": "runsc"}),
        "odd": echo.model_copy(update={"name": "odd", "runtime": "kata"}),
        "fetch": echo.model_copy(update={"name": "fetch", "egress": ["api.example.org:443"]}),
    }
    app = make_app(database_url, engine, ToolRegistry(tools=tools))
    with TestClient(app) as client:
        answer = client.get("/v1/tools", headers=bearer(engine, "acme"))
    assert answer.status_code == 200, answer.text
    listed = {t["name"]: (t["runtime"], t["isolation"], t["egress"]) for t in answer.json()}
    assert listed == {
        "echo": (None, "namespaces", None),
        "sandboxed": ("runsc", "gvisor", None),
        "odd": ("kata", "runtime:kata", None),
        "fetch": (None, "namespaces", ["api.example.org:443"]),
    }
