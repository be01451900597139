"""The version of the runyard-client distribution."""

from __future__ import annotations

__version__ = "0.1.0"
