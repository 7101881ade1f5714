"""The replay engine over the real decision code (responder.replay).

Aspects: a fatal XID, an ECC error and a row-remap failure each become a quarantine with the
reason the intake gives it, enforced within a rule evaluation, with the work moved once; an
Unknown spell shorter than its tolerance window records nothing, a longer one restricts the device
and moves nothing; a lost node's stale reports are inhibited; a health watch the shipped rules
leave out is not seen; a storm on a small fleet trips the breaker and defers the rest; a recovered
card walks every rung of the ladder in order and is released, while a card still broken fails its
probe and stays held; a responder configuration changes the decisions (a shorter stability window
releases sooner).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backtest.inputs import replay_settings, rule_timings
from gpuhealth.kube.meta import parse_rfc3339
from responder.records import RELEASE_PHASES, MigrationOutcome, Phase
from responder.replay.alerting import RuleTimings
from responder.replay.engine import ReplaySettings, replay
from responder.replay.outcomes import Replay
from responder.replay.timeline import CheckTruth, Fault, NodeLost, Signal, Timeline, UnknownSpell

T0 = 1_800_000_000.0
HOUR = 3600.0
DAY = 86400.0
CHECKS = CheckTruth(probe_seconds=120.0, canary_seconds=300.0)


@pytest.fixture(scope="module")
def rules() -> RuleTimings:
    return rule_timings()


@pytest.fixture(scope="module")
def shipped() -> ReplaySettings:
    return replay_settings()


def run(
    rules: RuleTimings, settings: ReplaySettings, *, days: float = 3.0, eligible: int = 64, **events: object
) -> Replay:
    timeline = Timeline(start=T0, end=T0 + days * DAY, eligible=eligible, checks=CHECKS, **events)  # type: ignore[arg-type]
    return replay(timeline, rules, settings)


@pytest.mark.parametrize(
    ("signal", "detail", "reason"),
    [
        (Signal.FATAL_XID, "79", "FatalXid"),
        (Signal.ECC_UNCORRECTABLE, "", "EccUncorrectable"),
        (Signal.ROW_REMAP_FAILURE, "", "RowRemapFailure"),
        (Signal.HEALTH_WATCH, "MEM", "HealthWatchFailed"),
    ],
)
def test_a_fault_becomes_a_quarantine_with_its_reason(
    rules: RuleTimings, shipped: ReplaySettings, signal: Signal, detail: str, reason: str
) -> None:
    fault = Fault(T0 + HOUR + 7.0, "n1", "GPU-a", signal, T0 + 2 * DAY, detail)
    result = run(rules, shipped, faults=(fault,))
    record = result.records[("n1", "GPU-a")]
    assert record.spec.reason == reason
    assert record.spec.action == "quarantine"
    first = result.holds[0]
    assert fault.at <= first.start <= fault.at + rules.evaluation_interval + rules.health_failed_for
    assert [m.reason for m in result.moves] == [reason]


def test_an_unknown_spell_shorter_than_the_tolerance_records_nothing(
    rules: RuleTimings, shipped: ReplaySettings
) -> None:
    short = rules.unknown_window(0) - rules.evaluation_interval
    spell = UnknownSpell(T0 + HOUR, "n1", ("GPU-a", "GPU-b"), short)
    result = run(rules, shipped, spells=(spell,))
    assert result.records == {}
    assert result.holds == ()


def test_an_unknown_spell_past_the_tolerance_restricts_and_moves_nothing(
    rules: RuleTimings, shipped: ReplaySettings
) -> None:
    spell = UnknownSpell(T0 + HOUR, "n1", ("GPU-a", "GPU-b"), rules.unknown_window(0) + 10 * 60.0)
    result = run(rules, shipped, spells=(spell,))
    assert {r.spec.action for r in result.records.values()} == {"restrict"}
    assert {r.spec.reason for r in result.records.values()} == {"Unknown"}
    assert len(result.holds) == 2
    assert result.moves == ()
    assert all(r.status.phase == Phase.RELEASED for r in result.records.values())


def test_a_lost_node_is_left_to_node_failure_detection(rules: RuleTimings, shipped: ReplaySettings) -> None:
    lost = NodeLost(T0 + HOUR, "n1", 6 * HOUR)
    timeline = Timeline(
        start=T0, end=T0 + DAY, eligible=8, checks=CHECKS, lost=(lost,), devices={"n1": ("GPU-a", "GPU-b")}
    )
    result = replay(timeline, rules, shipped)
    assert result.records == {}


def test_a_health_watch_the_rules_leave_out_is_not_seen(rules: RuleTimings, shipped: ReplaySettings) -> None:
    assert "THERMAL" not in rules.health_watches
    fault = Fault(T0 + HOUR, "n1", "GPU-a", Signal.HEALTH_WATCH, T0 + DAY, "THERMAL")
    assert run(rules, shipped, faults=(fault,)).records == {}


def test_a_storm_trips_the_breaker_and_defers_the_rest(rules: RuleTimings, shipped: ReplaySettings) -> None:
    faults = tuple(
        Fault(T0 + HOUR + i, f"n{i // 8}", f"GPU-{i}", Signal.FATAL_XID, T0 + 2 * DAY, "79")
        for i in range(30)
    )
    result = run(rules, shipped, faults=faults, eligible=100)
    assert result.breaker_trips == 1
    phases = result.phases()
    enforced = len(result.holds)
    limit = max(int(shipped.policy.breaker.rate_fraction * 100), shipped.policy.breaker.rate_floor)
    assert enforced == limit
    assert phases[Phase.DEFERRED] == 30 - limit
    deferred = next(r for r in result.records.values() if r.status.phase == Phase.DEFERRED)
    assert deferred.status.phase_reason == "BreakerOpen"
    assert any("circuit breaker open" in h.message for h in deferred.status.history)


def test_a_recovered_card_walks_the_ladder_and_is_released(
    rules: RuleTimings, shipped: ReplaySettings
) -> None:
    repaired = T0 + DAY
    fault = Fault(T0 + HOUR, "n1", "GPU-a", Signal.FATAL_XID, repaired, "48")
    result = run(rules, shipped, faults=(fault,))
    record = result.records[("n1", "GPU-a")]
    walked = [h.phase for h in record.status.history]
    climb = walked[walked.index(RELEASE_PHASES[0]) :]
    assert tuple(dict.fromkeys(climb)) == RELEASE_PHASES
    (hold,) = result.holds
    assert hold.end >= repaired + shipped.policy.stability_seconds + shipped.policy.ramp_seconds
    assert ("n1", "GPU-a") not in result.held_at_end


def test_a_card_still_broken_fails_its_probe_and_stays_held(
    rules: RuleTimings, shipped: ReplaySettings
) -> None:
    # The ECC alert resolves after its event window; the card reads Healthy (the device plugin
    # does not report ECC) but is still broken: the probe finds it.
    fault = Fault(T0 + HOUR, "n1", "GPU-a", Signal.ECC_UNCORRECTABLE, T0 + 10 * DAY)
    result = run(rules, shipped, faults=(fault,), days=2.0)
    record = result.records[("n1", "GPU-a")]
    assert record.status.failures >= 2
    assert record.status.last_check is not None and record.status.last_check.failed
    assert record.status.phase != Phase.RELEASED
    assert result.held_at_end == frozenset({("n1", "GPU-a")})


def test_a_responder_configuration_changes_the_decisions(rules: RuleTimings, tmp_path: Path) -> None:
    config = tmp_path / "responder-config.yaml"
    config.write_text("policy:\n  stability: 10m\n  ramp: 10m\n")
    fault = Fault(T0 + HOUR, "n1", "GPU-a", Signal.FATAL_XID, T0 + DAY, "79")
    shipped = run(rules, replay_settings(), faults=(fault,))
    tuned = run(rules, replay_settings(config), faults=(fault,))
    saved = shipped.holds[0].end - tuned.holds[0].end
    assert saved == pytest.approx((1800.0 - 600.0) + (3600.0 - 600.0))


def test_an_expiry_while_still_failing_extends_with_the_doubled_backoff(
    rules: RuleTimings, shipped: ReplaySettings
) -> None:
    repaired = T0 + HOUR + 2 * DAY
    fault = Fault(T0 + HOUR, "n1", "GPU-a", Signal.FATAL_XID, repaired, "79")
    record = run(rules, shipped, faults=(fault,), days=4.0).records[("n1", "GPU-a")]
    extensions = [h for h in record.status.history if h.message.startswith("expired while still failing")]
    assert len(extensions) >= 3
    probing = next(h for h in record.status.history if h.phase == "Probing")
    started = parse_rfc3339(probing.time)
    assert started is not None and started > repaired + shipped.policy.backoff_seconds
    assert record.status.phase == Phase.RELEASED


def test_a_move_in_flight_holds_the_release_attempt_back(rules: RuleTimings, shipped: ReplaySettings) -> None:
    # The ECC alert resolves after its event window and the card works again at once, while the
    # move of its work takes two hours: the attempt starts only when the move has an outcome.
    fault = Fault(T0 + HOUR, "n1", "GPU-a", Signal.ECC_UNCORRECTABLE, T0 + HOUR + 60.0)
    timeline = Timeline(
        start=T0, end=T0 + DAY, eligible=64, checks=CHECKS, faults=(fault,), move_seconds=2 * HOUR
    )
    record = replay(timeline, rules, shipped).records[("n1", "GPU-a")]
    (move,) = record.status.migrations
    assert move.outcome == MigrationOutcome.SUCCEEDED
    assert any(h.message.endswith("to end") and "move of" in h.message for h in record.status.history)
    probing = next(h for h in record.status.history if h.phase == "Probing")
    started = parse_rfc3339(probing.time)
    assert started is not None and started >= fault.at + 2 * HOUR


def test_repeated_short_unknown_spells_restrict_as_flapping(
    rules: RuleTimings, shipped: ReplaySettings
) -> None:
    short = rules.unknown_window(rules.flapping_episodes) - 2 * rules.evaluation_interval
    gap = rules.flapping_window / (rules.flapping_episodes + 1)
    spells = tuple(
        UnknownSpell(T0 + HOUR + i * gap, "n1", ("GPU-a",), short) for i in range(rules.flapping_episodes)
    )
    record = run(rules, shipped, spells=spells).records[("n1", "GPU-a")]
    assert record.spec.action == "restrict"
    assert [s.alertname for s in record.spec.source_alerts] == ["GPUDeviceUnknownFlapping"]


def test_an_earlier_episode_shortens_the_next_tolerance_window(
    rules: RuleTimings, shipped: ReplaySettings
) -> None:
    # Longer than the window of a repeat, shorter than the first window: restricted only as a repeat.
    seconds = (rules.unknown_window(0) + rules.unknown_window(1)) / 2
    first = UnknownSpell(T0 + HOUR, "n1", ("GPU-a",), seconds)
    assert run(rules, shipped, spells=(first,)).records == {}
    second = UnknownSpell(T0 + HOUR + rules.unknown_repeat_window / 2, "n1", ("GPU-a",), seconds)
    record = run(rules, shipped, spells=(first, second)).records[("n1", "GPU-a")]
    assert [s.alertname for s in record.spec.source_alerts] == ["GPUDeviceUnknownExpired"]
