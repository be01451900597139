"""What ``runyard doctor`` prints for the tiers it checked."""

from __future__ import annotations

from runyard.cli.doctor import report_lines
from runyard.domain.isolation import GVISOR, NAMESPACES
from runyard.runners.docker.probes import PROBES, TierCheck

ALL_HELD = {probe.name: True for probe in PROBES}


def test_report__every_tier_held_and_one_not_offered():
    lines = report_lines(["runc"], [TierCheck(NAMESPACES, None, ALL_HELD)])
    assert lines[0] == "engine runtimes: runc"
    assert lines[1].startswith("tier namespaces (runc): ok (")
    assert lines[2] == f"  {len(PROBES)} escape probes held"
    assert lines[3] == "tier gvisor (runsc): not offered by this engine"


def test_report__names_escapes_and_a_broken_contract():
    escaped = {**ALL_HELD, "mount": False, "raw sockets": False}
    checks = [
        TierCheck(NAMESPACES, None, escaped),
        TierCheck(GVISOR, "the probe run ended failed: exit 2", {}),
    ]
    lines = report_lines(["runc", "runsc"], checks)
    assert lines[1].startswith("tier namespaces (runc): FAILED")
    assert lines[2] == "  escaped: mount, raw sockets"
    assert lines[3].startswith("tier gvisor (runsc): FAILED")
    assert lines[4] == "  runner contract: the probe run ended failed: exit 2"
    assert len(lines) == 5


def test_report__an_engine_that_cannot_limit_fails_first():
    lines = report_lines(["runc"], [TierCheck(NAMESPACES, None, ALL_HELD)], "it is rootless")
    assert lines[1] == "engine FAILED: it is rootless"
