"""Idle GPU time as time and the verdict of ended quarantines, counted by the reconciler.

Aspects: which records count as excluded capacity and under which phase (Ramp and DeviceInUse
their own; Pending, Deferred, a dry run and a record with nothing enforced never); the leader adds
the time between its passes to the phase each record was listed in, on the injected clock; a new
leader and a leader whose term ended start a new account; every series is born at 0 before it
grows (so increase() sees its first step); a quarantine that ends is counted once by its verdict,
a dismissed one not at all.
"""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry

from responder.ladder import LADDER, Kind
from responder.reconcile.accounting import QuarantineAccounting
from responder.reconcile.measures import DEVICE_IN_USE, ExclusionMeter, excluded_phase, measured_phases
from responder.reconcile.policy import CheckResult, Health
from responder.reconcile.reconciler import ReconcilerSettings
from responder.records import Phase, Quarantine
from tests.responder.test_reconciler import NOW, POLICY, SETTINGS, Harness
from tests.responder.test_verdicts import record as make_record

SECONDS = "gpuhealth_quarantined_device_seconds_total"
ENDED = "gpuhealth_quarantines_ended_total"


def excluded(h: Harness, phase: str, reason: str = "Unhealthy") -> float | None:
    return h.sample(SECONDS, node="gpu-node-1", reason=reason, phase=phase)


def with_status(record: Quarantine, phase: str, *, enforced: str = "Node/n1", why: str = "") -> Quarantine:
    status = replace(record.status, phase=phase, enforced=enforced, phase_reason=why)
    return replace(record, status=status)


def test_only_enforced_quarantines_exclude_capacity_and_ramp_and_device_in_use_are_their_own() -> None:
    base = make_record(())
    assert excluded_phase(with_status(base, Phase.QUARANTINED)) == "Quarantined"
    assert excluded_phase(with_status(base, Phase.QUARANTINED, why=DEVICE_IN_USE)) == "DeviceInUse"
    assert excluded_phase(with_status(base, Phase.QUARANTINED, why="BackingOff")) == "Quarantined"
    for rung in LADDER.phases:
        assert excluded_phase(with_status(base, rung)) == rung
    for phase in (Phase.PENDING, Phase.DEFERRED, Phase.RELEASED, Phase.ABANDONED):
        assert excluded_phase(with_status(base, phase)) is None
    assert excluded_phase(with_status(base, Phase.QUARANTINED, enforced="")) is None
    assert excluded_phase(with_status(base, Phase.QUARANTINED), dry_run=True) is None
    assert measured_phases() == ("Quarantined", "DeviceInUse", *LADDER.phases)


def climb(h: Harness, name: str, check_seconds: float | None = None) -> dict[str, float]:
    """Walk the record in `name` up every rung of the ladder from its first, each check passing
    after `check_seconds` (None: a different time for each, 7 s, 11 s, ...), each window and the
    ramp lasting its length; returns the seconds spent on each rung."""
    spent = {}
    for i, rung in enumerate(POLICY.rungs.rungs):  # the ladder with the settings' lengths
        assert h.phase(name) == rung.phase
        if rung.kind == Kind.CHECK:
            h.checks.complete(h.client.record(name), rung.name, CheckResult.SUCCEEDED)
            seconds = 7.0 + 4 * i if check_seconds is None else check_seconds
        else:
            seconds = rung.seconds
        h.clock.advance(seconds)
        h.reconciler.reconcile_once()
        spent[rung.phase] = seconds
    return spent


def test_the_meter_adds_the_time_since_the_last_pass_to_the_phase_each_record_was_listed_in() -> None:
    meter = ExclusionMeter()
    quarantined = with_status(make_record(()), Phase.QUARANTINED)
    assert meter.advance(100.0, [quarantined]) == {}  # a first pass has no interval behind it
    assert meter.advance(130.0, [quarantined, with_status(quarantined, Phase.PENDING)]) == {
        ("gpu-node-1", "Unhealthy", "Quarantined"): 30.0
    }
    assert meter.advance(120.0, [quarantined]) == {}  # a clock that went back adds nothing
    assert meter.advance(125.0, [quarantined]) == {("gpu-node-1", "Unhealthy", "Quarantined"): 5.0}
    meter.forget()
    assert meter.advance(500.0, [quarantined]) == {}


def test_the_leader_counts_each_phase_the_device_was_excluded_in_and_the_verdict_at_its_end() -> None:
    h = Harness()
    name = h.add()
    h.reconciler.reconcile_once()  # Pending -> Quarantined: nothing excluded before this pass
    assert excluded(h, "Quarantined") == 0.0  # born at 0, one pass before it grows
    assert h.sample(ENDED, verdict="unconfirmed", reason="Unhealthy") == 0.0
    h.clock.advance(100)
    h.resolve(name)
    h.reconciler.reconcile_once()  # listed Quarantined: +100 there, moves to Probing
    assert excluded(h, "Quarantined") == 100.0
    assert excluded(h, LADDER.first.phase) == 0.0
    h.health.set("gpu-node-1", "GPU-4a1c", Health.HEALTHY, h.clock.now())
    spent = climb(h, name)
    assert h.phase(name) == Phase.RELEASED
    assert {phase: excluded(h, phase) for phase in LADDER.phases} == spent
    # Released at the first attempt with only its triggering Unhealthy report: unconfirmed.
    assert h.sample(ENDED, verdict="unconfirmed", reason="Unhealthy") == 1.0
    assert h.sample(ENDED, verdict="confirmed", reason="Unhealthy") == 0.0
    h.clock.advance(1000)
    h.reconciler.reconcile_once()  # a released record excludes nothing, is counted once
    assert {phase: excluded(h, phase) for phase in LADDER.phases} == spent
    assert h.sample(ENDED, verdict="unconfirmed", reason="Unhealthy") == 1.0


def test_a_failed_probe_makes_the_ended_quarantine_confirmed() -> None:
    h = Harness()
    name = h.add()
    h.reconciler.reconcile_once()
    h.resolve(name)
    h.reconciler.reconcile_once()
    h.checks.complete(h.client.record(name), "probe", CheckResult.FAILED)
    h.reconciler.reconcile_once()
    assert h.phase(name) == Phase.QUARANTINED
    # The device passes the ladder at its next attempt, after the failure's backoff.
    h.health.set("gpu-node-1", "GPU-4a1c", Health.HEALTHY, h.clock.now())
    h.clock.advance(POLICY.backoff_seconds + 1)
    h.reconciler.reconcile_once()
    climb(h, name, check_seconds=1)
    assert h.phase(name) == Phase.RELEASED
    # Its failed probe is evidence: the device was at fault, the quarantine was no false one.
    assert h.sample(ENDED, verdict="confirmed", reason="Unhealthy") == 1.0
    assert h.sample(ENDED, verdict="unconfirmed", reason="Unhealthy") == 0.0


def test_a_new_leader_starts_from_zero_and_adds_nothing_at_its_first_pass() -> None:
    h = Harness()
    h.add()
    h.reconciler.reconcile_once()
    h.clock.advance(50)
    h.reconciler.reconcile_once()
    assert excluded(h, "Quarantined") == 50.0
    h.clock.advance(20)
    h.reconciler = h.new_reconciler()  # the old leader's last 20 s are lost, never counted twice
    h.reconciler.reconcile_once()
    assert excluded(h, "Quarantined") == 0.0
    h.clock.advance(30)
    h.reconciler.reconcile_once()
    assert excluded(h, "Quarantined") == 30.0


def test_a_dry_run_excludes_nothing_and_a_device_a_pod_holds_counts_as_device_in_use() -> None:
    dry = Harness(ReconcilerSettings(policy=replace(POLICY, dry_run=True), bucket=SETTINGS.bucket))
    dry.add()
    dry.reconciler.reconcile_once()
    dry.clock.advance(60)
    dry.reconciler.reconcile_once()
    assert excluded(dry, "Quarantined") is None

    registry = CollectorRegistry()
    accounting = QuarantineAccounting(registry, dry_run=False)
    held = with_status(make_record(()), Phase.QUARANTINED, why=DEVICE_IN_USE)
    accounting.passed(NOW, [held], [held])
    accounting.passed(NOW + 40, [held], [held])
    labels = {"node": "gpu-node-1", "reason": "Unhealthy", "phase": "DeviceInUse"}
    assert registry.get_sample_value(SECONDS, labels) == 40.0
    accounting.term_ended()
    accounting.passed(NOW + 100, [held], [held])  # a later term: a new account, the series kept
    assert registry.get_sample_value(SECONDS, labels) == 40.0


def test_a_dismissed_quarantine_gets_no_verdict() -> None:
    registry = CollectorRegistry()
    accounting = QuarantineAccounting(registry)
    dismissed = make_record((Phase.PENDING, Phase.DEFERRED, Phase.RELEASED))
    assert accounting.quarantine_ended(dismissed) is None
    for verdict in ("confirmed", "unconfirmed", "restricted-unknown"):
        assert registry.get_sample_value(ENDED, {"verdict": verdict, "reason": "Unhealthy"}) is None
