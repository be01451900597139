"""The sweep lives in ``runyard.sweep`` (sync mode runs it in the API too); kept for imports."""

from __future__ import annotations

from runyard.sweep import ATTEMPT_STATES, Sweeper, SweepResult

__all__ = ["ATTEMPT_STATES", "SweepResult", "Sweeper"]
