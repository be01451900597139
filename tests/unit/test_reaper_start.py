"""What a reaper process loads at its start: not the ORM's mapped classes (the reaper's reads,
webhook deliveries included, are written-out SQL; the mapping cost each of its starts about
a third of a second of CPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LOADED_AT_START = """
import os
import sys
os.environ["RUNYARD_DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/none"
os.environ["RUNYARD_TOOLS_FILE"] = sys.argv[1]
from reaper.__main__ import build_deliverer, build_reaper, build_scheduler
from runyard.platform.settings import Settings
settings = Settings()
build_reaper(settings)
build_deliverer(settings)
build_scheduler(settings)
print("runyard.reads.run_view" in sys.modules)
print(sorted(name for name in ("sqlalchemy.orm", "runyard.platform.models") if name in sys.modules))
"""

TOOLS = """
[tools.echo]
image = "runyard/toolbox:latest"
command = ["cat"]
"""


def test_reaper_start__does_not_import_the_orm(tmp_path: Path):
    tools = tmp_path / "tools.toml"
    tools.write_text(TOOLS)
    loaded = subprocess.run(
        [sys.executable, "-c", LOADED_AT_START, str(tools)],
        capture_output=True,
        text=True,
        check=True,
    )
    view_loaded, orm_modules = loaded.stdout.splitlines()
    assert view_loaded == "True"  # the deliveries' run reads are loaded: only the ORM is not
    assert orm_modules == "[]"
