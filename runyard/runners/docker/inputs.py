"""How attempts get their ``/runyard``: host work directories when proved safe, else uploads.

``RUNYARD_HOST_WORKDIR_ROOT`` is ``auto`` (the default: host work directories under
``DEFAULT_ROOT`` when this process is root with the powers they need *and* the engine reads
back a random marker written there), an absolute path (host work directories there, forced),
or ``upload`` / ``off`` / empty (uploads, forced). ``decide_inputs`` is the rule; ``choose``
gathers its evidence.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tarfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions
from docker.types import DriverConfig, Mount

from runyard.runners.docker.host_workdirs import HostWorkdirs, check_powers

logger = logging.getLogger(__name__)

AUTO = "auto"
UPLOAD_WORDS = frozenset({"", "upload", "off"})
DEFAULT_ROOT = "/var/lib/runyard/attempts"
LABEL_PROBE = "io.runyard.workdir_probe"
_MARKER = "marker"
_TRANSPORT_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


class InputMode(StrEnum):
    """How an attempt's input reaches its ``/runyard``."""

    HOST = "host"
    UPLOAD = "upload"
    REFUSE = "refuse"  # a forced host root that cannot work: the process must not start


@dataclass(frozen=True)
class InputsChoice:
    """The decision, the root it applies to (host mode) and why, for the start log."""

    mode: InputMode
    root: str | None
    reason: str


def root_of(setting: str) -> str | None:
    """The directory a setting asks for (``DEFAULT_ROOT`` for ``auto``), None for uploads."""
    value = setting.strip()
    if value.lower() in UPLOAD_WORDS:
        return None
    return DEFAULT_ROOT if value.lower() == AUTO else value


def decide_inputs(
    setting: str, *, is_root: bool, powers: str | None, probe: str | None
) -> InputsChoice:
    """The input mode for ``RUNYARD_HOST_WORKDIR_ROOT=setting``; ``powers`` and ``probe`` are
    the problems found (None: fine, or not looked at because an earlier step decided)."""
    value = setting.strip()
    root = root_of(value)
    if root is None:
        return InputsChoice(InputMode.UPLOAD, None, f"RUNYARD_HOST_WORKDIR_ROOT={value!r}")
    if not Path(root).is_absolute():
        reason = f"RUNYARD_HOST_WORKDIR_ROOT must be an absolute path, not {root!r}"
        return InputsChoice(InputMode.REFUSE, root, reason)
    forced = value.lower() != AUTO
    problem = None
    if not is_root:
        # The tool's out/ must belong to its uid, and the tool's files must be removable.
        problem = "host work directories need the worker to run as root"
    elif powers is not None:
        problem = powers
    elif probe is not None and not forced:
        problem = probe
    if problem is None:
        why = "forced by RUNYARD_HOST_WORKDIR_ROOT" if forced else "the engine read back a marker"
        return InputsChoice(InputMode.HOST, root, why)
    if forced:
        return InputsChoice(InputMode.REFUSE, root, f"RUNYARD_HOST_WORKDIR_ROOT: {problem}")
    return InputsChoice(InputMode.UPLOAD, None, problem)


def choose(
    setting: str, api: Any, image: Callable[[], str], *, is_root: bool | None = None
) -> tuple[HostWorkdirs | None, InputsChoice]:
    """Gather the evidence in order (root, powers, then the engine probe for ``auto``), decide,
    and log the decision once; ``image`` names an image to create the probe container from."""
    root = root_of(setting)
    is_root = os.geteuid() == 0 if is_root is None else is_root
    powers = probe = None
    if root is not None and Path(root).is_absolute() and is_root:
        powers = _prepare_root(Path(root))
        if powers is None and setting.strip().lower() == AUTO:
            probe = probe_engine(api, Path(root), image)
    choice = decide_inputs(setting, is_root=is_root, powers=powers, probe=probe)
    if choice.mode is InputMode.REFUSE:
        raise ValueError(choice.reason)
    extra = {"inputs": str(choice.mode), "reason": choice.reason}
    if choice.mode is InputMode.HOST:
        assert choice.root is not None
        logger.info("inputs: host work directories under %s", choice.root, extra=extra)
        return HostWorkdirs(Path(choice.root)), choice
    logger.info("inputs: uploaded with the Docker archive API", extra=extra)
    return None, choice


def _prepare_root(root: Path) -> str | None:
    """Create ``root`` (0700) and check the powers host directories need; the problem, if any."""
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.chmod(0o700)
    except OSError as exc:
        return f"cannot make {root}: {exc.strerror}"
    return check_powers(root)


def probe_engine(api: Any, root: Path, image: Callable[[], str]) -> str | None:
    """None if the engine sees ``root`` as this process does: a random marker written in a
    fresh directory under it is read back through a created (never started) container that
    mounts the directory as attempts do. A remote engine fails even where the same path exists
    on its host too, since the marker is not there."""
    token = uuid.uuid4().hex
    directory = root / f".probe-{token}"
    name = f"runyard-workdir-probe-{token}"
    labels = {LABEL_PROBE: "true"}
    try:
        directory.mkdir(mode=0o700)
        (directory / _MARKER).write_text(token)
        workdirs = HostWorkdirs(root)
        mount = Mount(
            target="/probe",
            source=name,
            type="volume",
            read_only=True,
            labels=labels,
            driver_config=DriverConfig("local", workdirs.bind_options(directory)),
        )
        api.create_container(
            image(),
            command=["/probe"],
            name=name,
            labels=labels,
            network_disabled=True,
            host_config=api.create_host_config(network_mode="none", mounts=[mount]),
        )
        stream, _ = api.get_archive(name, f"/probe/{_MARKER}")
        seen = _single_file(b"".join(stream))
    except docker.errors.NotFound:
        return f"the Docker engine sees another directory at {root} (is it on another host?)"
    except docker.errors.APIError as exc:
        return (
            f"the Docker engine does not see {root} as this process does (is it on another "
            f"host?): {exc.explanation or exc}"
        )
    except (OSError, tarfile.TarError, *_TRANSPORT_ERRORS) as exc:
        return f"the host work directory probe failed: {exc}"
    finally:
        _remove_probe(api, name, directory)
    if seen != token.encode():
        return f"the Docker engine sees another directory at {root} (is it on another host?)"
    return None


def _single_file(archive: bytes) -> bytes | None:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        members = tar.getmembers()
        if len(members) != 1 or not members[0].isreg():
            return None
        handle = tar.extractfile(members[0])
        return handle.read(4096) if handle is not None else None


def _remove_probe(api: Any, name: str, directory: Path) -> None:
    for kind in ("container", "volume"):
        try:
            if kind == "container":
                api.remove_container(name, force=True)
            else:
                api.remove_volume(name, force=True)
        except docker.errors.NotFound:
            pass
        except _TRANSPORT_ERRORS as exc:
            logger.warning(
                "could not remove the probe %s %s", kind, name, extra={"error": str(exc)}
            )
    shutil.rmtree(directory, ignore_errors=True)
