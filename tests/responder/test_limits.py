"""Token buckets (responder.reconcile.limits).

Aspects: a bucket never allows more than its burst plus what its rate regained over any
interval (property-tested over random request times); work over the limit gets a wait, not
a refusal; a leader rebuilding the bucket from recorded action times gets the same bucket
the old leader had, so fail-over never hands out a second burst; time going back refills
nothing; settings refuse nonsense.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from responder.reconcile.limits import Bucket, BucketSettings

settings_st = st.builds(
    BucketSettings, st.integers(min_value=1, max_value=20), st.floats(min_value=0.5, max_value=7200)
)
gaps = st.lists(st.floats(min_value=0, max_value=600), min_size=1, max_size=60)


def run(settings: BucketSettings, gap_list: list[float]) -> list[float]:
    """Ask once at each time (cumulative gaps); the times that were allowed."""
    bucket, now, allowed = Bucket.full(settings, 0.0), 0.0, []
    for gap in gap_list:
        now += gap
        ok, bucket = bucket.take(now)
        if ok:
            allowed.append(now)
    return allowed


@given(settings_st, gaps)
def test_never_more_than_burst_plus_regained(settings: BucketSettings, gap_list: list[float]) -> None:
    allowed = run(settings, gap_list)
    for i, start in enumerate(allowed):
        for j in range(i, len(allowed)):
            span = allowed[j] - start
            assert j - i + 1 <= settings.burst + span / settings.refill_seconds + 1e-6


@given(settings_st, gaps)
def test_a_new_leader_rebuilds_the_same_bucket(settings: BucketSettings, gap_list: list[float]) -> None:
    now = sum(gap_list)
    allowed = run(settings, gap_list)
    live = Bucket.full(settings, 0.0)
    for t in allowed:
        _, live = live.take(t)
    rebuilt = Bucket.replay(settings, allowed, now)
    assert rebuilt.at(now).tokens == pytest.approx(live.at(now).tokens, abs=1e-6)


def test_over_the_limit_waits_and_is_then_allowed() -> None:
    settings = BucketSettings(burst=2, per_hour=60)  # one a minute after a burst of two
    bucket = Bucket.full(settings, 0.0)
    ok1, bucket = bucket.take(0.0)
    ok2, bucket = bucket.take(0.0)
    ok3, bucket = bucket.take(0.0)
    assert (ok1, ok2, ok3) == (True, True, False)
    assert bucket.wait_seconds(0.0) == pytest.approx(60.0)
    assert bucket.take(59.0)[0] is False
    assert bucket.take(60.0)[0] is True


def test_time_going_back_refills_nothing() -> None:
    settings = BucketSettings(burst=1, per_hour=1)
    _, bucket = Bucket.full(settings, 1000.0).take(1000.0)
    assert bucket.at(0.0).tokens == pytest.approx(0.0)
    assert bucket.take(500.0)[0] is False


def test_replay_counts_old_actions_as_refilled_and_recent_ones_as_taken() -> None:
    settings = BucketSettings(burst=3, per_hour=3600)
    assert Bucket.replay(settings, [0.0, 1.0, 2.0], now=10_000.0).tokens == pytest.approx(3.0)
    assert Bucket.replay(settings, [9_999.0] * 5, now=10_000.0).wait_seconds(10_000.0) > 0


@pytest.mark.parametrize(("burst", "per_hour"), [(0, 1.0), (1, 0.0), (1, -1.0), (1, math.nan), (1, math.inf)])
def test_settings_refuse_nonsense(burst: int, per_hour: float) -> None:
    with pytest.raises(ValueError):
        BucketSettings(burst, per_hour)
