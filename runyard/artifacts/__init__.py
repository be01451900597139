"""A run's artifacts: the files its tool left under /runyard/out, behind a storage port."""

from __future__ import annotations
