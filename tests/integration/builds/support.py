"""A registry whose tool ``stats`` is built from a Dockerfile: its runs wait for a build."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from runyard.builds.setup import with_builds
from runyard.platform.settings import Settings
from runyard.queue.builds import BuildQueue
from runyard.registry.tools import ToolRegistry, load_registry

REGISTRY = """
[tools.stats]
build = { context = "stats" }
command = ["true"]
"""


def built_tools(tmp_path: Path, engine: Engine) -> ToolRegistry:
    """The registry, its build context under ``tmp_path``, its builds on ``engine``."""
    (tmp_path / "stats").mkdir()
    (tmp_path / "stats" / "Dockerfile").write_text("FROM runyard/toolbox:latest\n")
    (tmp_path / "tools.toml").write_text(REGISTRY)
    settings = Settings(database_url="unused")
    return with_builds(
        load_registry(tmp_path / "tools.toml", settings), BuildQueue(engine), settings
    )
