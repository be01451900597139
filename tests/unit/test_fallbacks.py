"""What the worker stores instead of an outcome it cannot store, or of a runner's crash."""

from __future__ import annotations

import psycopg
from sqlalchemy import exc as sa

from runyard.domain.attempt import AttemptResult
from runyard.domain.fallbacks import ERROR_CAP, crashed_outcome, storable_text, unstorable_outcomes
from runyard.domain.states import ErrorCode, RunStatus

OUTCOME = AttemptResult(
    status=RunStatus.SUCCEEDED,
    exit_code=0,
    result={"x": float("nan")},
    stdout="out\x00put",
    stderr="err\ud800",
    error_code=None,
    image_digest="sha256:abc",
)
REFUSED = sa.DataError("INSERT", {"result": "NaN"}, psycopg.DataError("invalid input syntax"))


def test_unstorable_outcomes__safest_last_and_never_a_result():
    kept, cleaned, bare = unstorable_outcomes(OUTCOME, REFUSED)
    for outcome in (kept, cleaned, bare):
        assert outcome.status is RunStatus.FAILED
        assert outcome.error_code == ErrorCode.INTERNAL
        assert outcome.result is None
        assert outcome.error == "the outcome could not be stored: DataError: invalid input syntax"
    assert (kept.stdout, kept.stderr, kept.exit_code) == (OUTCOME.stdout, OUTCOME.stderr, 0)
    assert cleaned.stdout == "out\ufffdput" and "\ud800" not in cleaned.stderr
    assert (bare.stdout, bare.stderr, bare.exit_code, bare.image_digest) == ("", "", None, None)
    assert bare.stdout_truncated and bare.stderr_truncated  # something was dropped


def test_unstorable_outcomes__empty_streams_are_not_flagged_truncated():
    bare = unstorable_outcomes(AttemptResult(status=RunStatus.SUCCEEDED), REFUSED)[-1]
    assert not bare.stdout_truncated and not bare.stderr_truncated


def test_crashed_outcome__class_and_message_capped():
    outcome = crashed_outcome(KeyError("State" * 1000))
    assert outcome.status is RunStatus.FAILED and outcome.error_code == ErrorCode.INTERNAL
    assert outcome.error is not None and len(outcome.error) <= ERROR_CAP
    assert outcome.error.startswith("the attempt could not be run or collected: KeyError:")
    assert outcome.result is None


def test_storable_text__table():
    cases = {
        "plain": "plain",
        "nul\x00": "nul\ufffd",
        "lone\ud800": "lone\ufffd\ufffd\ufffd",
        "": "",
        "é ✓": "é ✓",
    }
    for given, expected in cases.items():
        assert storable_text(given) == expected
