"""The queue's plain values: the admission depth estimate, the caps and their refusals."""

from __future__ import annotations

import pytest

from runyard.queue.values import AdmissionCaps, DepthEstimate


def test_depth_estimate__counts_until_a_count_says_far_below_the_cap():
    depth = DepthEstimate(ttl=60)
    assert not depth.far_below(100)  # nothing counted yet
    depth.counted(10)
    assert depth.far_below(100)
    assert not depth.far_below(20)  # at half the cap every submit counts again


def test_depth_estimate__own_admits_bring_it_near_the_cap():
    depth = DepthEstimate(ttl=60)
    depth.counted(0)
    for _ in range(49):
        depth.admitted()
    assert depth.far_below(100)
    depth.admitted()
    assert not depth.far_below(100)


def test_depth_estimate__far_below_a_count_lasts_ten_times_as_long():
    clock = [100.0]
    depth = DepthEstimate(ttl=1, clock=lambda: clock[0])
    depth.counted(9)
    clock[0] += 9.5
    assert depth.far_below(100)  # under a tenth of the cap: ten seconds
    assert not depth.far_below(90)  # over a tenth: one second
    depth.admitted()  # a tenth of the cap with its own admits: one second now
    assert not depth.far_below(100)
    clock[0] += 1
    depth.counted(9)
    clock[0] += 10
    assert not depth.far_below(100)  # ten seconds is as long as it lasts


def test_depth_estimate__a_count_expires():
    depth = DepthEstimate(ttl=0)
    depth.counted(0)
    assert not depth.far_below(100)


def test_admission_caps__name_their_bind_parameters():
    caps = AdmissionCaps(
        tenant_max_queued=1,
        tenant_max_running=2,
        tenant_max_created=3,
        created_window_seconds=60,
        tenant_max_stored=4,
    )
    assert caps.tenant_params() == {
        "queued_cap": 1,
        "running_cap": 2,
        "created_cap": 3,
        "stored_cap": 4,
        "window_seconds": 60,
    }


@pytest.mark.parametrize(
    ("reason", "limit", "retry_after", "says"),
    [
        ("tenant_queued", 1, None, "already has 1 queued runs"),
        ("tenant_running", 2, None, "already has 2 running runs"),
        ("tenant_created", 3, 42, "may create 3 runs per 60 s"),
        ("tenant_stored", 4, None, "may keep 4 runs"),
    ],
)
def test_admission_caps__a_refusal_names_its_cap_and_when_to_retry(
    reason: str, limit: int, retry_after: int | None, says: str
):
    caps = AdmissionCaps(
        tenant_max_queued=1,
        tenant_max_running=2,
        tenant_max_created=3,
        created_window_seconds=60,
        tenant_max_stored=4,
    )
    refused = caps.refusal(reason, 42)
    assert (refused.reason, refused.limit, refused.retry_after) == (reason, limit, retry_after)
    assert says in str(refused)
    if retry_after is not None:
        assert str(refused).endswith("the window ends in 42 s")
