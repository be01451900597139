"""runyard: Docker-container tool execution platform with a durable Postgres queue."""

from __future__ import annotations

__version__ = "0.1.0"
