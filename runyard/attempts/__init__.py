"""Attempt ownership: the one owner of an attempt held under its job's lease, for every
process that holds one (a worker's slot, a sync-mode API's), and the policy that says what
differs between them."""

from __future__ import annotations
