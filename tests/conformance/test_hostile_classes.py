"""Every class of hostile tool (poisoned results, floods, a fork bomb, memory and disk fills,
a silence, a tool that ignores SIGTERM) ends as documented under each tier: the acceptance
test's classes, run here through the runner alone, four at a time."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import docker
import pytest

from runyard.domain.attempt import AttemptResult
from runyard.domain.isolation import Tier
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.docker.runner import DockerLimits, DockerRunner
from tests.acceptance.test_hostile_tools import CLASSES, Hostile
from tests.integration.docker.test_docker_runner import spec_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

# Where a tier ends a class otherwise, by design (docs/isolation.md, the table of results):
# under gVisor a FIFO made in /runyard/out lives only in the sandbox (the run ends with no
# result at all), and 165 MB through a pipe outlasts the 14 s timeout of the ptrace platform.
TIER_OUTCOMES = {
    "gvisor": {
        "fifo": ("succeeded", None),
        "150mb-no-newline": ("timed_out", "timed_out"),
    }
}


def _run(runner: DockerRunner, registry: ToolRegistry, hostile: Hostile) -> AttemptResult:
    timeout = registry.tools[hostile.tool].timeout_seconds
    spec = spec_for(registry, hostile.tool, hostile.value, timeout=timeout)
    try:
        return runner.run(spec, AttemptControl())
    finally:
        runner.discard(spec.run_id, spec.attempt)


def test_hostile_classes__each_ends_as_documented(
    docker_client: docker.DockerClient, registry: ToolRegistry, tier: Tier
):
    runner = DockerRunner(docker_client, DockerLimits(stop_grace_seconds=2))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda h: _run(runner, registry, h), CLASSES))
    wrong = []
    for hostile, result in zip(CLASSES, results, strict=True):
        differs = TIER_OUTCOMES.get(tier.name, {}).get(hostile.name)
        if differs is not None:
            if (result.status.value, result.error_code) != differs:
                wrong.append(f"{hostile.name}: {result.status.value}/{result.error_code}")
            continue
        status_ok = result.status.value in (hostile.status, *hostile.also)
        codes = (hostile.error_code, *hostile.also_codes)
        code_ok = hostile.error_code is None or result.error_code in codes
        if not (status_ok and code_ok):
            wrong.append(
                f"{hostile.name}: {result.status.value}/{result.error_code} ({result.error})"
            )
    assert wrong == [], "\n".join(wrong)
    # The engine is still fine for an ordinary run after all of that.
    after = _run(runner, registry, Hostile("echo", "echo", {"n": "1"}, "succeeded", None))
    assert after.result == {"n": "1"}
