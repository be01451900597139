"""compose.yaml gives every service the tools directory that docs/operations.md describes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from runyard.platform.settings import Settings
from runyard.registry.tools import load_registry

ROOT = Path(__file__).resolve().parents[2]
MOUNT = "${RUNYARD_TOOLS_DIR:-./tools}:/etc/runyard/tools:ro"
TOOLS_FILE = "/etc/runyard/tools/tools.toml"
SERVICES = ["migrate", "api", "worker", "reaper"]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return loaded


def section() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index("### Your own tools with compose")
    return text[start : text.index("\nUsers and privileges", start)]


@pytest.mark.parametrize("service", SERVICES)
def test_compose__every_service_mounts_the_tools_directory_and_reads_the_file_in_it(service: str):
    spec = compose()["services"][service]
    assert MOUNT in spec["volumes"]
    assert spec["environment"]["RUNYARD_TOOLS_FILE"] == TOOLS_FILE
    target = MOUNT.split(":")[-2]
    assert TOOLS_FILE.startswith(target + "/")


def test_compose__the_docs_name_the_mount_the_file_and_the_variable():
    text = section()
    assert "`RUNYARD_TOOLS_DIR`" in text and "default `./tools`" in text
    assert "/etc/runyard/tools" in text and f"RUNYARD_TOOLS_FILE={TOOLS_FILE}" in text
    assert "RUNYARD_TOOLS_DIR=/srv/runyard-tools docker compose up -d" in text
    header = (ROOT / "compose.yaml").read_text().split("\nx-runyard")[0]
    assert re.search(r"RUNYARD_TOOLS_DIR\s+your tools", header)


def test_compose__the_default_tools_directory_holds_a_registry_whose_contexts_are_inside_it():
    default = re.fullmatch(r"\$\{RUNYARD_TOOLS_DIR:-(.+)\}", MOUNT.split(":/etc")[0])
    assert default is not None
    tools_dir = (ROOT / default.group(1)).resolve()
    registry = load_registry(tools_dir / Path(TOOLS_FILE).name, Settings(database_url="unused"))
    contexts = [t.build.context for t in registry.tools.values() if t.build is not None]
    assert contexts
    for context in contexts:
        assert (tools_dir / context).resolve().is_relative_to(tools_dir)
        assert (tools_dir / context / "Dockerfile").is_file()
