"""The artifact store the settings choose (composition roots only)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from runyard.artifact_store import ArtifactStore
from runyard.artifact_stores.local_dir import LocalDirArtifactStore
from runyard.artifact_stores.postgres import PostgresArtifactStore
from runyard.platform.settings import Settings


def store_from_settings(settings: Settings, engine: Engine) -> ArtifactStore:
    """``RUNYARD_ARTIFACTS_DIR`` if set, else Postgres through ``engine``."""
    if settings.artifacts_dir:
        return LocalDirArtifactStore(Path(settings.artifacts_dir))
    return PostgresArtifactStore(engine)
