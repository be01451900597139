"""The Prometheus scrape example of docs/operations.md targets the ports compose.yaml
publishes, service by service."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

# PyYAML comes with schemathesis (a dev dependency), without type stubs.
import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]
# ``${NAME:-default}``: what compose puts there when the variable is not set.
DEFAULTED = re.compile(r"\$\{[A-Z0-9_]+:-([^}]*)\}")
YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
# The scrape jobs of the example, by the compose service each scrapes.
JOBS = {"runyard-api": "api", "runyard-worker": "worker", "runyard-reaper": "reaper"}


def with_defaults(text: str) -> str:
    """``text`` as compose reads it with none of its variables set."""
    return DEFAULTED.sub(lambda match: match.group(1), text)


def published(compose: dict[str, Any], service: str) -> set[str]:
    """The ``host:port`` addresses a service is published on (``bind:host_port:port``)."""
    ports = compose["services"][service].get("ports", [])
    return {":".join(str(port).split(":")[:2]) for port in ports}


def scrape_targets(markdown: str) -> dict[str, set[str]]:
    """The targets of each job of the first YAML block with ``scrape_configs``."""
    block = next(b for b in YAML_BLOCK.findall(markdown) if "scrape_configs" in b)
    config = yaml.safe_load(block)
    return {
        job["job_name"]: {
            target for static in job["static_configs"] for target in static["targets"]
        }
        for job in config["scrape_configs"]
    }


def test_published_address__drops_the_container_port():
    compose = {"services": {"s": {"ports": ["127.0.0.1:9464:9464"]}}}
    assert published(compose, "s") == {"127.0.0.1:9464"}


@pytest.mark.parametrize(("job", "service"), sorted(JOBS.items()))
def test_scrape_example__targets_what_compose_publishes(job: str, service: str):
    compose = yaml.safe_load(with_defaults((ROOT / "compose.yaml").read_text()))
    targets = scrape_targets((ROOT / "docs" / "operations.md").read_text())
    assert set(targets) == set(JOBS)
    assert published(compose, service), f"compose.yaml does not publish {service}"
    assert targets[job] == published(compose, service)
