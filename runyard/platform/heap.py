"""The long-lived heap of a process, kept out of the garbage collector's sight; entry points
call it once their startup is done."""

from __future__ import annotations

import gc


def settle_heap() -> int:
    """Collect what startup left as garbage, then freeze every object that remains (the
    modules, the engines, the registry, an app and its schemas): they live as long as the
    process, and each full collection walked them all, pausing every thread. How many were
    frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
