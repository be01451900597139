"""Isolation tiers: which kernel stands between a tool and the host, named from its runtime.

A tool's ``runtime`` (the registry's name of an OCI runtime the engine lists) decides its
tier. The tier is what callers see in ``/v1/tools`` and what ``runyard doctor`` and the
conformance suite report per engine (docs/isolation.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

RUNC = "runc"
RUNSC = "runsc"
# The names under which an engine may list the plain runc runtime.
_RUNC_NAMES = frozenset({RUNC, "io.containerd.runc.v2", "io.containerd.runtime.v1.linux"})


@dataclass(frozen=True)
class Tier:
    """One isolation tier: its name, the runtime that gives it and what it puts in the way."""

    name: str
    runtime: str
    kernel: str


NAMESPACES = Tier("namespaces", RUNC, "the host kernel, behind namespaces, cgroups and seccomp")
GVISOR = Tier("gvisor", RUNSC, "gVisor's user-space kernel (the Sentry), itself confined")
# The tiers runyard knows and proves, weakest first.
KNOWN_TIERS = (NAMESPACES, GVISOR)


def tier_of(runtime: str | None) -> str:
    """The tier of a tool whose definition names ``runtime`` (None: the engine's default,
    runc); a runtime runyard does not know is its own tier, ``runtime:<name>``."""
    if runtime is None or runtime in _RUNC_NAMES:
        return NAMESPACES.name
    for tier in KNOWN_TIERS:
        if tier.runtime == runtime:
            return tier.name
    return f"runtime:{runtime}"


def offered_tiers(engine_runtimes: Iterable[str]) -> list[Tier]:
    """The known tiers an engine listing ``engine_runtimes`` offers, weakest first (runc
    always: it is every engine's default)."""
    listed = set(engine_runtimes)
    return [tier for tier in KNOWN_TIERS if tier is NAMESPACES or tier.runtime in listed]
