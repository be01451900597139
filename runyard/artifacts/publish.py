"""What an owner does with a set its finalize did not publish: remove it, and never fail."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping

from sqlalchemy import Engine, text

from runyard.artifact_store import ArtifactStore
from runyard.platform.db import autocommit

logger = logging.getLogger(__name__)

# Whether a run's finalize named this set: a commit whose answer was lost may still have.
IS_PUBLISHED = text(
    "SELECT EXISTS (SELECT 1 FROM tool_runs WHERE id = :run_id AND artifact_set = :set_id)"
)


def drop_unpublished(
    engine: Engine,
    store: ArtifactStore | None,
    run_id: uuid.UUID,
    set_id: uuid.UUID | None,
    extra: Mapping[str, object],
) -> None:
    """Discard the set (the lease was lost, or a fallback outcome replaced the one that named
    it); a failure only leaves rows that go with the run at retention."""
    if store is None or set_id is None:
        return
    try:
        params = {"run_id": run_id, "set_id": set_id}
        if not autocommit(engine, IS_PUBLISHED, params)[0][0]:
            store.discard(run_id, set_id)
    except Exception:
        logger.warning(
            "could not discard an unpublished artifact set",
            exc_info=True,
            extra={**extra, "set_id": str(set_id)},
        )
