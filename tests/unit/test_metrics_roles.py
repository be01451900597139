"""Which series a process exports: those of the roles it runs, each once."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from runyard.queue.values import AdmissionRefused, IdempotencyConflict
from runyard.reads.metrics import Metrics, Role
from runyard.submission.request import InvalidInput, UnknownTool
from runyard.submission.results import submission_result
from tests.metrics_support import moved_series


def exported_names(metrics: Metrics) -> set[str]:
    return set(moved_series(generate_latest(metrics.registry).decode()))


def test_export__shows_only_the_roles_of_the_process():
    metrics = Metrics().export(Role.REAPER, Role.WEBHOOKS)
    assert exported_names(metrics) == {"runyard_reaper_actions", "runyard_webhook_attempts"}
    assert "runyard_worker_engine_up" not in exported_names(metrics)


def test_export__twice_is_once():
    metrics = Metrics().export(Role.WORKER).export(Role.WORKER, Role.ATTEMPTS)
    assert metrics.exported == {Role.WORKER, Role.ATTEMPTS}
    assert set(metrics.names(Role.WORKER)) <= exported_names(metrics)


def test_names__every_series_has_one_role():
    metrics = Metrics()
    names = [name for role in Role for name in metrics.names(role)]
    assert len(names) == len(set(names))
    assert "runyard_api_submissions" in metrics.names(Role.API)


def refused() -> AdmissionRefused:
    return AdmissionRefused("queue_full", 10)


def wrapped(cause: Exception) -> Exception:
    try:
        raise ValueError("item 0") from cause
    except ValueError as exc:
        return exc


@pytest.mark.parametrize(
    ("error", "created", "result"),
    [
        (None, True, "created"),
        (None, False, "replayed"),
        (refused(), True, "refused"),
        (UnknownTool("nope"), True, "rejected"),
        (InvalidInput("bad", "n"), True, "rejected"),
        (IdempotencyConflict("other body"), True, "rejected"),
        (wrapped(InvalidInput("bad", "n")), True, "rejected"),
        (RuntimeError("database gone"), True, "error"),
    ],
)
def test_submission_result__labels_each_ending(error: Exception | None, created: bool, result: str):
    assert submission_result(error, created=created) == result
