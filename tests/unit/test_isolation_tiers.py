"""Isolation tiers: a tool's tier from its runtime, the tiers an engine offers."""

from __future__ import annotations

import pytest

from runyard.domain.isolation import GVISOR, NAMESPACES, offered_tiers, tier_of


@pytest.mark.parametrize(
    ("runtime", "tier"),
    [
        (None, "namespaces"),
        ("runc", "namespaces"),
        ("io.containerd.runc.v2", "namespaces"),
        ("runsc", "gvisor"),
        ("kata", "runtime:kata"),
    ],
)
def test_tier_of__names_the_tier_of_a_runtime(runtime: str | None, tier: str):
    assert tier_of(runtime) == tier


@pytest.mark.parametrize(
    ("runtimes", "tiers"),
    [
        ([], [NAMESPACES]),
        (["runc"], [NAMESPACES]),
        (["runc", "runsc"], [NAMESPACES, GVISOR]),
        (["runsc", "kata", "io.containerd.runc.v2"], [NAMESPACES, GVISOR]),
    ],
)
def test_offered_tiers__known_tiers_the_engine_lists_weakest_first(
    runtimes: list[str], tiers: list[object]
):
    assert offered_tiers(runtimes) == tiers
