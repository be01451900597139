"""The queue's plain values: the admission depth estimate."""

from __future__ import annotations

from runyard.queue.values import DepthEstimate


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


def test_depth_estimate__a_count_expires():
    depth = DepthEstimate(ttl=0)
    depth.counted(0)
    assert not depth.far_below(100)
