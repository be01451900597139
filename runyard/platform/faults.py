"""Named fault points for fault-injection tests; inert unless RUNYARD_FAULT names one.

The crash-matrix acceptance tests set ``RUNYARD_FAULT=<point>`` on a worker process to make
it die (``os._exit``, like ``kill -9``), raise, or pause at an exact place no signal could be
timed to hit.
"""

from __future__ import annotations

import logging
import os
import time

logger = logging.getLogger(__name__)

AFTER_CREATE = "after_create"
BEFORE_FINALIZE = "before_finalize"
# After the attempt's usage is recorded, before its finalize.
AFTER_USAGE = "after_usage"
# Raised by the heartbeat round (a bug in the heartbeat thread, not a database error).
HEARTBEAT_ERROR = "heartbeat_error"
# Between "container requested" and the runner's create.
BEFORE_CREATE = "before_create"

# The longest a pause point waits, so a test that forgets its pause file cannot hang a worker.
MAX_PAUSE_SECONDS = 120.0


class InjectedFault(RuntimeError):
    """Raised at a fault point named in RUNYARD_FAULT."""


def crash_point(name: str) -> None:
    """Die at once, without cleanup, if this point is the one named in RUNYARD_FAULT."""
    if os.environ.get("RUNYARD_FAULT") == name:
        logger.critical("fault injected: dying", extra={"fault": name})
        os._exit(137)


def raise_point(name: str) -> None:
    """Raise ``InjectedFault`` if this point is the one named in RUNYARD_FAULT."""
    if os.environ.get("RUNYARD_FAULT") == name:
        raise InjectedFault(f"fault injected at {name}")


def pause_point(name: str) -> None:
    """If this point is named in RUNYARD_FAULT, wait while RUNYARD_FAULT_PAUSE_FILE exists."""
    if os.environ.get("RUNYARD_FAULT") != name:
        return
    path = os.environ.get("RUNYARD_FAULT_PAUSE_FILE", "")
    logger.warning("fault injected: pausing", extra={"fault": name, "pause_file": path})
    until = time.monotonic() + MAX_PAUSE_SECONDS
    while path and os.path.exists(path) and time.monotonic() < until:
        time.sleep(0.05)
    logger.warning("fault injected: pause over", extra={"fault": name})
