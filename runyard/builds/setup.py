"""Wiring of builds into a registry: where submits learn and keep a built tool's source."""

from __future__ import annotations

import dataclasses

from runyard.builds.context import DiskBuildResolver
from runyard.platform.settings import Settings
from runyard.queue.builds import BuildQueue
from runyard.registry.tools import ToolRegistry


def with_builds(registry: ToolRegistry, builds: BuildQueue, settings: Settings) -> ToolRegistry:
    """The registry whose built tools resolve from their context on disk, each new digest's
    source kept in the database (so a worker anywhere can build it)."""
    # (A test may hand in a stand-in that is no ToolRegistry.)
    if not isinstance(registry, ToolRegistry) or registry.base_dir is None or registry.builds:
        return registry
    resolver = DiskBuildResolver(
        registry.base_dir,
        lambda ref, tar: builds.save_context(ref, tar),
        max_bytes=settings.build_context_max_mb * 1024 * 1024,
    )
    return dataclasses.replace(registry, builds=resolver)
