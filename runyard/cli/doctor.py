"""``runyard doctor``: the isolation tiers this machine's engine offers, each proved by the
short form of the conformance suite (every escape probe and the runner contract, in one
container per tier)."""

from __future__ import annotations

import argparse

from runyard.cli.common import EXIT_FAILED, EXIT_OK, say
from runyard.domain.isolation import KNOWN_TIERS, limits_problem, offered_tiers
from runyard.runner import RunnerUnavailable
from runyard.runners.docker.probes import PROBE_IMAGE, TierCheck, check_tier


def report_lines(
    runtimes: list[str], checks: list[TierCheck], unlimited: str | None = None
) -> list[str]:
    """What doctor prints: the engine's runtimes (and why it cannot limit a tool, if so),
    then each tier, its verdict and every probe that escaped (all held: one line)."""
    lines = [f"engine runtimes: {', '.join(sorted(runtimes)) or 'none listed'}"]
    if unlimited is not None:
        lines.append(f"engine FAILED: {unlimited}")
    checked = {check.tier.name: check for check in checks}
    for tier in KNOWN_TIERS:
        check = checked.get(tier.name)
        if check is None:
            lines.append(f"tier {tier.name} ({tier.runtime}): not offered by this engine")
            continue
        verdict = "ok" if check.passed else "FAILED"
        lines.append(f"tier {tier.name} ({tier.runtime}): {verdict} ({tier.kernel})")
        if check.contract_problem is not None:
            lines.append(f"  runner contract: {check.contract_problem}")
        escaped = [name for name, held in check.held.items() if not held]
        if escaped:
            lines.append(f"  escaped: {', '.join(escaped)}")
        elif check.held:
            lines.append(f"  {len(check.held)} escape probes held")
    return lines


def _doctor(args: argparse.Namespace) -> int:
    # The engine's client and runner are imported here, not with the CLI: every other command
    # would pay for them at its start.
    import docker
    import docker.errors

    from runyard.runners.docker.runner import DockerRunner

    try:
        client = docker.from_env(timeout=60)
        info = client.info()
        runtimes = list((info.get("Runtimes") or {}).keys())
    except docker.errors.DockerException as exc:
        say(f"error: cannot reach the Docker engine: {exc}")
        return EXIT_FAILED
    runner = DockerRunner(client)
    try:
        checks = [check_tier(runner, tier, args.image) for tier in offered_tiers(runtimes)]
    except RunnerUnavailable as exc:
        say(f"error: {exc}")
        return EXIT_FAILED
    finally:
        client.close()
    unlimited = limits_problem(info)
    for line in report_lines(runtimes, checks, unlimited):
        print(line)  # noqa: T201 (the command's report)
    passed = unlimited is None and all(check.passed for check in checks)
    return EXIT_OK if passed else EXIT_FAILED


def add_doctor_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``runyard doctor``."""
    doctor = sub.add_parser(
        "doctor",
        help="list the isolation tiers the Docker engine offers and prove each with probes",
    )
    doctor.add_argument(
        "--image", default=PROBE_IMAGE, help=f"the busybox image to probe with ({PROBE_IMAGE})"
    )
    doctor.set_defaults(func=_doctor)
