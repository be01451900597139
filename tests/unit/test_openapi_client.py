"""A client generated from the OpenAPI document (openapi-python-client) comes out whole and
with clean module names: one per operation, named after its id, under its tag."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from api.main import create_app
from runyard.platform.settings import Settings

GENERATOR = Path(sys.executable).with_name("openapi-python-client")
# The generator reads application/x-tar as the bytes it is; no formatting afterwards (the
# names are what is checked, and the post hooks would run ruff on the output).
CONFIG = {
    "content_type_overrides": {"application/x-tar": "application/octet-stream"},
    "post_hooks": [],
}
# A module named the default way: FastAPI's ids end in the path and the method.
DEFAULT_LOOKING = re.compile(r"_v1_|_(get|post|put|patch|delete)\.py$")


def snake(operation_id: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation_id).lower()


@pytest.mark.slow  # starts the generator: seconds of CPU
def test_generated_client__has_a_module_per_operation_named_after_its_id(tmp_path: Path):
    app = create_app(Settings(database_url="postgresql://unused@127.0.0.1:9/unused"))
    document: dict[str, Any] = app.openapi()
    (tmp_path / "openapi.json").write_text(json.dumps(document))
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    # It reads a file, never a URL; a proxy that refuses makes any HTTP attempt fail fast.
    refused = "http://127.0.0.1:9"
    env = {**os.environ, "HTTP_PROXY": refused, "HTTPS_PROXY": refused, "NO_PROXY": ""}
    generated = subprocess.run(
        [
            str(GENERATOR),
            "generate",
            "--path",
            str(tmp_path / "openapi.json"),
            "--output-path",
            str(tmp_path / "client"),
            "--meta",
            "none",
            "--config",
            str(tmp_path / "config.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    output = generated.stdout + generated.stderr
    assert generated.returncode == 0, output
    assert "warning" not in output.lower(), output

    client = tmp_path / "client"
    modules = {path.relative_to(client).as_posix() for path in client.rglob("*.py")}
    assert "api/runs/submit_run.py" in modules
    for path, item in document["paths"].items():
        for method, operation in item.items():
            expected = f"api/{operation['tags'][0]}/{snake(operation['operationId'])}.py"
            assert expected in modules, (method, path, expected)
    assert [module for module in modules if DEFAULT_LOOKING.search(module)] == []
    # The event streams' item schemas come out as models too.
    assert {"models/run_status_event.py", "models/run_log_chunk_data.py"} <= modules
