"""Schemathesis against the app's own OpenAPI document: no 500, no response that breaks it.

Valid and invalid requests are generated for every operation and sent to a real server on
loopback; examples per operation are few, so the run stays within seconds.
"""

from __future__ import annotations

from typing import Any, cast

import httpx2
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import Engine

from api.batch_schemas import BatchCreate
from api.schemas import RunCreate
from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import issue_api_key
from tests.integration.api.test_api_helpers import count, live_server, make_app

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
EXAMPLES_PER_MODE = 12


@pytest.mark.timeout(300)
@pytest.mark.slow  # fuzzes every operation: hundreds of generated requests
def test_schemathesis__finds_no_server_error_and_no_schema_violation(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    app = make_app(
        database_url,
        engine,
        registry,
        max_wait_seconds=0.2,
        events_max_stream_seconds=0.5,
        events_poll_seconds=0.1,
        max_request_bytes=64 * 1024,
    )
    # Allowed the documented example's priority, so that example makes a real run.
    headers = {"Authorization": f"Bearer {issue_api_key(engine, 'acme', max_priority=100).key}"}
    with live_server(app) as url:
        schema = schemathesis.openapi.from_dict(app.openapi())
        operations = [cast(Any, result).ok() for result in schema.get_all_operations()]
        assert len(operations) == 46
        for operation in operations:
            strategy = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(
                GenerationMode.NEGATIVE
            )

            @settings(
                max_examples=2 * EXAMPLES_PER_MODE,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy)
            def check(case: Any) -> None:
                response = case.call(base_url=url, headers=headers, timeout=10)
                case.validate_response(response, checks=CHECKS, headers=headers)

            check()
        # The documented examples are accepted: real runs exist, not only rejections (the
        # generator does not always send them itself).
        for route, model in (("runs", RunCreate), ("batches", BatchCreate)):
            examples: list[Any] = model.model_json_schema()["examples"]
            for example in examples:
                accepted = httpx2.post(
                    f"{url}/v1/{route}", json=example, headers=headers, timeout=10
                )
                assert accepted.status_code == 202, (route, accepted.text)
    assert count(engine, "SELECT count(*) FROM tool_runs") >= 1
