"""Attempt work directories prepared on the engine's host, mounted as bind-backed volumes.

The archive API writes an attempt's input through a helper process the engine starts for
every upload (about 60 ms on Docker 20.10). A worker on the engine's host can instead write
``input.json`` and ``out/`` into a directory of its own and have the engine mount that
directory as the attempt's named volume: the tool sees the same ``/runyard`` either way.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runyard.domain.tool_json import DEFAULT_MAX_DEPTH, decode_result
from runyard.runner import RunnerUnavailable
from runyard.runners.docker.labels import LABEL_WORKDIR
from runyard.runners.docker.outputs import tool_ids

_ATTEMPT_DIR = re.compile(
    r"^runyard-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})-([1-9][0-9]{0,8})$"
)


def parse_attempt_name(name: str) -> tuple[uuid.UUID, int] | None:
    """``(run_id, attempt)`` of a ``runyard-{run_id}-{attempt}`` name, else None."""
    match = _ATTEMPT_DIR.match(name)
    if match is None:
        return None
    return uuid.UUID(match.group(1)), int(match.group(2))


class HostWorkdirs:
    """One directory per attempt under ``root``, on the host the Docker engine runs on."""

    def __init__(self, root: Path) -> None:
        self._root = root

    @classmethod
    def open(cls, root: str) -> HostWorkdirs:
        """Check and create ``root`` (absolute, owned by root, mode 0700)."""
        path = Path(root)
        if not path.is_absolute():
            raise ValueError(f"RUNYARD_HOST_WORKDIR_ROOT must be an absolute path, not {root!r}")
        if os.geteuid() != 0:
            # The tool's out/ must belong to its uid, and the tool's files must be removable.
            raise ValueError("RUNYARD_HOST_WORKDIR_ROOT needs the worker to run as root")
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.chmod(0o700)
        problem = check_powers(path)
        if problem is not None:
            raise ValueError(f"RUNYARD_HOST_WORKDIR_ROOT: {problem}")
        return cls(path)

    @property
    def root(self) -> Path:
        """The directory holding the attempts' directories."""
        return self._root

    def path(self, name: str) -> Path:
        """The directory of the attempt named ``name``."""
        if parse_attempt_name(name) is None:
            raise ValueError(f"not an attempt name: {name!r}")
        return self._root / name

    def volume_options(self, name: str) -> dict[str, str]:
        """The local driver's options that make the volume ``name`` this directory."""
        return self.bind_options(self.path(name))

    @staticmethod
    def bind_options(path: Path) -> dict[str, str]:
        """The local driver's options that make a volume the directory ``path``."""
        return {"type": "none", "o": "bind", "device": str(path)}

    def prepare(self, name: str, files: Mapping[str, bytes], user: str) -> bool:
        """Write the attempt's files (``input.json``, ``deps.json``: root, 0444) and ``out/``
        (the tool's uid); False if the directory already existed (it is left untouched: a
        container may be using it)."""
        path = self.path(name)
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:
            return False
        except OSError as exc:
            raise RunnerUnavailable(f"cannot make the work directory {path}: {exc}") from exc
        try:
            self._fill(path, files, user)
        except OSError as exc:
            self.remove(name)
            raise RunnerUnavailable(f"cannot write the work directory {path}: {exc}") from exc
        return True

    def reset(self, name: str, files: Mapping[str, bytes], user: str) -> None:
        """Replace a directory left by an attempt whose container no longer exists."""
        self.remove(name)
        if not self.prepare(name, files, user):
            raise RunnerUnavailable(f"work directory {self.path(name)} reappeared")

    def remove(self, name: str) -> None:
        """Remove the attempt's directory and whatever the tool wrote (links not followed)."""
        try:
            shutil.rmtree(self.path(name))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise RunnerUnavailable(f"cannot remove {self.path(name)}: {exc}") from exc

    def read_result(
        self, name: str, cap: int, max_depth: int = DEFAULT_MAX_DEPTH
    ) -> tuple[Any | None, str | None]:
        """``out/result.json`` as the exited tool left it: absent, or one small regular file.

        Opened without following links at any step, so a tool cannot make the worker read a
        file outside its own directory.
        """
        nofollow = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            top = os.open(self.path(name), nofollow | os.O_DIRECTORY)
        except FileNotFoundError as exc:
            raise RunnerUnavailable(f"the work directory of {name} is gone") from exc
        try:
            out = os.open("out", nofollow | os.O_DIRECTORY, dir_fd=top)
            try:
                fd = os.open("result.json", nofollow | os.O_NONBLOCK, dir_fd=out)
            finally:
                os.close(out)
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None, "result.json is a link; only a regular file is accepted"
            return None, f"result.json could not be read: {exc.strerror}"
        finally:
            os.close(top)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            return None, "result.json must be a single regular file"
        with os.fdopen(fd, "rb") as stream:
            if info.st_size > cap:
                return None, f"result.json is larger than {cap} bytes"
            data = stream.read(cap + 1)
        if len(data) > cap:
            return None, f"result.json is larger than {cap} bytes"
        return decode_result(data, max_depth=max_depth)

    def attempts(self) -> list[tuple[uuid.UUID, int]]:
        """The attempts that have a directory here."""
        found = []
        with os.scandir(self._root) as entries:
            for entry in entries:
                attempt = parse_attempt_name(entry.name)
                if attempt is not None:
                    found.append(attempt)
        return found

    def _fill(self, path: Path, files: Mapping[str, bytes], user: str) -> None:
        uid, gid = tool_ids(user)
        path.chmod(0o755)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        for name, payload in files.items():
            fd = os.open(path / name, flags, 0o444)
            with os.fdopen(fd, "wb") as stream:
                stream.write(payload)
        out = path / "out"
        out.mkdir(mode=0o755)
        os.chown(out, uid, gid)


def check_powers(root: Path) -> str | None:
    """The problem, if root here cannot hand ``out/`` to a tool's uid and remove what the
    tool writes (a root without CAP_CHOWN or CAP_DAC_OVERRIDE); None if it can."""
    probe = root / f".probe-{uuid.uuid4().hex}"
    try:
        probe.mkdir(mode=0o755)
        os.chown(probe, 65534, 65534)
        (probe / "file").write_bytes(b"")
        shutil.rmtree(probe)
    except OSError as exc:
        shutil.rmtree(probe, ignore_errors=True)
        return (
            "host work directories need a root with CAP_CHOWN and CAP_DAC_OVERRIDE "
            f"(to give out/ to the tool's uid and remove its files): {exc.strerror}"
        )
    return None


class AttemptDirs:
    """The runner's host work directories, shared by its parts: ``workdirs`` stays for the
    reads and the cleanup of attempts made that way, while ``inputs`` (where new attempts get
    their input) drops to None (uploads) for good if the engine cannot see them."""

    def __init__(self, workdirs: HostWorkdirs | None) -> None:
        self.workdirs = workdirs
        self.inputs = workdirs

    def choose(self, workdirs: HostWorkdirs | None) -> None:
        """Host work directories under ``workdirs`` from now on, or uploads for None."""
        self.workdirs = workdirs
        self.inputs = workdirs

    def upload_from_now(self) -> None:
        """New attempts get their input uploaded: the engine cannot see the directories."""
        self.inputs = None

    def host_dir(self, name: str, labels: Mapping[str, str]) -> Path | None:
        """The attempt's host work directory if it was made that way under this runner's root;
        None otherwise (uploaded, or made under another root by a worker configured
        differently): its outputs are then read through the engine, which works for both."""
        if self.workdirs is None or labels.get(LABEL_WORKDIR) != "host":
            return None
        path = self.workdirs.path(name)
        return path if path.is_dir() else None
