"""Properties of the replay engine over arbitrary timelines (responder.replay).

Aspects: a replay is deterministic (the same timeline and seed give the same records, holds,
moves and actions); no record ends Released while its device is still held, and one device's
holds never overlap; a restriction (Unknown) never moves work; a flaky card's verdicts depend on
the seed, not on the order of other checks.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backtest.inputs import replay_settings, rule_timings
from responder.records import Phase
from responder.replay.engine import replay
from responder.replay.timeline import CheckTruth, Fault, NodeLost, Signal, Timeline, UnknownSpell

T0 = 1_800_000_000.0
DAY = 86400.0
NODES = ("n0", "n1", "n2")
DEVICES = ("GPU-0", "GPU-1", "GPU-2")
RULES = rule_timings()
SHIPPED = replay_settings()

times = st.floats(min_value=0.0, max_value=2 * DAY, allow_nan=False).map(lambda s: T0 + round(s))
faults = st.builds(
    lambda at, node, device, kind, seconds: Fault(at, node, device, kind[0], at + seconds, kind[1]),
    times,
    st.sampled_from(NODES),
    st.sampled_from(DEVICES),
    st.sampled_from(
        [
            (Signal.FATAL_XID, "79"),
            (Signal.ECC_UNCORRECTABLE, ""),
            (Signal.ROW_REMAP_FAILURE, ""),
            (Signal.HEALTH_WATCH, "MEM"),
            (Signal.NONE, ""),
        ]
    ),
    st.floats(min_value=60.0, max_value=DAY),
)
spells = st.builds(
    UnknownSpell,
    times,
    st.sampled_from(NODES),
    st.lists(st.sampled_from(DEVICES), min_size=1, max_size=3, unique=True).map(tuple),
    st.floats(min_value=10.0, max_value=3600.0),
)
losses = st.builds(NodeLost, times, st.sampled_from(NODES), st.floats(min_value=10.0, max_value=DAY))
timelines = st.builds(
    lambda f, s, lost, flaky, seed: Timeline(
        start=T0,
        end=T0 + 3 * DAY,
        eligible=len(NODES) * len(DEVICES),
        checks=CheckTruth(120.0, 300.0, flaky_failure=0.5, flaky=frozenset(flaky)),
        faults=tuple(f),
        spells=tuple(s),
        lost=tuple(lost),
        seed=seed,
        devices=dict.fromkeys(NODES, DEVICES),
    ),
    st.lists(faults, max_size=6),
    st.lists(spells, max_size=6),
    st.lists(losses, max_size=2),
    st.sets(st.tuples(st.sampled_from(NODES), st.sampled_from(DEVICES)), max_size=3),
    st.integers(min_value=0, max_value=2**16),
)


@settings(max_examples=40, deadline=None)
@given(timelines)
def test_a_replay_is_deterministic(timeline: Timeline) -> None:
    first, second = replay(timeline, RULES, SHIPPED), replay(timeline, RULES, SHIPPED)
    assert first.records == second.records
    assert first.holds == second.holds
    assert first.moves == second.moves
    assert first.actions == second.actions


@settings(max_examples=40, deadline=None)
@given(timelines)
def test_no_record_is_both_released_and_held(timeline: Timeline) -> None:
    result = replay(timeline, RULES, SHIPPED)
    for key, record in result.records.items():
        if record.status.phase == Phase.RELEASED:
            assert key not in result.held_at_end
    by_device: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for hold in result.holds:
        by_device.setdefault((hold.node, hold.device), []).append((hold.start, hold.end))
    for spans in by_device.values():
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start


@settings(max_examples=40, deadline=None)
@given(st.lists(spells, min_size=1, max_size=8), st.integers(min_value=0, max_value=100))
def test_unknown_never_moves_work(spelled: list[UnknownSpell], seed: int) -> None:
    timeline = Timeline(
        start=T0,
        end=T0 + 3 * DAY,
        eligible=9,
        checks=CheckTruth(120.0, 300.0),
        spells=tuple(spelled),
        seed=seed,
    )
    result = replay(timeline, RULES, SHIPPED)
    assert result.moves == ()
    assert {r.spec.action for r in result.records.values()} <= {"restrict"}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_flaky_cards_verdicts_follow_the_seed(seed: int) -> None:
    def timeline(other_faults: int) -> Timeline:
        flaky = Fault(T0 + 3600.0, "n0", "GPU-0", Signal.FATAL_XID, T0 + 7200.0, "79")
        others = tuple(
            Fault(T0 + 1800.0 + i, "n1", f"GPU-{i}", Signal.FATAL_XID, T0 + 5400.0, "79")
            for i in range(other_faults)
        )
        return Timeline(
            start=T0,
            end=T0 + 2 * DAY,
            eligible=64,
            checks=CheckTruth(120.0, 300.0, flaky_failure=0.5, flaky=frozenset({("n0", "GPU-0")})),
            faults=(flaky, *others),
            seed=seed,
        )

    alone = replay(timeline(0), RULES, SHIPPED).records[("n0", "GPU-0")]
    crowded = replay(timeline(3), RULES, SHIPPED).records[("n0", "GPU-0")]
    assert alone.status.history == crowded.status.history
