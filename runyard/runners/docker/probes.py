"""Escape probes: what a tool tries in order to reach past its container, and the short
conformance check that runs them under each isolation tier an engine offers.

One container per tier runs every probe (a busybox shell is all they need) and writes a
result, so a check also proves the runner contract end to end under that tier. The
conformance suite (``tests/conformance/``) asserts each probe per tier; ``runyard doctor``
prints the same check for the engine it is pointed at.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from runyard.domain.attempt import AttemptSpec
from runyard.domain.isolation import Tier
from runyard.domain.states import RunStatus
from runyard.runner import AttemptControl, Runner

PROBE_IMAGE = "runyard/toolbox:latest"
_MARK = "runyard-probe"
# How a kernel (the host's or gVisor's) words the refusal of a socket.
_REFUSED = "not permitted|denied|not supported"


@dataclass(frozen=True)
class Probe:
    """One escape attempt: ``attempt`` is a shell command that succeeds only if it got out."""

    name: str
    attempt: str


PROBES = (
    # Any capability left (effective or in the bounding set), or a way to become root.
    Probe(
        "capabilities",
        "! grep -Eq '^CapEff:[[:space:]]*0+$' /proc/self/status"
        " || ! grep -Eq '^CapBnd:[[:space:]]*0+$' /proc/self/status"
        " || setpriv --reuid=0 --regid=0 --clear-groups true",
    ),
    # Asked of the kernel (prctl), not /proc: gVisor's status file has no such line.
    Probe("no-new-privileges", "! setpriv -d | grep -q '^no_new_privs: 1$'"),
    Probe("mount", "mount -t tmpfs none /tmp || mount -t proc proc /tmp"),
    Probe("new namespaces", "unshare -m true || unshare -n true || unshare -U -r true"),
    Probe(
        "/proc writes",
        "echo h > /proc/sysrq-trigger || echo probe > /proc/sys/kernel/hostname"
        " || echo 1 > /proc/sys/vm/drop_caches",
    ),
    Probe(
        "/sys writes",
        "mkdir /sys/fs/cgroup/runyard-probe || echo 1 > /sys/kernel/profiling"
        " || echo add > /sys/class/net/lo/uevent",
    ),
    # A raw IP or packet socket (spoofing, sniffing): the error must be a refusal, not a
    # silent network.
    Probe(
        "raw sockets",
        f"! traceroute -n -m 1 -w 1 -q 1 127.0.0.1 2>&1 | grep -Eqi '{_REFUSED}'"
        f" || ! arping -c 1 -w 1 -I lo 127.0.0.1 2>&1 | grep -Eqi '{_REFUSED}'",
    ),
    # gVisor lets a node be made on /tmp, but it opens to nothing: only a read counts.
    Probe(
        "device nodes",
        "ls /dev | grep -Eq '^(sd|vd|xvd|nvme|loop)'"
        " || { mknod /tmp/probe-sda b 8 0 && head -c 1 /tmp/probe-sda; }"
        " || { mknod /tmp/probe-vda b 254 0 && head -c 1 /tmp/probe-vda; }",
    ),
    # The host's processes (to signal or ptrace them) must not even be visible.
    # By their names (comm), never their command lines: this script's own names them.
    Probe(
        "host processes",
        "cat /proc/[0-9]*/comm | grep -Eqx 'dockerd|containerd|systemd|init|kthreadd'",
    ),
    Probe("metadata address", "timeout 3 wget -q -O /dev/null http://169.254.169.254/"),
    Probe(
        "engine socket",
        "ls /var/run/docker.sock || ls /run/docker.sock || ls /run/containerd/containerd.sock"
        " || ls /run/podman/podman.sock",
    ),
    Probe("host root via /proc", "ls /proc/1/root/var/lib/docker || ls /proc/1/root/etc/docker"),
)


def probe_script(probes: tuple[Probe, ...] = PROBES) -> str:
    """A shell script that runs each probe and prints one line per probe, then writes a
    result so the runner's contract is checked in the same container."""
    lines = [
        f"if ( {probe.attempt} ) >/dev/null 2>&1; then echo '{_MARK} {probe.name}: ESCAPED';"
        f" else echo '{_MARK} {probe.name}: held'; fi"
        for probe in probes
    ]
    lines.append('echo \'{"probes": "done"}\' > /runyard/out/result.json')
    return "\n".join(lines)


def read_probes(stdout: str) -> dict[str, bool]:
    """Each probe's name and whether it was held, from a probe script's output."""
    held: dict[str, bool] = {}
    prefix = f"{_MARK} "
    for line in stdout.splitlines():
        if line.startswith(prefix) and ": " in line:
            name, _, verdict = line[len(prefix) :].rpartition(": ")
            held[name] = verdict == "held"
    return held


@dataclass(frozen=True)
class TierCheck:
    """What the short conformance check found under one tier."""

    tier: Tier
    # The run's own outcome: it must succeed with the result the script wrote.
    contract_problem: str | None
    held: dict[str, bool]

    @property
    def passed(self) -> bool:
        """Every probe held and the run kept the contract."""
        return (
            self.contract_problem is None
            and len(self.held) == len(PROBES)
            and all(self.held.values())
        )


def probe_spec(tier: Tier, image: str = PROBE_IMAGE, **tool: Any) -> AttemptSpec:
    """An attempt that runs every probe under ``tier`` with the default tool limits."""
    definition: dict[str, Any] = {
        "name": "runyard-probe",
        "image": image,
        "command": ["sh", "-c", probe_script()],
        "runtime": tier.runtime,
        "network": "none",
        "user": "65534:65534",
        "timeout_seconds": 60,
        "memory_mb": 64,
        "cpus": 0.5,
        "pids_limit": 64,
        **tool,
    }
    return AttemptSpec(
        run_id=uuid.uuid4(),
        attempt=1,
        tool=definition,
        input={},
        deadline_at=datetime.now(UTC) + timedelta(seconds=int(definition["timeout_seconds"])),
    )


def check_tier(runner: Runner, tier: Tier, image: str = PROBE_IMAGE) -> TierCheck:
    """Run every probe under ``tier`` through ``runner``; its container is removed after."""
    spec = probe_spec(tier, image)
    try:
        result = runner.run(spec, AttemptControl())
    finally:
        runner.discard(spec.run_id, spec.attempt)
    problem = None
    if result.status != RunStatus.SUCCEEDED:
        problem = f"the probe run ended {result.status.value}: {result.error or result.stderr}"
    elif result.result != {"probes": "done"}:
        problem = f"the probe run's result came back as {result.result!r}"
    return TierCheck(tier, problem, read_probes(result.stdout))
