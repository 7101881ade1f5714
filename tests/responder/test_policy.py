"""The reconciler's phase machine (responder.reconcile.policy), as properties over random worlds.

Aspects: a release only ever follows Probing, Canary, Stabilizing and Ramp of the same
attempt (property); the breaker defers only new automatic quarantines and never changes a
step on the release path (property); nothing but Enforce/Unenforce touches the device and
Unenforce only comes with Released; what a person removed comes back, never abandoned;
opted-out nodes and the rate limit keep records waiting with the reason visible; dry-run
enforces with effect None; failures extend the quarantine with a doubling backoff, and no
attempt starts before that backoff ran out (property); no attempt starts while a move of the
device's work is unfinished or a pod holds the device, the record waiting in Quarantined with
the reason visible (property); with the health source unavailable no step towards a release
is ever taken, no failure is counted for want of health, and a firing alert is still enforced
(property), the held step carried out once the source answers again; a device that reads
Unhealthy is never released: Unhealthy on any rung (the probe's too) sends it back to Quarantined
with the failure counted and the expiry never shortened, and resolved alerts over an Unhealthy
device start no attempt, the record waiting as StillUnhealthy (property, and an idle relapse
during Canary and Stabilizing by example).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from gpuhealth.kube.meta import parse_rfc3339, rfc3339
from responder.ladder import CANARY, LADDER, PROBING, Kind
from responder.reconcile.breaker import BreakerState, Counts
from responder.reconcile.limits import Bucket, BucketSettings
from responder.reconcile.policy import (
    BACKING_OFF,
    CANARY_TAINT,
    DEVICE_IN_USE,
    HEALTH_UNAVAILABLE,
    MIGRATING,
    QUARANTINE_TAINT,
    RESTRICTION_HELD,
    STILL_UNHEALTHY,
    CheckResult,
    Context,
    DeviceView,
    Enforce,
    Health,
    Notify,
    PolicySettings,
    SaveBreaker,
    StartCheck,
    Step,
    Unenforce,
    needs_holders,
    step,
)
from responder.records import CheckOutcome, Migration, MigrationOutcome, Phase, Quarantine, Verdict
from responder.webhook.intake import IntakeSettings, Write, decide
from tests.responder.test_intake import alert
from tests.support.ladders import minute_rungs

NOW = 1_800_000_000.0
SETTINGS = PolicySettings(**{**minute_rungs(), "stability_seconds": 120.0}, backoff_seconds=300)
"""Every rung a minute long, the stability window two."""
RELEASE_PATH = list(LADDER.phases)
"""The rungs a release walks, in order."""


def is_check(phase: str) -> bool:
    """Whether `phase` is a check rung's (its Job's result is the view's `check`)."""
    rung = LADDER.rung(phase)
    return rung is not None and rung.kind == Kind.CHECK


ENFORCED_AS = "DeviceTaintRule/the-record"
"""What the record's backend calls its enforcement, as the reconciler's view carries it."""


def observed(*args: Any, **kwargs: Any) -> DeviceView:
    """A DeviceView whose backend names its enforcement ENFORCED_AS."""
    return DeviceView(*args, **{"enforced_as": ENFORCED_AS, **kwargs})


def opened(actor_alert: bool = True, action: str = "quarantine", **labels: str) -> Quarantine:
    decision = decide(None, alert(action=action, **labels), now=NOW, settings=IntakeSettings())
    assert isinstance(decision, Write)
    record = decision.record
    if not actor_alert:
        record = replace(record, spec=replace(record.spec, actor="person/alice"))
    return record


def ctx(now: float, *, tripped: bool = False, eligible: int = 1000, dry_run: bool = False) -> Context:
    return Context(
        now=now,
        settings=replace(SETTINGS, dry_run=dry_run),
        breaker=BreakerState(
            tripped=tripped, trigger="rate" if tripped else "", detail="x" if tripped else ""
        ),
        counts=Counts(eligible=eligible, started_in_window=0, quarantined=0),
        bucket=Bucket.full(BucketSettings(burst=5, per_hour=60), now),
    )


def resolved(record: Quarantine, at: float) -> Quarantine:
    sources = tuple(replace(s, resolved_at=rfc3339(at)) for s in record.spec.source_alerts)
    return replace(record, spec=replace(record.spec, source_alerts=sources))


@dataclass
class World:
    """The device and what gpuhealth put in place, changed by the effects the steps ask for."""

    enforcement: str | None = None  # taint key of our rule/annotation, None when absent
    checks: dict[str, CheckResult] = field(default_factory=dict)
    """The current attempt's check Jobs by check name (a check not started: absent)."""

    def apply(self, effects: tuple[object, ...]) -> None:
        for effect in effects:
            if isinstance(effect, Enforce):
                self.enforcement = effect.taint_key
            elif isinstance(effect, Unenforce):
                self.enforcement = None
            elif isinstance(effect, StartCheck):
                self.checks.setdefault(effect.kind, CheckResult.RUNNING)

    def check(self, phase: str) -> CheckResult:
        """What the Job of the check rung of `phase` reports (absent off a check rung)."""
        rung = LADDER.rung(phase)
        if rung is None or rung.kind != Kind.CHECK:
            return CheckResult.ABSENT
        return self.checks.get(rung.name, CheckResult.ABSENT)

    def finish(self, verdict: CheckResult) -> None:
        """The running check (one at most) ends with `verdict`."""
        running = [name for name, result in self.checks.items() if result == CheckResult.RUNNING]
        if running:
            self.checks[running[0]] = verdict

    def copy(self) -> World:
        return replace(self, checks=dict(self.checks))


# Weighted towards a device that recovers, so that plans reach every phase of the way out
# (the release path is where the properties bite), with failures, re-fired alerts, breaker
# trips and removed enforcement mixed in.
ticks = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=200),  # seconds passing
        st.sampled_from([Health.HEALTHY] * 18 + [Health.UNHEALTHY, Health.UNKNOWN]),
        st.sampled_from([CheckResult.SUCCEEDED] * 4 + [CheckResult.FAILED, None, None]),  # a check finishing
        st.sampled_from(["resolve"] * 4 + ["fire"] + [None] * 15),
        st.sampled_from([False] * 4 + [True]),  # breaker tripped
        st.sampled_from([False] * 19 + [True]),  # someone deletes our enforcement
    ),
    max_size=60,
)


Work = tuple[str | None, bool]
"""Per tick, what the device's work does: a move of it starts ("move") or ends ("moved"),
and whether a pod holds the device."""


def play(
    record: Quarantine,
    plan: list[tuple[float, Health, CheckResult | None, str | None, bool, bool]],
    work: list[Work] | None = None,
    judge: Callable[[Quarantine, DeviceView, Step], None] | None = None,
) -> list[Step]:
    """The steps of `record` through `plan`; `work` (one per tick) changes its moves and holders
    as the migrator and the pods would (nothing moves or holds the device without it); `judge`
    sees every step with the record and the view it was decided from."""
    world, now, steps = World(), NOW, []
    holders: tuple[str, ...] = ()
    healthy_since: float | None = None
    attempt = 0
    for i, (dt, health, finished, alert_change, tripped, removed) in enumerate(plan):
        now += dt
        if work is not None and i < len(work):
            move, held = work[i]
            holders = ("ml/train-0",) if held else ()
            moves = record.status.migrations
            if move == "move" and record.status.phase == Phase.QUARANTINED:
                # The migrator only moves work of a Quarantined record.
                record = record.with_migrations([*moves, Migration("ml", f"Job/j{i}", f"uid-{i}", f"k{i}")])
            elif move == "moved" and moves:
                record = record.with_migrations(
                    [replace(m, outcome=MigrationOutcome.SUCCEEDED) for m in moves]
                )
        healthy_since = (healthy_since or now) if health == Health.HEALTHY else None
        if alert_change == "resolve":
            record = resolved(record, now)
        elif alert_change == "fire":
            refired = alert(starts_at=now)
            decision = decide(record, refired, now=now, settings=IntakeSettings())
            if isinstance(decision, Write):
                record = decision.record
        if removed:
            world.enforcement = None
        if record.status.attempt != attempt:  # a new attempt's Jobs are new Jobs
            attempt = record.status.attempt
            world.checks.clear()
        if finished is not None:
            world.finish(finished)
        view = observed(
            health=health,
            healthy_since=healthy_since,
            enforcement_present=world.enforcement is not None,
            check=world.check(record.status.phase),
            holders=holders if needs_holders(record, now) else (),
        )
        result = step(record, view, ctx(now, tripped=tripped))
        if judge is not None:
            judge(record, view, result)
        if result.record.status.attempt > record.status.attempt:
            # The safety property of a release attempt: it never starts while a move of the
            # device's work is unfinished (the move would be dropped half-way, its pods evicted
            # with no outcome, or the job left holding the device) nor while a pod holds the
            # device (its probe could not get it, and would count as the device's failure).
            assert all(m.outcome.finished for m in record.status.migrations), record.status.migrations
            assert not holders, holders
            assert result.record.status.phase == PROBING
        world.apply(result.effects)
        steps.append(result)
        record = result.record
    return steps


@settings(max_examples=300)
@given(ticks)
def test_a_release_only_follows_probe_canary_stability_and_ramp(plan: list[tuple]) -> None:  # type: ignore[type-arg]
    steps = play(opened(), plan)
    # Guide generation towards plans that get far along the way out (where this property bites).
    target(float(max((_progress(r.record.status.phase) for r in steps), default=0)))
    check_release_path(steps)
    for result in steps:
        for effect in result.effects:
            assert isinstance(effect, Enforce | Unenforce | StartCheck | SaveBreaker | Notify)


def _progress(phase: Phase) -> int:
    order = [Phase.PENDING, Phase.QUARANTINED, *RELEASE_PATH, Phase.RELEASED]
    return order.index(phase) if phase in order else 0


@settings(max_examples=300)
@given(ticks)
def test_the_breaker_never_changes_a_step_on_the_release_path(plan: list[tuple]) -> None:  # type: ignore[type-arg]
    record = opened()
    for result in play(record, plan):
        record = result.record
    if record.status.phase not in RELEASE_PATH:
        return
    view = observed(health=Health.HEALTHY, healthy_since=NOW, enforcement_present=True)
    later = NOW + 10_000
    assert step(record, view, ctx(later, tripped=True)) == step(record, view, ctx(later, tripped=False))


works = st.lists(
    st.tuples(st.sampled_from(["move", "moved"] + [None] * 6), st.sampled_from([False] * 3 + [True])),
    max_size=60,
)


@settings(max_examples=300)
@given(ticks, works)
def test_no_release_attempt_starts_while_a_move_is_unfinished_or_a_pod_holds_the_device(
    plan: list[tuple],  # type: ignore[type-arg]
    work: list[Work],
) -> None:
    steps = play(opened(), plan, work)  # play asserts the property at every attempt
    target(float(max((s.record.status.attempt for s in steps), default=0)))
    check_release_path(steps)


def long_plan(rng: random.Random) -> list[tuple]:  # type: ignore[type-arg]
    """80 ticks of a long seeded plan: mostly healthy, checks mostly passing, alerts resolving
    more often than firing (long enough to get through several attempts, unlike hypothesis')."""
    return [
        (
            rng.uniform(0, 200),
            rng.choice([Health.HEALTHY] * 18 + [Health.UNHEALTHY, Health.UNKNOWN]),
            rng.choice([CheckResult.SUCCEEDED] * 4 + [CheckResult.FAILED, None, None]),
            rng.choice(["resolve"] * 4 + ["fire"] + [None] * 15),
            rng.random() < 0.2,
            rng.random() < 0.02,
        )
        for _ in range(80)
    ]


def test_long_seeded_runs_never_start_an_attempt_over_a_move_or_a_holder() -> None:
    attempts = waits = 0
    for seed in range(150):
        rng = random.Random(seed)
        plan = long_plan(rng)
        work = [(rng.choice(["move", "moved"] + [None] * 6), rng.random() < 0.25) for _ in range(80)]
        steps = play(opened(), plan, work)
        attempts += max((s.record.status.attempt for s in steps), default=0)
        waits += sum(s.record.status.phase_reason in (MIGRATING, DEVICE_IN_USE) for s in steps)
    assert attempts >= 30 and waits >= 30  # both the attempts and the waits were exercised


def test_a_move_that_only_awaits_its_replacements_holds_no_release_back() -> None:
    # Its pods were evicted and the device is free: the job's replacements may be waiting for
    # room that only the device's own ramp opens (an opted-in workload), so the attempt starts.
    record = step(opened(), observed(Health.UNHEALTHY), ctx(NOW)).record
    awaiting = record.with_migrations(
        [
            replace(
                Migration("research", "Job/train", "uid-train", "k"),
                evictions=("2027-01-15T08:00:05.000000Z",),
                replacing_since="2027-01-15T08:00:06.000000Z",
            )
        ]
    )
    healthy = observed(Health.HEALTHY, enforcement_present=True)
    probing = step(resolved(awaiting, NOW + 10), healthy, ctx(NOW + 20))
    assert probing.record.status.phase == PROBING and StartCheck("probe", 1) in probing.effects


def test_a_move_in_flight_holds_the_release_in_quarantined_until_it_ends() -> None:
    record = step(opened(), observed(Health.UNHEALTHY), ctx(NOW)).record
    moving = record.with_migrations([Migration("research", "Job/train", "uid-train", "k")])
    healthy = observed(Health.HEALTHY, enforcement_present=True)
    waiting = step(resolved(moving, NOW + 10), healthy, ctx(NOW + 20))
    assert (waiting.record.status.phase, waiting.record.status.phase_reason) == (Phase.QUARANTINED, MIGRATING)
    assert "Job/train" in waiting.record.status.history[-1].message
    assert not any(isinstance(e, StartCheck) for e in waiting.effects)
    # The move ended (the migrator wrote its outcome): the attempt starts.
    moved = waiting.record.with_migrations(
        [replace(m, outcome=MigrationOutcome.SUCCEEDED) for m in waiting.record.status.migrations]
    )
    assert needs_holders(moved, NOW + 30)
    probing = step(moved, healthy, ctx(NOW + 30))
    assert probing.record.status.phase == PROBING and StartCheck("probe", 1) in probing.effects
    # An alert firing again while it waited: it waits for its alerts again, reason cleared.
    refired = decide(waiting.record, alert(starts_at=NOW + 25), now=NOW + 25, settings=IntakeSettings())
    assert isinstance(refired, Write)
    firing = step(refired.record, healthy, ctx(NOW + 25)).record
    assert (firing.status.phase, firing.status.phase_reason) == (Phase.QUARANTINED, "")


def test_a_held_device_is_not_probed_until_it_is_free() -> None:
    restricted = step(opened(action="restrict"), observed(Health.UNKNOWN), ctx(NOW)).record
    free = resolved(restricted, NOW + 10)
    assert needs_holders(free, NOW + 20) and not needs_holders(restricted, NOW + 20)
    held = observed(Health.HEALTHY, enforcement_present=True, holders=("lab/notebook-0",))
    waiting = step(free, held, ctx(NOW + 20))
    assert (waiting.record.status.phase, waiting.record.status.phase_reason) == (
        Phase.QUARANTINED,
        DEVICE_IN_USE,
    )
    assert "lab/notebook-0" in waiting.record.status.history[-1].message
    assert waiting.effects == () and waiting.record.status.failures == 0  # no failure counted
    again = step(waiting.record, held, ctx(NOW + 50))
    assert again.record == waiting.record  # level-triggered: nothing rewritten while it waits
    probing = step(waiting.record, replace(held, holders=()), ctx(NOW + 80))
    assert probing.record.status.phase == PROBING


def check_release_path(steps: list[Step]) -> bool:
    """The release property for one run; True when the run released the device."""
    released = False
    for result in steps:
        if any(isinstance(e, Unenforce) for e in result.effects):
            assert result.record.status.phase == Phase.RELEASED
            # Consecutive entries of one phase are notes within it (an enforcement restored).
            history = [
                h.phase
                for i, h in enumerate(result.record.status.history)
                if i == 0 or result.record.status.history[i - 1].phase != h.phase
            ]
            last_quarantine = max(i for i, p in enumerate(history) if p == Phase.QUARANTINED)
            walked = history[last_quarantine + 1 :]
            # A wait on a rung (the health source away, and back) is an entry of the same phase,
            # never a step: the phases walked, each once, in order.
            steps = [p for i, p in enumerate(walked) if i == 0 or walked[i - 1] != p]
            assert steps == [*RELEASE_PATH, Phase.RELEASED]
            released = True
    return released


def test_long_seeded_runs_release_only_along_the_path() -> None:
    """Hypothesis favours short plans, which rarely get all the way out; long seeded plans do."""
    releases = 0
    for seed in range(150):
        rng = random.Random(seed)
        plan = long_plan(rng)
        releases += check_release_path(play(opened(), plan))
    assert releases >= 15  # the property was exercised, not passed vacuously


def test_the_whole_way_out() -> None:
    world, now = World(), NOW
    record = opened(driver="gpu.nvidia.com", pool="p", device_name="gpu-3")
    first = step(record, observed(Health.UNHEALTHY), ctx(now))
    assert first.record.status.phase == Phase.QUARANTINED and first.took_token
    assert first.record.status.enforced == ENFORCED_AS
    assert Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule") in first.effects
    world.apply(first.effects)
    record = resolved(first.record, now + 100)
    view = observed(Health.HEALTHY, healthy_since=now + 100, enforcement_present=True)
    # Each rung entered with what its kind asks: a check's Job started, nothing for a window, the
    # canary taint for the ramp; the release lifts it and says so.
    entered = {Kind.CHECK: ["StartCheck"], Kind.WINDOW: [], Kind.RAMP: ["Enforce"]}
    expected = [(rung.phase, entered[rung.kind]) for rung in SETTINGS.rungs.rungs]
    expected.append((Phase.RELEASED, ["Unenforce", "Notify"]))
    result = step(record, view, ctx(now + 110))  # -> the first rung
    record, now = result.record, now + 110
    phases = [(record.status.phase, [type(e).__name__ for e in result.effects])]
    for rung in SETTINGS.rungs.rungs:
        assert record.status.phase == rung.phase
        if rung.kind == Kind.CHECK:
            now += 10  # its Job passes 10 s in
        else:
            now += rung.seconds
            # A window or the ramp lasts its length exactly: still on it a second before.
            assert step(record, view, ctx(now - 1)).record.status.phase == rung.phase
        check = CheckResult.SUCCEEDED if rung.kind == Kind.CHECK else CheckResult.ABSENT
        result = step(record, replace(view, check=check), ctx(now))
        record = result.record
        phases.append((record.status.phase, [type(e).__name__ for e in result.effects]))
    assert phases == expected
    assert record.status.last_check == CheckOutcome(LADDER.checks()[-1].name, 1, Verdict.PASSED)
    assert record.status.enforced == ""


def test_a_failed_probe_quarantines_again_with_a_doubling_backoff() -> None:
    record = step(opened(), observed(Health.UNHEALTHY), ctx(NOW)).record
    expiries = []
    now = NOW
    for attempt in (1, 2):
        probing = step(resolved(record, now), observed(Health.HEALTHY, enforcement_present=True), ctx(now))
        assert probing.record.status.attempt == attempt
        failed = step(
            probing.record,
            observed(Health.HEALTHY, enforcement_present=True, check=CheckResult.FAILED),
            ctx(now),
        )
        record = failed.record
        assert record.status.phase == Phase.QUARANTINED
        assert record.status.last_check == CheckOutcome("probe", attempt, Verdict.FAILED)
        expiries.append(record.status.retry_at)
        # The expiry (a day, from the intake) is longer than either backoff: it stays.
        assert record.spec.expires_at == opened().spec.expires_at
        now = parse_rfc3339(record.status.retry_at) or now
    assert expiries == [rfc3339(NOW + 300), rfc3339(NOW + 300 + 600)]


def test_after_a_failure_the_next_attempt_waits_for_the_backoff_with_the_reason_visible() -> None:
    record = step(opened(), observed(Health.UNHEALTHY), ctx(NOW)).record
    healthy = observed(Health.HEALTHY, enforcement_present=True)
    probing = step(resolved(record, NOW), healthy, ctx(NOW)).record
    failed = step(probing, replace(healthy, check=CheckResult.FAILED), ctx(NOW + 30)).record
    assert failed.status.retry_at == rfc3339(NOW + 30 + 300)
    assert failed.spec.expires_at == record.spec.expires_at  # a day: longer than the backoff
    # The alerts are resolved, the device looks healthy: still no second probe before the backoff.
    waiting = step(failed, healthy, ctx(NOW + 31))
    assert waiting.record.status.phase == Phase.QUARANTINED
    assert waiting.record.status.phase_reason == BACKING_OFF
    assert waiting.record.status.attempt == 1
    assert not any(isinstance(e, StartCheck) for e in waiting.effects)
    assert waiting.recheck_seconds == pytest.approx(299)
    # An alert firing again while it backs off: the reason says it waits for its alerts again.
    refired = decide(waiting.record, alert(starts_at=NOW + 40), now=NOW + 40, settings=IntakeSettings())
    assert isinstance(refired, Write)
    firing = step(refired.record, healthy, ctx(NOW + 40)).record
    assert (firing.status.phase, firing.status.phase_reason) == (Phase.QUARANTINED, "")
    retried = step(waiting.record, healthy, ctx(NOW + 330))
    assert (retried.record.status.phase, retried.record.status.attempt) == (PROBING, 2)
    assert retried.record.status.phase_reason == ""
    assert StartCheck("probe", 2) in retried.effects


def check_backoff(record: Quarantine, steps: list[Step]) -> int:
    """The backoff property for one run: every failure extends the quarantine by the backoff
    doubled per consecutive failure, and no attempt starts before that extension ran out.
    Returns how many attempts followed a failure (to show the property was exercised)."""
    retries = 0
    not_before: float | None = None
    for result in steps:
        after = result.record.status
        stamp = result.record.status.history[-1].time if after.history else ""
        now = parse_rfc3339(stamp) if after.history is not record.status.history else None
        if after.failures > record.status.failures:
            assert now is not None
            retry_at = parse_rfc3339(after.retry_at)
            backoff = min(SETTINGS.max_backoff_seconds, SETTINGS.backoff_seconds * 2 ** (after.failures - 1))
            assert retry_at == pytest.approx(now + backoff, abs=1e-3)
            # The expiry only ever grows on a failure: max(what it was, the backoff's end).
            before, expires = (
                parse_rfc3339(record.spec.expires_at),
                parse_rfc3339(result.record.spec.expires_at),
            )
            assert before is not None and expires is not None
            assert expires == pytest.approx(max(before, now + backoff), abs=1e-3)
            not_before = retry_at
        if after.attempt > record.status.attempt:
            assert now is not None
            assert not any(isinstance(e, StartCheck) and e.attempt != after.attempt for e in result.effects)
            if not_before is not None:
                assert now >= not_before, f"attempt {after.attempt} started before its backoff ran out"
                retries += 1
        record = result.record
    return retries


@settings(max_examples=300)
@given(ticks)
def test_a_failed_check_is_never_retried_before_its_backoff(plan: list[tuple]) -> None:  # type: ignore[type-arg]
    record = opened()
    steps = play(record, plan)
    target(float(max((s.record.status.failures for s in steps), default=0)))
    check_backoff(record, steps)


def test_long_seeded_runs_retry_only_after_the_backoff() -> None:
    """Long plans get through several failures and retries; the property holds in each."""
    retries = 0
    for seed in range(150):
        rng = random.Random(seed)
        plan = long_plan(rng)
        record = opened()
        retries += check_backoff(record, play(record, plan))
    assert retries >= 15  # retries after a failure happened, and each waited


def test_the_breaker_defers_automatic_quarantines_but_not_a_persons() -> None:
    automatic = step(opened(), observed(Health.UNHEALTHY), ctx(NOW, tripped=True))
    assert automatic.record.status.phase == Phase.DEFERRED
    assert automatic.record.status.phase_reason == "BreakerOpen"
    assert not any(isinstance(e, Enforce) for e in automatic.effects)
    manual = step(opened(actor_alert=False), observed(Health.UNHEALTHY), ctx(NOW, tripped=True))
    assert manual.record.status.phase == Phase.QUARANTINED


def test_a_tripping_admission_saves_the_breaker() -> None:
    small = replace(ctx(NOW), counts=Counts(eligible=10, started_in_window=5, quarantined=0))
    result = step(opened(), observed(Health.UNHEALTHY), small)
    assert result.record.status.phase == Phase.DEFERRED
    assert isinstance(result.effects[0], SaveBreaker) and result.effects[0].state.tripped


def test_deferred_devices_are_reevaluated_not_replayed() -> None:
    deferred = step(opened(), observed(Health.UNHEALTHY), ctx(NOW, tripped=True)).record
    still = step(deferred, observed(Health.UNHEALTHY), ctx(NOW + 10))
    assert still.record.status.phase == Phase.PENDING
    healthy = step(deferred, observed(Health.HEALTHY), ctx(NOW + 10))
    assert healthy.record.status.phase == Phase.RELEASED and not healthy.effects
    old_unknown = step(deferred, observed(Health.UNKNOWN), ctx(NOW + 2 * 3600))
    assert old_unknown.record.status.phase == Phase.RELEASED


def test_what_a_person_removed_comes_back_never_abandoned() -> None:
    record = step(opened(), observed(Health.UNHEALTHY), ctx(NOW)).record
    gone = step(record, observed(Health.UNHEALTHY, enforcement_present=False), ctx(NOW + 5))
    assert gone.record.status.phase == Phase.QUARANTINED
    assert Enforce(QUARANTINE_TAINT, record.spec.reason, "NoSchedule") in gone.effects
    # A record an older responder left Abandoned stays as it was.
    old = record.with_phase(Phase.ABANDONED, time=rfc3339(NOW), actor="responder", message="old")
    assert step(old, observed(Health.UNHEALTHY), ctx(NOW + 10)).effects == ()


def test_waiting_reasons_are_visible() -> None:
    opted_out = step(opened(), observed(Health.UNHEALTHY, node_opted_out=True), ctx(NOW))
    assert (opted_out.record.status.phase, opted_out.record.status.phase_reason) == (
        Phase.PENDING,
        "NodeOptedOut",
    )
    assert opted_out.effects == ()
    empty = replace(ctx(NOW), bucket=Bucket(BucketSettings(burst=1, per_hour=60), 0.0, NOW))
    limited = step(opened(), observed(Health.UNHEALTHY), empty)
    assert limited.record.status.phase_reason == "RateLimited" and limited.recheck_seconds == pytest.approx(
        60
    )


def test_dry_run_enforces_with_effect_none() -> None:
    result = step(opened(), observed(Health.UNHEALTHY), ctx(NOW, dry_run=True))
    assert Enforce(QUARANTINE_TAINT, "Unhealthy", "None") in result.effects


def test_ramp_uses_the_canary_taint() -> None:
    assert CANARY_TAINT == "gpuhealth.io/canary" and QUARANTINE_TAINT == "gpuhealth.io/quarantine"


@pytest.mark.parametrize(
    "bad", [{"stability_seconds": 0}, {"backoff_seconds": float("nan")}, {"max_backoff_seconds": 1}]
)
def test_settings_refuse_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PolicySettings(**bad)  # type: ignore[arg-type]


def test_a_deferred_device_loses_an_enforcement_left_by_a_lost_admission() -> None:
    # The admission enforced, then its record write lost a conflict; the breaker tripped before
    # the next pass decided again: the device is deferred, and the stray exclusion removed.
    pending = opened()
    stray = observed(Health.UNHEALTHY, enforcement_present=True)
    deferred = step(pending, stray, ctx(NOW, tripped=True))
    assert deferred.record.status.phase == Phase.DEFERRED
    assert Unenforce() in deferred.effects
    still = step(deferred.record, stray, ctx(NOW + 30, tripped=True))
    assert still.record.status.phase == Phase.DEFERRED and still.effects == (Unenforce(),)
    # Without a stray enforcement, deferring touches nothing in the cluster.
    clean = step(pending, observed(Health.UNHEALTHY), ctx(NOW, tripped=True))
    assert not [e for e in clean.effects if isinstance(e, Unenforce | Enforce)]


# As `ticks`, with the health source away on about a third of them.
outage_ticks = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=200),
        st.sampled_from(
            [Health.HEALTHY] * 12 + [Health.UNAVAILABLE] * 7 + [Health.UNHEALTHY, Health.UNKNOWN]
        ),
        st.sampled_from([CheckResult.SUCCEEDED] * 4 + [CheckResult.FAILED, None, None]),
        st.sampled_from(["resolve"] * 4 + ["fire"] + [None] * 15),
        st.sampled_from([False] * 4 + [True]),
        st.sampled_from([False] * 19 + [True]),
    ),
    max_size=60,
)
RELEASE_ORDER = [Phase.QUARANTINED, *RELEASE_PATH, Phase.RELEASED]


def judge_outage(before: Quarantine, view: DeviceView, result: Step) -> None:
    """With no answer from the health source: no step towards a release (no attempt begun, no
    rung passed, nothing lifted), no failure for want of health, and a warranted quarantine
    enforced all the same."""
    if view.health.known:
        return
    after = result.record
    assert after.status.attempt == before.status.attempt
    assert not any(isinstance(e, Unenforce) for e in result.effects)
    if before.status.phase in RELEASE_ORDER and after.status.phase in RELEASE_ORDER:
        assert RELEASE_ORDER.index(after.status.phase) <= max(RELEASE_ORDER.index(before.status.phase), 1)
    assert after.status.phase != Phase.RELEASED or before.status.phase in (Phase.RELEASED, Phase.DEFERRED)
    if after.status.failures > before.status.failures:
        assert not after.status.history[-1].message.startswith("the device reported")
    if (
        before.status.phase == Phase.PENDING
        and after.status.phase != Phase.DEFERRED
        and after.status.phase_reason != "RateLimited"
    ):
        # Admitted by the breaker and the bucket, the alert alone is the warrant.
        assert after.status.phase == Phase.QUARANTINED
        assert any(isinstance(e, Enforce) and e.taint_key == QUARANTINE_TAINT for e in result.effects)


@settings(max_examples=300)
@given(outage_ticks)
def test_with_health_unavailable_no_release_step_is_taken_and_enforcement_still_is(plan: list[tuple]) -> None:  # type: ignore[type-arg]
    steps = play(opened(), plan, judge=judge_outage)
    target(float(max((_progress(r.record.status.phase) for r in steps), default=0)))
    check_release_path(steps)


def test_long_seeded_outages_hold_releases_and_enforce() -> None:
    held = enforced_blind = 0
    for seed in range(150):
        rng = random.Random(seed)
        plan = [(t[0], Health.UNAVAILABLE if rng.random() < 0.35 else t[1], *t[2:]) for t in long_plan(rng)]
        seen: list[tuple[Quarantine, DeviceView, Step]] = []

        def judge(
            before: Quarantine,
            view: DeviceView,
            result: Step,
            seen: list[tuple[Quarantine, DeviceView, Step]] = seen,
        ) -> None:
            judge_outage(before, view, result)
            seen.append((before, view, result))

        play(opened(), plan, judge=judge)
        held += sum(r.record.status.phase_reason == HEALTH_UNAVAILABLE for _, _, r in seen)
        enforced_blind += sum(
            b.status.phase == Phase.PENDING
            and r.record.status.phase == Phase.QUARANTINED
            and not v.health.known
            for b, v, r in seen
        )
    # Both sides were exercised, not passed vacuously: holds, and quarantines enforced blind.
    assert held >= 30 and enforced_blind >= 20


def test_an_outage_holds_each_step_towards_the_release_and_the_answer_carries_it_out() -> None:
    blind = observed(Health.UNAVAILABLE, enforcement_present=True)
    quarantined = step(opened(), replace(blind, enforcement_present=False), ctx(NOW))
    assert quarantined.record.status.phase == Phase.QUARANTINED  # the alert is the warrant
    assert Enforce(QUARANTINE_TAINT, quarantined.record.spec.reason, "NoSchedule") in quarantined.effects
    record = resolved(quarantined.record, NOW + 10)
    waiting = step(record, blind, ctx(NOW + 20))
    assert (waiting.record.status.phase, waiting.record.status.phase_reason) == (
        Phase.QUARANTINED,
        HEALTH_UNAVAILABLE,
    )
    assert waiting.effects == () and waiting.record.status.attempt == 0
    healthy = observed(Health.HEALTHY, healthy_since=NOW + 30, enforcement_present=True)
    probing = step(waiting.record, healthy, ctx(NOW + 30)).record
    assert probing.status.phase == PROBING
    # The probe passed while the source was away: Canary (judged by the metrics) waits for it,
    # and a long outage neither fails the probe by its timeout nor the device for want of health.
    passed = step(probing, replace(blind, check=CheckResult.SUCCEEDED), ctx(NOW + 40))
    assert (passed.record.status.phase, passed.record.status.phase_reason) == (PROBING, HEALTH_UNAVAILABLE)
    later = step(passed.record, replace(blind, check=CheckResult.SUCCEEDED), ctx(NOW + 4000))
    assert later.record == passed.record and later.record.status.failures == 0
    canary = step(later.record, replace(healthy, check=CheckResult.SUCCEEDED), ctx(NOW + 4010)).record
    assert (canary.status.phase, canary.status.phase_reason) == (CANARY, "")
    # On a judged rung an outage is no failure; evidence of failure still is.
    assert step(canary, blind, ctx(NOW + 4020)).record.status.failures == 0
    failed = step(canary, replace(blind, check=CheckResult.FAILED), ctx(NOW + 4020)).record
    assert (failed.status.phase, failed.status.failures) == (Phase.QUARANTINED, 1)


def test_a_deferred_device_is_admitted_on_its_alert_and_an_old_unknown_waits_for_health() -> None:
    blind = observed(Health.UNAVAILABLE)
    deferred = step(opened(), blind, ctx(NOW, tripped=True)).record
    assert deferred.status.phase == Phase.DEFERRED
    assert step(deferred, blind, ctx(NOW + 7200)).record.status.phase == Phase.PENDING
    unknown = step(opened(action="restrict"), blind, ctx(NOW, tripped=True)).record
    assert step(unknown, blind, ctx(NOW + 60)).record.status.phase == Phase.PENDING
    old = step(unknown, blind, ctx(NOW + 7200)).record
    assert (old.status.phase, old.status.phase_reason) == (Phase.DEFERRED, HEALTH_UNAVAILABLE)
    assert step(old, observed(Health.UNKNOWN), ctx(NOW + 7300)).record.status.phase == Phase.RELEASED


def _judge_unhealthy(record: Quarantine, view: DeviceView, result: Step) -> None:
    """Every step over an Unhealthy view: never a release, never an attempt begun, a rung left
    for Quarantined with the failure counted and the expiry kept or grown."""
    if view.health != Health.UNHEALTHY:
        return
    before, after = record.status, result.record.status
    if before.phase in (Phase.PENDING, Phase.DEFERRED, Phase.RELEASED, Phase.ABANDONED):
        return  # over already, or never enforced (a deferred device dismissed on re-evaluation)
    assert after.phase != Phase.RELEASED, (before.phase, after.history[-1].message)
    assert after.attempt == before.attempt, "an attempt began over an Unhealthy device"
    restored = any(isinstance(e, Notify) and e.reason == "EnforcementRestored" for e in result.effects)
    if before.phase in RELEASE_PATH and not restored:  # a restore first, the failure the pass after
        assert after.phase == Phase.QUARANTINED, (before.phase, after.phase)
        assert after.failures == before.failures + 1
        old, new = parse_rfc3339(record.spec.expires_at), parse_rfc3339(result.record.spec.expires_at)
        assert old is not None and new is not None and new >= old
    if restored:
        return
    resolved_now = not any(s.firing for s in result.record.spec.source_alerts)
    waiting = before.enforced and after.phase == Phase.QUARANTINED and bool(result.record.status.enforced)
    held = after.phase_reason in (BACKING_OFF, RESTRICTION_HELD, MIGRATING)  # the record's own reasons first
    if before.phase == Phase.QUARANTINED and resolved_now and waiting and not held:
        assert after.phase_reason == STILL_UNHEALTHY, after.phase_reason


@settings(max_examples=300)
@given(ticks)
def test_a_device_that_reads_unhealthy_is_never_released_and_no_attempt_begins_over_it(
    plan: list[tuple],
) -> None:  # type: ignore[type-arg]
    steps = play(opened(), plan, judge=_judge_unhealthy)
    target(float(max((_progress(r.record.status.phase) for r in steps), default=0)))


def test_long_seeded_runs_never_release_or_probe_an_unhealthy_device() -> None:
    failed_on_rungs = 0
    for seed in range(150):
        rng = random.Random(seed)
        plan = long_plan(rng)
        for result in play(opened(), plan, judge=_judge_unhealthy):
            failed_on_rungs += "reported Unhealthy" in result.record.status.history[-1].message
    assert failed_on_rungs >= 5  # Unhealthy on a rung was met, not passed vacuously


@pytest.mark.parametrize("rung", LADDER.phases)
def test_an_idle_relapse_on_any_rung_quarantines_again_with_the_failure_counted(rung: str) -> None:
    """The device passed what came before and fails again with no pod on it: its own Unhealthy
    report (no alert) is enough, on the probe's rung as on every other."""
    record = step(opened(), observed(Health.UNHEALTHY), ctx(NOW)).record
    record = resolved(record, NOW + 10)
    healthy = observed(Health.HEALTHY, healthy_since=NOW + 10, enforcement_present=True)
    now = NOW + 20
    record = step(record, healthy, ctx(now)).record
    while record.status.phase != rung:
        now += 200
        check = CheckResult.SUCCEEDED if is_check(record.status.phase) else CheckResult.ABSENT
        record = step(record, replace(healthy, check=check), ctx(now)).record
    running = CheckResult.RUNNING if is_check(rung) else CheckResult.ABSENT
    relapse = step(
        record, replace(healthy, health=Health.UNHEALTHY, healthy_since=None, check=running), ctx(now + 1)
    )
    after = relapse.record
    assert (after.status.phase, after.status.failures) == (Phase.QUARANTINED, record.status.failures + 1)
    assert f"the device reported Unhealthy while {rung}" in after.status.history[-1].message
    assert Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule") in relapse.effects
    assert parse_rfc3339(after.spec.expires_at) == parse_rfc3339(record.spec.expires_at)  # a day: kept
    assert after.status.retry_at == rfc3339(now + 1 + 300)


def test_resolved_alerts_over_a_device_that_still_reads_unhealthy_start_no_attempt() -> None:
    record = step(opened(), observed(Health.UNHEALTHY), ctx(NOW)).record
    record = resolved(record, NOW + 10)
    still = step(record, observed(Health.UNHEALTHY, enforcement_present=True), ctx(NOW + 20))
    assert (still.record.status.phase, still.record.status.phase_reason) == (
        Phase.QUARANTINED,
        STILL_UNHEALTHY,
    )
    assert "not evidence of recovery on its own" in still.record.status.history[-1].message
    assert still.record.status.attempt == 0 and still.effects == ()
    # Waiting again changes nothing; the device reading Healthy starts the attempt.
    again = step(still.record, observed(Health.UNHEALTHY, enforcement_present=True), ctx(NOW + 30))
    assert again.record == still.record
    healthy = observed(Health.HEALTHY, healthy_since=NOW + 40, enforcement_present=True)
    started = step(still.record, healthy, ctx(NOW + 40))
    assert (started.record.status.phase, started.record.status.attempt) == (PROBING, 1)


def test_a_restriction_is_released_no_sooner_than_its_length_however_soon_its_unknown_ends() -> None:
    """A repeated Unknown's restriction lasts longer (the rules' schedule, written to retryAt at
    intake): its alert resolving early starts no release attempt before then."""
    decision = decide(
        None,
        alert("GPUDeviceUnknownExpired", "restrict", annotations={"restrict_for": "1200"}),
        now=NOW,
        settings=IntakeSettings(),
    )
    assert isinstance(decision, Write)
    healthy = observed(Health.HEALTHY, enforcement_present=True)
    record = step(decision.record, healthy, ctx(NOW)).record
    assert record.status.phase == Phase.QUARANTINED and record.spec.action == "restrict"
    waiting = step(resolved(record, NOW + 60), healthy, ctx(NOW + 60))
    assert (waiting.record.status.phase, waiting.record.status.phase_reason) == (
        Phase.QUARANTINED,
        RESTRICTION_HELD,
    )
    assert waiting.recheck_seconds == pytest.approx(1140)
    assert not any(isinstance(e, StartCheck) for e in waiting.effects)
    begins = step(waiting.record, healthy, ctx(NOW + 1200))
    assert (begins.record.status.phase, begins.record.status.attempt) == (PROBING, 1)
