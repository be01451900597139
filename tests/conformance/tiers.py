"""The isolation tiers a test run must find (no test here)."""

from __future__ import annotations

import os


def required_tiers() -> set[str]:
    """The tier names in ``RUNYARD_CONFORMANCE_TIERS`` (scripts/test sets it from what it
    installed): a missing one fails a test instead of skipping it."""
    names = os.environ.get("RUNYARD_CONFORMANCE_TIERS", "").split(",")
    return {name.strip() for name in names if name.strip()}
