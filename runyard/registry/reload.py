"""Reloading the tool registry while the process runs: the file is re-read on a short
interval, a valid new version replaces the tools in place, an invalid one is refused and the
tools loaded before are kept (docs/decisions/0019-registry-reload-by-polling.md)."""

from __future__ import annotations

import hashlib
import logging
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from runyard.platform.settings import Settings
from runyard.registry.tools import RegistryError, ToolRegistry, ToolSpec, parse_registry

logger = logging.getLogger(__name__)


class LiveTools(Mapping[str, ToolSpec]):
    """The tools of a registry, swapped whole by a reload: a reader sees the old set or the
    new one, never a mix (one reference assignment)."""

    def __init__(self, tools: Mapping[str, ToolSpec]) -> None:
        self._tools: Mapping[str, ToolSpec] = dict(tools)

    def replace(self, tools: Mapping[str, ToolSpec]) -> None:
        """From now on, these tools."""
        self._tools = dict(tools)

    def __getitem__(self, name: str) -> ToolSpec:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)


@dataclass(frozen=True)
class RegistryChanges:
    """What a new registry adds, removes and changes, by tool name."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def registry_changes(old: Mapping[str, ToolSpec], new: Mapping[str, ToolSpec]) -> RegistryChanges:
    """The tools added, removed and changed from ``old`` to ``new``, each sorted."""
    return RegistryChanges(
        added=tuple(sorted(set(new) - set(old))),
        removed=tuple(sorted(set(old) - set(new))),
        changed=tuple(sorted(n for n in set(old) & set(new) if old[n] != new[n])),
    )


def _fingerprint(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class RegistryWatcher:
    """Re-reads the registry file when asked (``check``, run every ``interval_seconds`` by
    the process's chores); a file whose bytes changed is parsed and, when valid, handed to
    ``on_change``."""

    def __init__(
        self,
        path: Path,
        settings: Settings,
        on_change: Callable[[ToolRegistry, RegistryChanges], None],
        *,
        current: Mapping[str, ToolSpec],
        interval_seconds: float,
        process: str,
    ) -> None:
        self._path = path
        self._settings = settings
        self._on_change = on_change
        self._current: Mapping[str, ToolSpec] = dict(current)
        self._interval = interval_seconds
        self._process = process
        # The bytes last looked at (loaded or refused): an unchanged file is not parsed again,
        # and a broken one is logged once, not at every turn.
        self._seen = self._read_fingerprint()

    def _read_fingerprint(self) -> str | None:
        try:
            return _fingerprint(self._path.read_bytes())
        except OSError:
            return None

    def check(self) -> bool:
        """Look at the file once; True when a new registry was taken."""
        try:
            data = self._path.read_bytes()
        except OSError as exc:
            return self._refuse(f"cannot read it: {exc}", f"unreadable:{exc.errno}")
        seen = _fingerprint(data)
        if seen == self._seen:
            return False
        try:
            document = tomllib.loads(data.decode("utf-8"))
            registry = parse_registry(document, self._settings, self._path.resolve().parent)
        except (UnicodeDecodeError, tomllib.TOMLDecodeError, RegistryError) as exc:
            return self._refuse(str(exc), seen)
        self._seen = seen
        changes = registry_changes(self._current, registry.tools)
        self._current = dict(registry.tools)
        self._on_change(registry, changes)
        logger.info(
            "tool registry %s reloaded: %d tools (added %s, removed %s, changed %s)",
            self._path,
            len(registry.tools),
            ", ".join(changes.added) or "none",
            ", ".join(changes.removed) or "none",
            ", ".join(changes.changed) or "none",
            extra={
                "tools_file": str(self._path),
                "service": self._process,
                "tools": len(registry.tools),
                "added": list(changes.added),
                "removed": list(changes.removed),
                "changed": list(changes.changed),
            },
        )
        return True

    def _refuse(self, why: str, seen: str) -> bool:
        if seen != self._seen:
            self._seen = seen
            logger.error(
                "tool registry %s changed but is refused, the %d tools loaded before are kept: %s",
                self._path,
                len(self._current),
                why,
                extra={"tools_file": str(self._path), "service": self._process, "error": why},
            )
        return False

    @property
    def interval_seconds(self) -> float:
        """How often ``check`` should run (0: never, reload is off)."""
        return self._interval


def live_registry(
    registry: ToolRegistry, settings: Settings, *, process: str
) -> tuple[ToolRegistry, RegistryWatcher]:
    """``registry`` (loaded from ``settings.tools_file``) with tools a watcher keeps current:
    every holder of the returned registry sees each reload."""
    live = LiveTools(registry.tools)
    watched = ToolRegistry(
        tools=live,
        base_dir=registry.base_dir,
        builds=registry.builds,
        source=settings.tools_file,
        reload_seconds=settings.tools_reload_seconds or None,
        tenant_flow=settings.tenant_flow_limit(),
    )

    def take(new: ToolRegistry, changes: RegistryChanges) -> None:
        live.replace(new.tools)

    watcher = RegistryWatcher(
        settings.tools_file,
        settings,
        take,
        current=registry.tools,
        interval_seconds=settings.tools_reload_seconds,
        process=process,
    )
    return watched, watcher
