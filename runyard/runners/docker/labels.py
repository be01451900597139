"""The labels runyard puts on an attempt's container and volume, and reading them back."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

LABEL_MANAGED = "io.runyard.managed"
LABEL_RUN_ID = "io.runyard.run_id"
LABEL_ATTEMPT = "io.runyard.attempt"
LABEL_TOOL = "io.runyard.tool"
LABEL_DEADLINE = "io.runyard.deadline"
# "host": /runyard is the attempt's host work directory, so its outputs can be read there.
LABEL_WORKDIR = "io.runyard.workdir"


def attempt_of(labels: Mapping[str, str]) -> tuple[uuid.UUID, int] | None:
    """``(run_id, attempt)`` named by a container's or volume's labels, else None."""
    try:
        return uuid.UUID(labels[LABEL_RUN_ID]), int(labels[LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None
