"""The circuit breaker (responder.reconcile.breaker).

Aspects: automatic quarantines admitted one by one never exceed either trigger's limit
(property-tested over fleet sizes and settings); once tripped nothing automatic is admitted
until a reset; zero eligible devices disables it without error, an unknown number (the health
source away) leaves its floors as the limits; the documented defaults:
600 of 12,000 devices failing together pass, a tenth of the fleet trips it; the counts are
of unique devices within the window.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from responder.reconcile.breaker import (
    CAPACITY,
    RATE,
    BreakerSettings,
    BreakerState,
    Counts,
    admit,
    capacity_limit,
    count,
    rate_limit,
    reset,
)

settings_st = st.builds(
    BreakerSettings,
    window_seconds=st.floats(min_value=1, max_value=3600),
    rate_fraction=st.floats(min_value=0.001, max_value=1),
    rate_floor=st.integers(min_value=0, max_value=20),
    capacity_fraction=st.floats(min_value=0.001, max_value=1),
    capacity_floor=st.integers(min_value=0, max_value=20),
)


def storm(settings: BreakerSettings, eligible: int, failing: int) -> tuple[int, BreakerState]:
    """`failing` devices alerting at the same moment: how many were admitted, and the state."""
    state, admitted = BreakerState(), 0
    for _ in range(failing):
        ok, state = admit(state, Counts(eligible, admitted, admitted), now=0.0, settings=settings)
        admitted += ok
    return admitted, state


@given(settings_st, st.integers(min_value=0, max_value=5000), st.integers(min_value=0, max_value=400))
def test_admitted_quarantines_never_exceed_a_limit(
    settings: BreakerSettings, eligible: int, failing: int
) -> None:
    admitted, state = storm(settings, eligible, failing)
    if eligible == 0:
        assert admitted == failing and not state.tripped  # disabled, never crashed
        return
    assert admitted <= rate_limit(settings, eligible)
    assert admitted <= capacity_limit(settings, eligible)
    if admitted < failing:
        assert state.tripped and state.trigger in (RATE, CAPACITY) and state.detail


@given(settings_st, st.integers(min_value=1, max_value=5000))
def test_nothing_automatic_passes_a_tripped_breaker_until_a_reset(
    settings: BreakerSettings, eligible: int
) -> None:
    tripped = BreakerState(tripped=True, trigger=RATE, tripped_at=0.0, detail="x")
    assert admit(tripped, Counts(eligible, 0, 0), now=1.0, settings=settings) == (False, tripped)
    ok, _ = admit(reset(tripped), Counts(eligible, 0, 0), now=1.0, settings=settings)
    assert ok == (min(rate_limit(settings, eligible), capacity_limit(settings, eligible)) >= 1)


def test_defaults_let_600_of_12000_through_and_trip_on_a_tenth() -> None:
    defaults = BreakerSettings()
    assert storm(defaults, 12_000, 600) == (600, BreakerState())
    admitted, state = storm(defaults, 12_000, 1_200)
    assert admitted == 960 and state.trigger == RATE
    assert "961 quarantines within 600 s would exceed 960" in state.detail


def test_small_fleets_keep_the_floors() -> None:
    defaults = BreakerSettings()
    admitted, state = storm(defaults, 32, 10)  # the demo's 4 nodes x 8 GPUs
    assert admitted == 4 and state.trigger == CAPACITY


def test_counts_are_unique_devices_within_the_window() -> None:
    settings = BreakerSettings(window_seconds=60)
    starts = [("a", 100.0), ("a", 110.0), ("b", 30.0), ("c", 150.0), ("d", 200.0)]  # d: in the future
    counts = count(10, starts, ["a", "a", "c"], now=150.0, settings=settings)
    assert counts == Counts(eligible=10, started_in_window=2, quarantined=2)


@pytest.mark.parametrize(
    "bad",
    [
        {"window_seconds": 0},
        {"rate_fraction": 0},
        {"capacity_fraction": 1.5},
        {"rate_floor": -1},
        {"capacity_floor": True},
    ],
)
def test_settings_refuse_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BreakerSettings(**bad)  # type: ignore[arg-type]


def test_an_unknown_fleet_size_leaves_the_floors_as_the_limits() -> None:
    settings = BreakerSettings(rate_floor=5, capacity_floor=4)
    unknown = count(None, [], ["a", "b", "c"], now=0.0, settings=settings)
    assert unknown.eligible is None
    assert admit(BreakerState(), unknown, now=0.0, settings=settings)[0]
    full = replace(unknown, quarantined=4)
    admitted, state = admit(BreakerState(), full, now=0.0, settings=settings)
    assert not admitted and state.trigger == "capacity" and "unknown number of devices" in state.detail
    # Zero devices known is a fleet without GPUs reported: the breaker stays out of the way.
    assert admit(BreakerState(), replace(full, eligible=0), now=0.0, settings=settings)[0]
