"""The chaos plan and the judging of a chaos run (`demo/chaos_plan.py`, pure).

Aspects: `--faults` names and groups (unknown names refused); `all` is the kinds of the run's
control plane, and a kind the other control plane owns (API faults and clock steps: the
simulated one; component restarts and etcd compactions: the real one) is refused when parsed and
when planned, naming the plane that has it; a seed gives the same plan and another seed a
different one, control-plane faults included (each at a seeded time, the compaction restarting
kube-apiserver after it); every kind asked for is planned `per_kind` times inside
the timeline and over before its quiet end (anywhere in a timeline too short for one),
API rules the apiserver accepts, restarts within bounds, webhook decisions
depending on the delivery's index only and at the asked rate; the API schedule opens and
closes overlapping windows; kills staged into the `demo:` section with the HA pair and
replicas they need; a killed exporter, or an outage of the apiserver (its restart, etcd's), lifts
only the promise that nodes stay reachable; bad settings refused. Judging: each line of the
safety verdict goes to its column (duplicate, lost, unwarranted); any line or a failed
expectation fails the run; the time to converge is measured from the last fault to the last
change of state in the journal, and reads "not by the end" when it changed within the rest window of the end.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from demo.chaos_plan import (
    CONTROL_PLANE_KINDS,
    DUPLICATE,
    KILL_KINDS,
    KINDS,
    LOST,
    PLANE_KINDS,
    REAL,
    SIMULATED,
    UNWARRANTED,
    ApiWindow,
    Assessment,
    ChaosError,
    ChaosPlan,
    ChaosSettings,
    Delivery,
    DeliveryChaos,
    PlaneFault,
    assess,
    classify,
    converged_after,
    convergence,
    next_timeline_moment,
    parse_kinds,
    plan,
    staged,
    timeline_span,
)
from demo.journal import Device, Journal, Kind
from demo.pipeline import CONTROL_PLANES
from gpuhealth.fields import SettingsError
from simulator.apiserver.faults import rule_from_json
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import resolve

SCENARIO = resolve(Path(__file__).with_name("safety-scenario.yaml"))
SIMULATED_KINDS = PLANE_KINDS[SIMULATED]
DP0 = gpu_uuid("gpu-dp-0", 0)


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
    assert parse_kinds("all") == SIMULATED_KINDS
    with pytest.raises(ChaosError, match="unknown fault kind 'api-404'"):
        parse_kinds("api,api-404")
    with pytest.raises(ChaosError, match="no fault kinds"):
        parse_kinds(" , ")


def test_the_same_seed_gives_the_same_plan_and_every_kind_is_planned_inside_the_timeline() -> None:
    settings = ChaosSettings(per_kind=2)
    first = plan(SCENARIO, 7, SIMULATED_KINDS, settings)
    assert first == plan(SCENARIO, 7, SIMULATED_KINDS, settings)
    assert first != plan(SCENARIO, 8, SIMULATED_KINDS, settings)
    span = timeline_span(SCENARIO)
    assert span == 500.0  # the 8-minute Unknown from 20 s
    assert sorted(w.kind for w in first.windows) == sorted(
        k for k in KINDS if k.startswith("api-") for _ in range(2)
    )
    assert sorted(k.process for k in first.kills) == sorted(
        ["exporter", "responder-leader", "responder-follower", "alertmanager"] * 2
    )
    assert len(first.steps) == 2
    quiet_from = span - settings.quiet_seconds  # every injection is over by then
    for w in first.windows:
        assert w.at >= 0 and w.until == w.at + settings.api_window_seconds <= quiet_from
        rule = rule_from_json(w.rule)  # the apiserver accepts it
        assert rule.probability == settings.api_probability
    for k in first.kills:
        assert k.at >= 0 and k.at + k.restart <= quiet_from
        assert settings.restart_min_seconds <= k.restart <= settings.restart_max_seconds
    for s in first.steps:
        assert 0 <= s.at <= quiet_from
        assert settings.clock_step_min_seconds <= s.seconds <= settings.clock_step_max_seconds
    assert first.last_at == max(
        [w.until for w in first.windows]
        + [k.at + k.restart for k in first.kills]
        + [s.at for s in first.steps]
    )
    assert first.deliveries is not None and first.deliveries.duplicate == first.deliveries.reorder == 0.3
    assert len(first.describe()) == len(first.windows) + len(first.kills) + len(first.steps) + 1


def test_all_is_the_kinds_of_the_run_s_control_plane() -> None:
    assert set(PLANE_KINDS) == set(CONTROL_PLANES)  # one entry per plane `--control-plane` offers
    assert set(KINDS) == {k for kinds in PLANE_KINDS.values() for k in kinds}  # none unreachable
    assert parse_kinds("all", REAL) == (
        *KILL_KINDS,
        "webhook-duplicate",
        "webhook-reorder",
        *CONTROL_PLANE_KINDS,
    )
    assert parse_kinds("control-plane", REAL) == (
        "restart-apiserver",
        "restart-etcd",
        "etcd-compaction",
        "restart-scheduler",
        "restart-controller-manager",
    )
    # Kills and webhook faults are the pipeline's own: both planes take them.
    assert parse_kinds("kills,webhook", REAL) == parse_kinds("kills,webhook", SIMULATED)


@pytest.mark.parametrize(
    ("text", "control_plane", "refused", "other"),
    [
        ("api-503", REAL, "api-503", SIMULATED),
        ("kills,clock", REAL, "clock-jump", SIMULATED),
        ("restart-etcd", SIMULATED, "restart-etcd", REAL),
        ("webhook,control-plane", SIMULATED, "restart-apiserver, restart-etcd, etcd-compaction", REAL),
    ],
)
def test_a_kind_of_the_other_control_plane_is_refused_when_parsed_and_when_planned(
    text: str, control_plane: str, refused: str, other: str
) -> None:
    message = (
        f"{refused}.* cannot be injected on the {control_plane} control plane \\(only on the {other} one\\)"
    )
    with pytest.raises(ChaosError, match=message):
        parse_kinds(text, control_plane)
    kinds = [k for k in KINDS if k in refused.split(", ")]
    with pytest.raises(ChaosError, match=message):
        plan(SCENARIO, 1, kinds, control_plane=control_plane)
    with pytest.raises(ChaosError, match="unknown control plane 'kind'"):
        parse_kinds(text, "kind")


def test_control_plane_faults_are_planned_from_the_seed_inside_the_timeline() -> None:
    settings = ChaosSettings(per_kind=2)
    kinds = PLANE_KINDS[REAL]
    first = plan(SCENARIO, 7, kinds, settings, control_plane=REAL)
    assert first == plan(SCENARIO, 7, kinds, settings, control_plane=REAL)
    assert first.plane_faults != plan(SCENARIO, 8, kinds, settings, control_plane=REAL).plane_faults
    assert first.control_plane == REAL and not first.windows and not first.steps
    assert sorted(f.kind for f in first.plane_faults) == sorted([*CONTROL_PLANE_KINDS] * 2)
    quiet_from = timeline_span(SCENARIO) - settings.quiet_seconds
    assert all(0 <= f.at <= quiet_from for f in first.plane_faults)
    assert [f.at for f in first.plane_faults] == sorted(f.at for f in first.plane_faults)
    assert first.last_at == max([f.at for f in first.plane_faults] + [k.at + k.restart for k in first.kills])
    lines = first.describe()
    assert len(lines) == len(first.plane_faults) + len(first.kills) + 1
    assert sum("compact etcd, then restart kube-apiserver" in line for line in lines) == 2
    assert sum(line.endswith("restart etcd") for line in lines) == 2
    assert plan(SCENARIO, 7, SIMULATED_KINDS, settings).plane_faults == ()


@pytest.mark.parametrize(
    ("kind", "component"),
    [
        ("restart-apiserver", "kube-apiserver"),
        ("restart-etcd", "etcd"),
        ("restart-scheduler", "kube-scheduler"),
        ("restart-controller-manager", "kube-controller-manager"),
        ("etcd-compaction", "kube-apiserver"),  # restarted after the compaction: its cache starts anew
    ],
)
def test_each_control_plane_fault_restarts_its_component(kind: str, component: str) -> None:
    assert PlaneFault(10.0, kind).component == component


def test_a_timeline_too_short_for_a_quiet_end_takes_faults_anywhere_in_it() -> None:
    short = plan(SCENARIO, 5, ("api-503",) * 1, ChaosSettings(per_kind=20, quiet_seconds=490))
    starts = [w.at for w in short.windows]
    assert max(starts) > 10 and all(0 <= at <= 500 for at in starts)


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
    late = sum(d.late for d in forward)
    assert 780 < duplicated < 1020 and 780 < late < 1020  # 900 expected, about 4.5 standard deviations
    assert all(d.copies == 1 and not d.late for d in map(DeliveryChaos(seed=3).decide, range(100)))


def test_the_first_deliveries_carry_each_planned_webhook_fault() -> None:
    # Whatever the draws, a run with per_kind + 1 notifications injects both kinds per_kind
    # times: a duplicate from the first, a late one from the second (it needs one before it).
    for seed in range(50):
        both = DeliveryChaos(seed, duplicate=1e-9, reorder=1e-9, at_least=2)
        assert list(map(both.decide, range(4))) == [
            Delivery(2, False),
            Delivery(2, True),
            Delivery(1, True),
            Delivery(1, False),
        ]
        assert DeliveryChaos(seed, reorder=1e-9, at_least=2).decide(0) == Delivery(1, False)
    planned = plan(SCENARIO, 1, ("webhook-reorder",), ChaosSettings(per_kind=2)).deliveries
    assert planned == DeliveryChaos(1, reorder=0.3, at_least=2)


def test_shortfalls_name_each_planned_kind_not_injected_as_planned() -> None:
    kinds = (
        "api-503",
        "api-410",
        "kill-responder-leader",
        "webhook-duplicate",
        "webhook-reorder",
        "clock-jump",
    )
    chaos = plan(SCENARIO, 1, kinds)
    done = {
        "api-503": 7,
        "api-410": 1,
        "kill-responder-leader": 1,
        "webhook-duplicate": 2,
        "webhook-reorder": 1,
        "clock-jump": 1,
    }
    assert chaos.shortfalls(done) == []
    assert chaos.shortfalls({**done, "api-410": 0, "kill-responder-leader": 2, "webhook-reorder": 0}) == [
        "kill-responder-leader: planned 1, injected 2",
        "api-410: planned at least 1, injected 0",
        "webhook-reorder: planned at least 1, injected 0",
    ]
    assert plan(SCENARIO, 1, ("api-503",)).shortfalls({}) == ["api-503: planned at least 1, injected 0"]


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
    [
        ("per_kind", 0),
        ("api_probability", 1.5),
        ("restart_max_seconds", 1.0),
        ("webhook_probability", 1.5),
        ("rest_seconds", 400.0),
    ],
)
def test_bad_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(SettingsError, match=f"ChaosSettings.{field}"):
        ChaosSettings(**{field: value})


# ---- judging ------------------------------------------------------------------------------------


# Lines as `demo.safety.judge` words them, one per invariant.
VERDICT_LINES = {
    "t+40s a second record q-2 for gpu-dp-0/gpu-0 while q-1 is active": DUPLICATE,
    "t+41s a second DeviceTaintRule r2 for gpu-dp-0/gpu-0 while r1 exists": DUPLICATE,
    "t+43s pod inference/serve-1 evicted a second time": DUPLICATE,
    "t+50s the migration of research/train off gpu-dp-0/gpu-0 finished twice": DUPLICATE,
    "gpu-dp-0/gpu-0: quarantine warranted from t+10s, but no record by t+130s": LOST,
    "t+26s record q-x would quarantine gpu-dp-0/gpu-1, but no fault warrants it": UNWARRANTED,
    "t+26s GPUDeviceFatalXid asked the responder to quarantine gpu-dp-0/gpu-1, but no fault": UNWARRANTED,
    "t+101s a node-wide cordon (node.kubernetes.io/x) on gpu-dra-1": UNWARRANTED,
    "t+200s gpu-dp-0/gpu-0 released without a passed probe and canary": UNWARRANTED,
    "t+90s pod inference/serve-2 on gpu-dra-0/gpu-1 evicted for an Unknown": UNWARRANTED,
    "t+370s GPUDeviceXid fired for gpu-dp-0/gpu-0 and reached the responder, but the device was not "
    "enforced by t+430s with the breaker closed": LOST,
    "t+180s pod ns/late-0 still on quarantined gpu-dp-0/gpu-0 (60s after t+120s; no move started) and "
    "its move not unrecoverable": LOST,
    "t+120s pod ns/serve-2 started on quarantined gpu-dp-0/gpu-0 (record rec-q, quarantined since t+81s)": (
        LOST
    ),
    "t+360s gpu-dp-0/gpu-0 released while its driver reported it Unhealthy": UNWARRANTED,
    "t+212s the probe of gpu-dp-0/gpu-0 (passed) ran on gpu-dp-0/gpu-1": UNWARRANTED,
    "t+360s gpu-dp-0/gpu-0 released at person/ana's request without a passed canary in attempt 1": (
        UNWARRANTED
    ),
    "t+220s gpu-dp-0/gpu-0 stepped Probing -> Canary while the responders' health source was down": (
        UNWARRANTED
    ),
}


@pytest.mark.parametrize(("line", "column"), sorted(VERDICT_LINES.items()))
def test_verdict_lines_go_to_their_column(line: str, column: str) -> None:
    assert classify(line) == column


def test_time_to_converge_is_from_the_last_fault_to_the_last_change_and_needs_a_rest() -> None:
    j = journal(ended_at=1000)
    j.record(100, Kind.ALERT_FIRING, "GPUDeviceFatalXid", "gpu-dp-0", DP0)
    assert converged_after(j, 400, 60) == 0.0
    j.record(450, Kind.PHASE, "Quarantined", "gpu-dp-0", DP0, record="q-1")
    j.record(460, Kind.NOTE, "chaos: something")  # not a change of state
    assert converged_after(j, 400, 60) == 50.0
    j.record(950, Kind.PHASE, "Probing", "gpu-dp-0", DP0, record="q-1")
    assert converged_after(j, 400, 40) == 550.0
    assert converged_after(j, 400, 60) is None  # changed 50 s before the end: not at rest
    j.record(998, Kind.ALERT_RESOLVED, "GPUDeviceFatalXid", "gpu-dp-0", DP0)
    assert converged_after(j, 400, 0) is None  # within two observations of the end, whatever the rest
    # What follows the scenario's own next fault is its doing: the rest is judged before it.
    assert converged_after(j, 400, 60, horizon=900) == 50.0
    assert converged_after(j, 400, 60, horizon=500) is None
    assert converged_after(j, 400, 60, horizon=430) is None  # 30 s is too little to tell


def test_the_convergence_cell_says_why_there_is_no_figure() -> None:
    base = Assessment(injected={}, duplicates=(), lost=(), unwarranted=(), last_fault_at=400, rest_seconds=60)
    assert convergence(dataclasses.replace(base, converged_after=251.3, observed_until=900)) == "251s"
    assert convergence(dataclasses.replace(base, converged_after=None, observed_until=900)) == (
        "not at rest by t+900s"
    )
    assert convergence(dataclasses.replace(base, converged_after=None, observed_until=430)) == (
        "n/a: the scenario's own fault at t+430s follows at once"
    )


def test_the_next_moment_of_the_scenario_is_a_start_or_an_end_of_its_own_faults() -> None:
    # Faults at 10, 15, 20 (60 s and 8 min long) and 30 (5 min long): moments 10 ... 500.
    assert next_timeline_moment(SCENARIO, 0) == 10
    assert next_timeline_moment(SCENARIO, 25) == 30
    assert next_timeline_moment(SCENARIO, 30) == 80
    assert next_timeline_moment(SCENARIO, 330) == 500
    assert next_timeline_moment(SCENARIO, 500) == float("inf")


def test_an_assessment_sorts_the_verdict_and_fails_on_any_must_be_zero() -> None:
    chaos = plan(SCENARIO, 1, ("api-500",))
    j = journal()
    j.record(25, Kind.PHASE, "Pending", "gpu-dp-0", DP0, record="q-1")
    at = {"last_fault_at": 500.0, "rest_seconds": 60.0}
    clean = assess(j, SCENARIO, chaos, {"api-500": 3}, verdict_violations=[], expectation_failures=[], **at)
    assert not clean.failed and clean.injected == {"api-500": 3}
    assert clean.last_fault_at == 500.0 and clean.converged_after == 0.0  # nothing after the fault
    judged = assess(
        j, SCENARIO, chaos, {}, verdict_violations=list(VERDICT_LINES), expectation_failures=[], **at
    )
    assert judged.failed
    assert (len(judged.duplicates), len(judged.lost), len(judged.unwarranted)) == (4, 4, 9)
    expected = assess(
        j, SCENARIO, chaos, {}, verdict_violations=[], expectation_failures=["migrations: 0 of 1"], **at
    )
    assert expected.failed and expected.expectation_failures == ("migrations: 0 of 1",)


def test_a_killed_exporter_or_a_down_apiserver_lifts_only_the_promise_that_nodes_stay_reachable() -> None:
    expect = {
        "alerts": {
            "notFired": [
                "GPUNodeUnreachable",
                {"name": "GPUHealthExporterDown"},
                {"name": "GPUDeviceFatalXid", "node": "gpu-dp-0", "gpu": 0},
            ],
            "fired": ["GPUDeviceUnhealthy"],
        },
        "breaker": "closed",
    }
    scenario = dataclasses.replace(SCENARIO, expect=expect)
    killed = staged(scenario, plan(scenario, 2, ("kill-exporter",))).expect
    assert killed["alerts"]["notFired"] == [{"name": "GPUDeviceFatalXid", "node": "gpu-dp-0", "gpu": 0}]
    assert killed["alerts"]["fired"] == ["GPUDeviceUnhealthy"] and killed["breaker"] == "closed"
    # Any other fault keeps every promise.
    assert staged(scenario, plan(scenario, 2, ("kill-responder-leader", "api-500"))).expect == expect
    # With the apiserver down no node agent renews its Lease; the scheduler's or the
    # controller-manager's restart leaves the apiserver up.
    for outage in ("restart-apiserver", "restart-etcd", "etcd-compaction"):
        down = staged(scenario, plan(scenario, 2, (outage,), control_plane=REAL)).expect
        assert down["alerts"]["notFired"] == [
            {"name": "GPUHealthExporterDown"},
            {"name": "GPUDeviceFatalXid", "node": "gpu-dp-0", "gpu": 0},
        ], outage
    up = ("restart-scheduler", "restart-controller-manager", "kill-responder-leader")
    assert staged(scenario, plan(scenario, 2, up, control_plane=REAL)).expect == expect
