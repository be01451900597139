"""The engine's errors, sorted: a refusal of the container's own settings ends the run, engine
trouble pauses the worker. The messages are ones Docker 20.10 gave on this machine (and, for
older engines, the 5xx they answered instead)."""

from __future__ import annotations

import pytest

from runyard.runners.docker.refusals import name_in_use, refused_for_settings

CGROUP_QUOTA = (
    "failed to create shim task: OCI runtime create failed: runc create failed: unable to start"
    " container process: error during container init: error setting cgroup config for procHooks"
    ' process: failed to write "500": write /sys/fs/cgroup/cpu/docker/eca06d971f39/'
    "cpu.cfs_quota_us: invalid argument: unknown"
)
RLIMIT = (
    "failed to create shim task: OCI runtime create failed: runc create failed: unable to start"
    " container process: error during container init: error setting rlimits for ready process:"
    " error setting rlimit type 7: operation not permitted: unknown"
)
NO_EXECUTABLE = (
    "failed to create shim task: OCI runtime create failed: runc create failed: unable to start"
    ' container process: exec: "nope": executable file not found in $PATH: unknown'
)
NO_FILE = (
    "failed to create shim task: OCI runtime create failed: runc create failed: unable to start"
    ' container process: exec: "/nope": stat /nope: no such file or directory: unknown'
)
DISK_FULL = (
    "failed to create shim task: OCI runtime create failed: runc create failed: unable to start"
    " container process: error during container init: mkdir /var/lib/docker/overlay2/x/merged:"
    " no space left on device: unknown"
)


@pytest.mark.parametrize(
    ("status", "message", "refused"),
    [
        # The daemon's own checks at create: 400.
        (400, "Range of CPUs is from 0.01 to 2.00, as there are only 2 CPUs available", True),
        (400, "Minimum memory limit allowed is 6MB", True),
        (400, "Minimum memoryswap limit should be larger than memory limit, see usage", True),
        (400, "the working directory 'relative' is invalid, it needs to be an absolute path", True),
        (400, "invalid reference format", True),
        # The runtime at start: 400 for the tool's command, 500 for a limit it cannot apply.
        (400, NO_EXECUTABLE, True),
        (400, NO_FILE, True),
        (500, CGROUP_QUOTA, True),
        (500, RLIMIT, True),
        (500, "uids and gids must be in range 0-2147483647", True),
        (500, NO_EXECUTABLE, True),
        (500, "Range of CPUs is from 0.01 to 2.00, as there are only 2 CPUs available", True),
        # Not about the settings: adopted, looked up again, or waited for.
        (404, "No such container: runyard-x-1", False),
        (404, "network nosuchnet not found", False),
        (409, 'Conflict. The container name "/runyard-x-1" is already in use', False),
        (408, "request timed out", False),
        (429, "too many requests", False),
        # A socket proxy in front of the engine refusing the worker: its configuration.
        (403, "Request forbidden by administrative rules.", False),
        (403, "authorization denied by plugin authz-broker: no policy allows this", False),
        (401, "Unauthorized", False),
        # Engine trouble: stays as it was (release, pause the claims, retry).
        (500, DISK_FULL, False),
        (500, "failed to create shim task: context deadline exceeded: unknown", False),
        (
            500,
            "error while creating mount source path '/x': mkdir /x: read-only file system",
            False,
        ),
        (500, "driver failed programming external connectivity on endpoint runyard-x-1", False),
        (500, "containerd: transport is closing: unavailable", False),
        (502, "Bad Gateway", False),
        (503, "Service Unavailable", False),
        (None, "Connection aborted.", False),
        (None, "Read timed out. (read timeout=30)", False),
    ],
)
def test_refused_for_settings__sorts_real_engine_messages(
    status: int | None, message: str, refused: bool
):
    assert refused_for_settings(status, message) is refused


PODMAN_NAME_IN_USE = (
    'container create: creating container storage: the container name "runyard-23b0-1" is '
    "already in use by 305df01332c4. You have to remove that container to be able to reuse that "
    "name: that name is already in use"
)


@pytest.mark.parametrize(
    ("status", "message", "in_use"),
    [
        (500, PODMAN_NAME_IN_USE, True),
        (500, DISK_FULL, False),
        (409, "Conflict. The container name is already in use", False),  # Docker's own 409
    ],
)
def test_name_in_use__podmans_500_for_an_existing_name(status: int, message: str, in_use: bool):
    assert name_in_use(status, message) is in_use
