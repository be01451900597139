"""The artifact store the settings choose (composition roots only)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from runyard.artifacts.local_dir import LocalDirArtifactStore
from runyard.artifacts.postgres import PostgresArtifactStore
from runyard.artifacts.store import ArtifactStore
from runyard.settings import Settings


def store_from_settings(settings: Settings, engine: Engine) -> ArtifactStore:
    """``RUNYARD_ARTIFACTS_DIR`` if set, else Postgres through ``engine``."""
    if settings.artifacts_dir:
        return LocalDirArtifactStore(Path(settings.artifacts_dir))
    return PostgresArtifactStore(engine)
