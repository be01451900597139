"""What an API process loads at its start: not the MCP SDK, which only ``/mcp`` needs (its
import is about a second of CPU, paid on the first MCP request instead)."""

from __future__ import annotations

import subprocess
import sys

LOADED_AT_START = """
import os
import sys
os.environ["RUNYARD_DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/none"
import api.__main__
from api.main import create_app
from runyard.platform.settings import Settings
create_app(Settings())  # the routes and the /mcp endpoint, built as uvicorn's factory does
print(sorted(name for name in sys.modules if name == "mcp" or name.startswith(("mcp.", "mcp_"))))
print("api.mcp.mount" in sys.modules)
"""


def test_api_start__does_not_import_the_mcp_sdk():
    loaded = subprocess.run(
        [sys.executable, "-c", LOADED_AT_START], capture_output=True, text=True, check=True
    )
    sdk_modules, mount_loaded = loaded.stdout.splitlines()
    assert mount_loaded == "True"  # the endpoint is mounted: only the SDK waits
    assert sdk_modules == "[]"
