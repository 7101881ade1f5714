"""No way around the checks: a person's release request, restored enforcement, a growing expiry.

Aspects (pure decisions, `responder.reconcile.policy` and `responder.reconcile.requests`):
- no sequence of release requests, alerts, health changes, check results and deleted
  enforcement ever reaches Released without every check rung of the ladder passing in the
  attempt that released it, after the last failure, and every rung visited in order (property);
- a refused request changes nothing in the walk: the same world with and without it walks the
  same phases (property);
- a request after a Stabilizing failure is refused with the reason (condition, one Event, the
  history); one during Stabilizing with no failure shortens the window and the ramp, never
  skips the ramp; it is answered again when something turns (an alert firing refuses it);
- an enforcement deleted while the record is active comes back, with a warning Event, in every
  active phase, and the record is never Abandoned for it (property);
- the expiry only ever grows on a failure: max(what it was, now + backoff) (property);
- a breaker reset that discards the backlog dismisses only records deferred before it.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from gpuhealth.kube.meta import parse_rfc3339, rfc3339
from responder.ladder import LADDER, PROBING, RAMP, STABILIZING, Kind
from responder.reconcile import requests
from responder.reconcile.breaker import BreakerState, reset
from responder.reconcile.policy import (
    CANARY_TAINT,
    QUARANTINE_TAINT,
    CheckResult,
    Enforce,
    Health,
    Notify,
    PolicySettings,
    Step,
    step,
)
from responder.records import Phase, Quarantine, ReleaseRequest, Verdict
from responder.webhook.intake import IntakeSettings, Write, decide
from tests.responder.test_intake import alert
from tests.responder.test_policy import NOW, SETTINGS, World, ctx, observed, opened, resolved
from tests.support.ladders import check_names, walk

ACTIVE = [Phase.QUARANTINED, *LADDER.phases]


def asked(record: Quarantine, at: float, actor: str = "person/alice") -> Quarantine:
    request = ReleaseRequest(actor, "card reseated", rfc3339(at))
    return replace(record, spec=replace(record.spec, release_request=request))


def notices(result: Step) -> list[Notify]:
    return [e for e in result.effects if isinstance(e, Notify)]


class Walk:
    """One record stepped through a world that the effects change (as the reconciler would)."""

    def __init__(self, record: Quarantine, now: float = NOW, policy: PolicySettings = SETTINGS) -> None:
        self.world, self.now, self.record, self.policy = World(), now, record, policy
        self.health, self.healthy_since = Health.UNHEALTHY, None
        self.steps: list[Step] = []
        self.attempt = 0

    def tick(self, seconds: float = 0.0, *, tripped: bool = False) -> Step:
        self.now += seconds
        view = observed(
            health=self.health,
            healthy_since=self.healthy_since,
            enforcement_present=self.world.enforcement is not None,
            check=self.world.check(self.record.status.phase),
        )
        result = step(self.record, view, replace(ctx(self.now, tripped=tripped), settings=self.policy))
        if result.record.status.attempt != self.attempt:  # a new attempt's Jobs are new Jobs
            self.attempt = result.record.status.attempt
            self.world.checks.clear()
        self.world.apply(result.effects)
        self.steps.append(result)
        self.record = result.record
        return result

    def set_health(self, health: Health) -> None:
        self.health = health
        self.healthy_since = (self.healthy_since or self.now) if health == Health.HEALTHY else None

    def finish_check(self, verdict: CheckResult) -> None:
        self.world.finish(verdict)

    def climb_to(self, phase: str) -> None:
        """Up the ladder until the record stands on `phase`: each check below it passes (a second
        later the next rung), each wait below it runs its length."""
        for _ in LADDER.rungs:
            rung = self.policy.rungs.rung(self.record.status.phase)
            if rung is None or rung.phase == phase:
                break
            if rung.kind == Kind.CHECK:
                self.finish_check(CheckResult.SUCCEEDED)
                self.tick(1)
            else:
                self.tick(rung.seconds)
        assert self.record.status.phase == phase


events = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=200),
        st.sampled_from(
            ["request"] * 3
            + ["resolve"] * 3
            + ["fire", "unhealthy", "unknown", "delete", "fail-check"]
            + ["healthy"] * 4
            + ["pass-check"] * 4
            + [None] * 6
        ),
    ),
    max_size=80,
)


def walk_events(plan: list[tuple[float, str | None]], *, requests_on: bool = True) -> Walk:
    w = Walk(opened())
    for seconds, what in plan:
        if what == "request" and requests_on:
            w.record = asked(w.record, w.now)
        elif what == "resolve":
            w.record = resolved(w.record, w.now)
        elif what == "fire":
            refired = decide(w.record, alert(starts_at=w.now), now=w.now, settings=IntakeSettings())
            if isinstance(refired, Write):
                w.record = refired.record
        elif what in ("healthy", "unhealthy", "unknown"):
            w.set_health(Health(what.capitalize()))
        elif what == "delete":
            w.world.enforcement = None
        elif what in ("pass-check", "fail-check"):
            w.finish_check(CheckResult.SUCCEEDED if what == "pass-check" else CheckResult.FAILED)
        w.tick(seconds)
    return w


def check_every_release(w: Walk) -> int:
    """Every release in the walk followed each check passing, and each rung, in the attempt that
    released it (after the last failure: a failure ends an attempt). Returns the releases."""
    releases = 0
    passed: set[tuple[str, int]] = set()
    visited: list[str] = []
    for result in w.steps:
        status = result.record.status
        if status.last_check is not None and status.last_check.verdict is Verdict.PASSED:
            passed.add((status.last_check.check, status.last_check.attempt))
        if not visited or visited[-1] != status.phase:
            visited.append(status.phase)
        if status.phase == Phase.RELEASED:
            releases += 1
            for rung in LADDER.checks():
                assert (rung.name, status.attempt) in passed, (rung.name, status.attempt, passed)
            last_quarantined = max(i for i, p in enumerate(visited) if p == Phase.QUARANTINED)
            assert visited[last_quarantined + 1 :] == walk()
            break
    return releases


@settings(max_examples=300)
@given(events)
def test_no_sequence_of_requests_releases_without_every_check_since_the_last_failure(
    plan: list[tuple[float, str | None]],
) -> None:
    w = walk_events(plan)
    target(float(len({r.record.status.phase for r in w.steps})))
    check_every_release(w)
    assert all(r.record.status.phase != Phase.ABANDONED for r in w.steps)


def test_long_seeded_request_walks_release_only_through_every_check() -> None:
    """Long walks, weighted to recover, where requests come often: releases happen, each checked."""
    releases = honoured = 0
    for seed in range(120):
        rng = random.Random(seed)
        benign = ["request", "resolve", "healthy", "pass-check", None, None]
        harmful = ["fail-check", "fire", "unhealthy", "unknown", "delete"]
        plan = [
            (rng.uniform(0, 90), rng.choice(harmful if rng.random() < 0.03 else benign)) for _ in range(150)
        ]
        w = walk_events(plan)
        releases += check_every_release(w)
        honoured += any(n.reason == f"ReleaseRequest{requests.HONOURED}" for r in w.steps for n in notices(r))
    assert releases >= 10 and honoured >= 10  # exercised, not passed vacuously


@settings(max_examples=200)
@given(events)
def test_a_refused_request_changes_nothing_in_the_walk(plan: list[tuple[float, str | None]]) -> None:
    """While a failure stands (every walk here starts with one counted), requests are refused:
    the phases walked, their clocks and the effects on the device are those of no request."""
    failed = _after_a_stabilizing_failure()
    phases = []
    for requests_on in (True, False):
        w = Walk(failed.record, failed.now)
        w.world = failed.world.copy()
        w.set_health(Health.HEALTHY)
        for seconds, what in plan:
            if what == "request" and requests_on:
                w.record = asked(w.record, w.now)
            elif what == "resolve":
                w.record = resolved(w.record, w.now)
            elif what in ("pass-check", "fail-check"):
                w.finish_check(CheckResult.SUCCEEDED if what == "pass-check" else CheckResult.FAILED)
            w.tick(seconds)
        phases.append(
            [
                (
                    r.record.status.phase,
                    r.record.status.phase_since,
                    [e for e in r.effects if not isinstance(e, Notify)],
                )
                for r in w.steps
            ]
        )
    assert phases[0] == phases[1]


LONG_WAITS = replace(SETTINGS, stability_seconds=3600.0, ramp_seconds=3600.0, requested_wait_seconds=60.0)
"""Waits a request would visibly shorten (to a minute)."""


def _after_a_stabilizing_failure(policy: PolicySettings = SETTINGS) -> Walk:
    """A device that passed the checks before Stabilizing, then reported Unhealthy on it."""
    w = Walk(opened(), policy=policy)
    w.tick()
    w.record = resolved(w.record, w.now)
    w.set_health(Health.HEALTHY)
    w.tick(1)
    assert w.record.status.phase == PROBING
    w.climb_to(STABILIZING)
    w.set_health(Health.UNHEALTHY)
    failed = w.tick(10)
    assert failed.record.status.phase == Phase.QUARANTINED and failed.record.status.failures == 1
    return w


def test_a_request_after_a_stabilizing_failure_is_refused_with_the_reason() -> None:
    w = _after_a_stabilizing_failure(LONG_WAITS)
    w.set_health(Health.HEALTHY)
    w.record = asked(w.record, w.now)
    refused = w.tick(5)
    condition = refused.record.status.condition(requests.CONDITION)
    assert condition is not None and (condition.status, condition.reason) == (
        "False",
        requests.FAILURE_STANDS,
    )
    assert (
        "release requested by person/alice refused: 1 failure(s) since its last release" in condition.message
    )
    assert [(n.reason, n.warning) for n in notices(refused)] == [("ReleaseRequestFailureStands", True)]
    assert refused.record.status.history[-1].message == condition.message
    # Nothing started: the backoff holds, and the refusal is told once, not every pass.
    assert refused.record.status.phase == Phase.QUARANTINED
    again = w.tick(5)
    assert not notices(again) and again.record.status.phase == Phase.QUARANTINED
    # Past the backoff the attempt starts on its own; the request stays refused, the window full.
    w.now = parse_rfc3339(w.record.status.retry_at) or w.now
    w.tick()
    assert w.record.status.phase == PROBING
    w.climb_to(STABILIZING)
    still = w.tick(LONG_WAITS.requested_wait_seconds * 2)
    assert still.record.status.phase == STABILIZING  # the whole hour, not the request's minute
    condition = still.record.status.condition(requests.CONDITION)
    assert condition is not None and condition.reason == requests.FAILURE_STANDS


def test_a_request_while_stabilizing_shortens_the_waits_but_still_ramps() -> None:
    w = Walk(opened(), policy=LONG_WAITS)
    w.tick()
    w.record = resolved(w.record, w.now)
    w.set_health(Health.HEALTHY)
    w.tick(1)
    assert w.record.status.phase == PROBING
    w.climb_to(STABILIZING)
    waiting = w.tick(30)
    assert waiting.record.status.phase == STABILIZING and waiting.recheck_seconds == 3600 - 30
    w.record = asked(w.record, w.now)
    honoured = w.tick(1)
    condition = honoured.record.status.condition(requests.CONDITION)
    assert condition is not None and (condition.status, condition.reason) == ("True", requests.HONOURED)
    checks = ", ".join(check_names())
    waits = ", ".join(r.name for r in LADDER.rungs if r.kind in (Kind.WINDOW, Kind.RAMP))
    assert f"{checks} run in full; {waits} last at most 60 s" in condition.message
    assert "probe, canary" in checks and "stability window, ramp" in waits
    assert [n.reason for n in notices(honoured)] == ["ReleaseRequestHonoured"]
    assert honoured.record.status.phase == STABILIZING and honoured.recheck_seconds == 60 - 31
    later = LADDER.rungs[LADDER.phases.index(STABILIZING) + 1 :]
    assert RAMP in [r.phase for r in later]
    moved = w.tick(29)
    for rung in later:  # each shortened, never skipped; a check still runs
        assert moved.record.status.phase == rung.phase
        if rung.kind == Kind.CHECK:
            w.finish_check(CheckResult.SUCCEEDED)
            moved = w.tick(1)
            continue
        if rung.kind == Kind.RAMP:
            assert w.world.enforcement == CANARY_TAINT == rung.taint
        assert moved.recheck_seconds == 60
        assert w.tick(59).record.status.phase == rung.phase
        moved = w.tick(1)
    released = moved
    assert released.record.status.phase == Phase.RELEASED
    condition = released.record.status.condition(requests.CONDITION)
    assert condition is not None and condition.reason == requests.DONE


def test_a_request_is_refused_while_an_alert_fires_or_the_device_reports_unhealthy() -> None:
    record = step(opened(), observed(Health.UNHEALTHY), ctx(NOW)).record
    firing = step(asked(record, NOW), observed(Health.UNHEALTHY, enforcement_present=True), ctx(NOW + 1))
    condition = firing.record.status.condition(requests.CONDITION)
    assert condition is not None and condition.reason == requests.ALERT_FIRING
    assert "GPUDeviceUnhealthy still firing" in condition.message
    quiet = resolved(firing.record, NOW + 2)
    unhealthy = step(quiet, observed(Health.UNHEALTHY, enforcement_present=True), ctx(NOW + 2))
    condition = unhealthy.record.status.condition(requests.CONDITION)
    assert condition is not None and condition.reason == requests.UNHEALTHY
    assert [n.reason for n in notices(unhealthy)] == ["ReleaseRequestUnhealthyEvidence"]


@pytest.mark.parametrize("phase", ACTIVE)
def test_a_deleted_enforcement_comes_back_with_an_event_in_every_active_phase(phase: str) -> None:
    record = step(opened(), observed(Health.UNHEALTHY), ctx(NOW)).record
    at = record.with_phase(phase, time=rfc3339(NOW), actor="responder", message=f"now {phase}")
    gone = step(at, observed(Health.HEALTHY, enforcement_present=False), ctx(NOW + 5))
    assert gone.record.status.phase == phase  # never Abandoned
    assert gone.record.status.phase_since == at.status.phase_since  # its clocks run on
    rung = LADDER.rung(phase)
    taint = rung.taint if rung is not None and rung.kind == Kind.RAMP else QUARANTINE_TAINT
    assert Enforce(taint, record.spec.reason, "NoSchedule") in gone.effects
    [notice] = notices(gone)
    assert notice.reason == "EnforcementRestored" and notice.warning
    assert f"{record.status.enforced} was found missing while {phase}: restored" in notice.message


def test_dry_run_restores_nothing_it_never_wrote() -> None:
    record = step(opened(), observed(Health.UNHEALTHY), ctx(NOW, dry_run=True)).record
    later = step(record, observed(Health.UNHEALTHY, enforcement_present=False), ctx(NOW + 5, dry_run=True))
    assert not any(isinstance(e, Enforce) for e in later.effects)


@settings(max_examples=300)
@given(
    st.floats(min_value=-10 * 86400, max_value=30 * 86400),  # the expiry, relative to the failure
    st.integers(min_value=0, max_value=12),  # failures already counted
    st.sampled_from(["check", "unhealthy", "expired"]),
)
def test_the_expiry_only_ever_grows_on_a_failure(offset: float, failures: int, how: str) -> None:
    record = step(opened(), observed(Health.UNHEALTHY), ctx(NOW)).record
    now = NOW + 1000
    if how == "expired":
        offset = min(offset, 0.0)  # it expired while the alert still fires
        at = record
    else:
        at = record.with_phase(
            PROBING if how == "check" else STABILIZING, time=rfc3339(NOW), actor="r", message=""
        )
        at = resolved(at, NOW)
    expires = now + offset
    at = replace(
        at,
        spec=replace(at.spec, expires_at=rfc3339(expires)),
        status=replace(at.status, failures=failures),
    )
    view = observed(
        Health.UNHEALTHY if how == "unhealthy" else Health.HEALTHY,
        enforcement_present=True,
        check=CheckResult.FAILED if how == "check" else CheckResult.ABSENT,
    )
    after = step(at, view, ctx(now)).record
    assert after.status.failures == failures + 1
    backoff = min(SETTINGS.max_backoff_seconds, SETTINGS.backoff_seconds * 2**failures)
    grown = parse_rfc3339(after.spec.expires_at)
    assert grown is not None and grown >= expires - 1e-3
    assert abs(grown - max(expires, now + backoff)) < 1e-3
    assert parse_rfc3339(after.status.retry_at) == now + backoff


def test_a_discarding_reset_dismisses_only_what_was_deferred_before_it() -> None:
    deferred = step(opened(), observed(Health.UNHEALTHY), ctx(NOW, tripped=True)).record
    assert deferred.status.phase == Phase.DEFERRED
    closed = reset(BreakerState(tripped=True, trigger="rate"), discard_at=NOW + 100)
    later_ctx = replace(ctx(NOW + 200), breaker=closed)
    dismissed = step(deferred, observed(Health.UNHEALTHY), later_ctx)
    assert dismissed.record.status.phase == Phase.RELEASED
    assert "backlog discarded" in dismissed.record.status.history[-1].message
    after_reset = deferred.with_phase(Phase.DEFERRED, time=rfc3339(NOW + 150), actor="r", message="")
    after_reset = replace(after_reset, status=replace(after_reset.status, phase_since=rfc3339(NOW + 150)))
    assert step(after_reset, observed(Health.UNHEALTHY), later_ctx).record.status.phase == Phase.PENDING


def test_the_ladder_has_checks_and_waits_a_request_can_tell_apart() -> None:
    # The request shortens only waits: if the ladder ever lost its checks, the properties above
    # would pass vacuously.
    assert {"probe", "canary"} <= set(check_names())
    assert {r.kind for r in LADDER.rungs} == {Kind.CHECK, Kind.WINDOW, Kind.RAMP}
    for rung in LADDER.rungs:
        cut = requests.shortened(replace(rung, seconds=1000.0), 10.0)
        assert cut.seconds == (1000.0 if rung.kind == Kind.CHECK else 10.0)
