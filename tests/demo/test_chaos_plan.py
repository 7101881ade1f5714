"""The chaos plan and the judging of a chaos run (`demo/chaos_plan.py`, pure).

Aspects: `--faults` names and groups (unknown names refused); a seed gives the same plan
and another seed a different one; every kind asked for is planned `per_kind` times inside
the timeline, API rules the apiserver accepts, restarts within bounds, webhook decisions
depending on the delivery's index only and at the asked rate; the API schedule opens and
closes overlapping windows; kills staged into the `demo:` section with the HA pair and
replicas they need; bad settings refused. From a journal: a second open record, a second
enforcement and a second eviction are duplicates (a re-enforcement after a lift is not);
a confirmed failure with no record is lost, except under a tripped breaker or for a flap;
records on devices no fault warrants, or before the warrant, and node-wide actions are
unwarranted (and a device the verdict named already is not counted twice); the time to
converge is measured from the last fault, and "not by the end" when still moving.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.chaos_plan import (
    KINDS,
    ApiWindow,
    ChaosError,
    ChaosPlan,
    ChaosSettings,
    DeliveryChaos,
    assess,
    converged_after,
    duplicate_actions,
    lost_quarantines,
    parse_kinds,
    plan,
    staged,
    timeline_span,
    unwarranted_actions,
)
from demo.journal import Device, Journal, Kind
from gpuhealth.fields import SettingsError
from simulator.apiserver.faults import rule_from_json
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import resolve

SCENARIO = resolve(Path(__file__).with_name("safety-scenario.yaml"))
FATAL = (48, 79)
TOLERANCE = 300.0
DP0 = gpu_uuid("gpu-dp-0", 0)
DP1 = gpu_uuid("gpu-dp-0", 1)
DRA1 = gpu_uuid("gpu-dra-0", 1)


def journal(ended_at: float = 1000.0) -> Journal:
    devices = {
        gpu_uuid(node, i): Device(gpu_uuid(node, i), node, i, group.path)
        for node, group in SCENARIO.nodes.items()
        for i in range(group.gpus_per_node)
    }
    return Journal("demo-safety", "", 20.0, devices, resolution_seconds=4.0, ended_at=ended_at)


# ---- planning ------------------------------------------------------------------------------------


def test_fault_names_and_groups() -> None:
    assert parse_kinds("api") == (
        "api-500",
        "api-503",
        "api-409",
        "api-429",
        "api-slow",
        "api-watch-drop",
        "api-410",
    )
    assert parse_kinds("clock-jump, kill-exporter,kills") == (
        "kill-exporter",
        "kill-responder-leader",
        "kill-responder-follower",
        "kill-alertmanager",
        "clock-jump",
    )
    assert parse_kinds("all") == KINDS
    with pytest.raises(ChaosError, match="unknown fault kind 'api-404'"):
        parse_kinds("api,api-404")
    with pytest.raises(ChaosError, match="no fault kinds"):
        parse_kinds(" , ")


def test_the_same_seed_gives_the_same_plan_and_every_kind_is_planned_inside_the_timeline() -> None:
    settings = ChaosSettings(per_kind=2)
    first = plan(SCENARIO, 7, KINDS, settings)
    assert first == plan(SCENARIO, 7, KINDS, settings)
    assert first != plan(SCENARIO, 8, KINDS, settings)
    span = timeline_span(SCENARIO)
    assert span == 500.0  # the 8-minute Unknown from 20 s
    assert sorted(w.kind for w in first.windows) == sorted(
        k for k in KINDS if k.startswith("api-") for _ in range(2)
    )
    assert sorted(k.process for k in first.kills) == sorted(
        ["exporter", "responder-leader", "responder-follower", "alertmanager"] * 2
    )
    assert len(first.steps) == 2
    for w in first.windows:
        assert 0 <= w.at <= span and w.until == w.at + settings.api_window_seconds
        rule = rule_from_json(w.rule)  # the apiserver accepts it
        assert rule.probability == settings.api_probability
    for k in first.kills:
        assert 0 <= k.at <= span and settings.restart_min_seconds <= k.restart <= settings.restart_max_seconds
    for s in first.steps:
        assert settings.clock_step_min_seconds <= s.seconds <= settings.clock_step_max_seconds
    assert first.last_at == max(
        [w.until for w in first.windows]
        + [k.at + k.restart for k in first.kills]
        + [s.at for s in first.steps]
    )
    assert first.deliveries is not None and first.deliveries.duplicate == first.deliveries.reorder == 0.3
    assert len(first.describe()) == len(first.windows) + len(first.kills) + len(first.steps) + 1


def test_only_the_kinds_asked_for_are_planned() -> None:
    only = plan(SCENARIO, 1, ("api-503", "webhook-duplicate"))
    assert [w.kind for w in only.windows] == ["api-503"] and not only.kills and not only.steps
    assert only.deliveries is not None and only.deliveries.reorder == 0.0
    with pytest.raises(ChaosError):
        plan(SCENARIO, 1, ("nothing",))


def test_delivery_decisions_depend_on_the_index_only_and_keep_their_rate() -> None:
    chaos = DeliveryChaos(seed=3, duplicate=0.3, reorder=0.3)
    forward = [chaos.decide(i) for i in range(3000)]
    backward = [chaos.decide(i) for i in reversed(range(3000))][::-1]
    assert forward == backward
    duplicated = sum(d.copies == 2 for d in forward)
    held = sum(d.hold for d in forward)
    assert 780 < duplicated < 1020 and 780 < held < 1020  # 900 expected, about 4.5 standard deviations
    assert all(d.copies == 1 and not d.hold for d in map(DeliveryChaos(seed=3).decide, range(100)))


def test_overlapping_windows_open_and_close_in_the_api_schedule() -> None:
    error = {"kind": "error", "code": 503, "probability": 0.5}
    throttle = {"kind": "throttle", "probability": 0.5}
    chaos = ChaosPlan(
        seed=1,
        kinds=("api-503", "api-429"),
        windows=(ApiWindow(10, 110, "api-503", error), ApiWindow(50, 150, "api-429", throttle)),
    )
    assert [(t, [r["kind"] for r in rules]) for t, rules in chaos.api_schedule()] == [
        (10, ["error"]),
        (50, ["error", "throttle"]),
        (110, ["throttle"]),
        (150, []),
    ]


def test_kills_are_staged_with_the_pair_and_replicas_they_need() -> None:
    chaos = plan(SCENARIO, 2, ("kill-alertmanager", "kill-responder-follower"))
    demo = staged(SCENARIO, chaos).demo
    assert demo["alertmanagers"] == 2 and demo["responders"] == 2
    assert sorted(k["process"] for k in demo["kills"]) == ["alertmanager", "responder-follower"]
    assert all(k["at"].endswith("s") and k["restart"].endswith("s") for k in demo["kills"])
    assert staged(SCENARIO, plan(SCENARIO, 2, ("api-500",))).demo == SCENARIO.demo


@pytest.mark.parametrize(
    ("field", "value"),
    [("per_kind", 0), ("api_probability", 1.5), ("restart_max_seconds", 1.0), ("hold_seconds", 0.0)],
)
def test_bad_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(SettingsError, match=f"ChaosSettings.{field}"):
        ChaosSettings(**{field: value})


# ---- judging ------------------------------------------------------------------------------------


def test_actions_done_twice_are_duplicates_and_a_lift_in_between_is_not() -> None:
    j = journal()
    j.record(20, Kind.PHASE, "Pending", "gpu-dp-0", DP0, record="q-1")
    j.record(21, Kind.PHASE, "Quarantined", "gpu-dp-0", DP0, record="q-1")
    j.record(22, Kind.ENFORCED, "quarantine", "gpu-dp-0", DP0, rule="r1")
    j.record(30, Kind.LIFTED, "quarantine", "gpu-dp-0", DP0)
    j.record(31, Kind.ENFORCED, "quarantine", "gpu-dp-0", DP0, rule="r1")
    assert duplicate_actions(j) == []
    j.record(40, Kind.ENFORCED, "quarantine", "gpu-dp-0", DP0, rule="r2")
    j.record(41, Kind.PHASE, "Pending", "gpu-dp-0", DP0, record="q-2")
    j.record(42, Kind.EVICTION, "inference/serve-1", "gpu-dp-0", DP0)
    j.record(43, Kind.EVICTION, "inference/serve-1", "gpu-dp-0", DP0)
    found = duplicate_actions(j)
    assert len(found) == 3
    assert (
        "again before it was lifted" in found[0] and "q-2" in found[1] and "evicted a second time" in found[2]
    )


def test_a_record_after_the_previous_one_was_released_is_not_a_duplicate() -> None:
    j = journal()
    j.record(20, Kind.PHASE, "Pending", "gpu-dp-0", DP0, record="q-1")
    j.record(200, Kind.PHASE, "Released", "gpu-dp-0", DP0, record="q-1")
    j.record(300, Kind.PHASE, "Pending", "gpu-dp-0", DP0, record="q-2")
    assert duplicate_actions(j) == []


def test_a_confirmed_failure_without_a_record_is_lost_unless_the_breaker_was_tripped() -> None:
    lost = lost_quarantines(journal(), SCENARIO, fatal_xids=FATAL, tolerance=TOLERANCE, unhealthy_for=60)
    assert lost == ["gpu-dp-0/gpu-0: quarantine warranted from t+10s, no record by the end"]
    tripped = journal()
    tripped.record(5, Kind.BREAKER, "tripped")
    assert lost_quarantines(tripped, SCENARIO, fatal_xids=FATAL, tolerance=TOLERANCE, unhealthy_for=60) == []
    reset_before = journal()
    reset_before.record(5, Kind.BREAKER, "tripped")
    reset_before.record(8, Kind.BREAKER, "reset")
    assert (
        len(lost_quarantines(reset_before, SCENARIO, fatal_xids=FATAL, tolerance=TOLERANCE, unhealthy_for=60))
        == 1
    )
    done = journal()
    done.record(25, Kind.PHASE, "Pending", "gpu-dp-0", DP0, record="q-1")
    assert lost_quarantines(done, SCENARIO, fatal_xids=FATAL, tolerance=TOLERANCE, unhealthy_for=60) == []


def test_records_without_a_warrant_and_node_wide_actions_are_unwarranted() -> None:
    j = journal()
    j.record(25, Kind.PHASE, "Pending", "gpu-dp-0", DP0, record="q-ok")  # fatal XID at 10 s
    j.record(26, Kind.PHASE, "Pending", "gpu-dp-0", DP1, record="q-app-xid")  # application XID: nothing
    j.record(100, Kind.PHASE, "Pending", "gpu-dra-0", DRA1, record="q-early")  # restrict only from 320 s
    j.record(101, Kind.NODE_ACTION, "cordon", "gpu-dra-1")
    found = unwarranted_actions(j, SCENARIO, [], fatal_xids=FATAL, tolerance=TOLERANCE)
    assert len(found) == 3
    assert "which no fault warrants" in found[0] and "before its warrant (t+320s)" in found[1]
    assert "node-wide cordon on gpu-dra-1" in found[2]
    named = [f"GPUDeviceFatalXid asked to quarantine gpu-dp-0/gpu-1 ({DP1}), but no fault on it"]
    again = unwarranted_actions(j, SCENARIO, named, fatal_xids=FATAL, tolerance=TOLERANCE)
    assert again[0] == named[0] and len(again) == 3  # the verdict's own line, not a second one for DP1


def test_time_to_converge_is_from_the_last_fault_to_the_last_change() -> None:
    j = journal(ended_at=1000)
    j.record(100, Kind.ALERT_FIRING, "GPUDeviceFatalXid", "gpu-dp-0", DP0)
    assert converged_after(j, 400) == 0.0
    j.record(450, Kind.PHASE, "Quarantined", "gpu-dp-0", DP0, record="q-1")
    j.record(460, Kind.NOTE, "chaos: something")  # not a change of state
    assert converged_after(j, 400) == 50.0
    j.record(996, Kind.ALERT_RESOLVED, "GPUDeviceFatalXid", "gpu-dp-0", DP0)
    assert converged_after(j, 400) is None


def test_an_assessment_fails_on_any_must_be_zero() -> None:
    chaos = plan(SCENARIO, 1, ("api-500",))
    j = journal()
    j.record(25, Kind.PHASE, "Pending", "gpu-dp-0", DP0, record="q-1")
    judged = dict(fatal_xids=FATAL, tolerance=TOLERANCE, unhealthy_for=60.0)
    clean = assess(
        j, SCENARIO, chaos, {"api-500": 3}, verdict_violations=[], expectation_failures=[], **judged
    )
    assert not clean.failed and clean.injected == {"api-500": 3}
    assert clean.last_fault_at == max(chaos.last_at, 500.0)
    failing = assess(
        j,
        SCENARIO,
        chaos,
        {},
        verdict_violations=[],
        expectation_failures=["migrations.succeeded: 0 != 1"],
        **judged,
    )
    assert failing.failed
