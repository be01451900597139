"""Named crash points for fault-injection tests; inert unless RUNYARD_FAULT names one.

The crash-matrix acceptance tests set ``RUNYARD_FAULT=<point>`` on a worker process to make
it die (``os._exit``, like ``kill -9``) at an exact place no signal could be timed to hit.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

AFTER_CREATE = "after_create"
BEFORE_FINALIZE = "before_finalize"


def crash_point(name: str) -> None:
    """Die at once, without cleanup, if this point is the one named in RUNYARD_FAULT."""
    if os.environ.get("RUNYARD_FAULT") == name:
        logger.critical("fault injected: dying", extra={"fault": name})
        os._exit(137)
