"""The reconciler's decisions: the next step of one device's quarantine, as a pure function.

`step(record, view, context)` reads the record (what was decided before), the world as the
reconciler observed it for that device (`DeviceView`) and the shared guardrails
(`Context`: breaker, rate limit, settings, clock), and returns a `Step`: the record as it
should be written and the effects an executor applies first (effects are idempotent, so a
crash between the two is repaired by the next step). Pure: no I/O, no clock reads.

The phases (`responder.records.Phase`, and the rungs of the release ladder, `responder.ladder`):
  Pending --admit--> Quarantined --all source alerts resolved--> [each rung of the ladder:
  Probing --probe ok--> Canary --canary ok--> Stabilizing --healthy for the window--> Ramp
  --ramp period-->] Released
with Deferred (breaker open) beside Pending, and any failure on the way out returning the
device to Quarantined with the backoff doubled: the next attempt starts only once that backoff
(the extended `spec.expiresAt`) has run out. The ladder is data (`PolicySettings.ladder`): one
step per kind of rung (check, window, ramp) walks whatever rungs it declares. Safety, by
construction and property-tested:
- nothing here evicts or deletes a pod (migration is `responder.migrate.plan`'s, for
  `quarantine` records only, never `restrict`), and no effect names a whole node;
- a release only ever follows every rung of the ladder, in order, in this attempt;
- a device that reads Unhealthy is never released: Unhealthy fails every rung (checks included),
  and a Quarantined device whose alerts resolved while it still reads Unhealthy waits
  (StillUnhealthy): the alert resolving is not evidence of recovery on its own;
- a release attempt (its first rung) never starts while a move of the device's work is unfinished
  (MigrationInFlight) or a pod still holds the device (DeviceInUse): the record waits in
  Quarantined with the reason visible, so a move is never dropped half-way and a probe never
  fails only because the device was busy;
- the breaker holds back only new automatic quarantines: releases, probes and quarantines a
  person asked for go on while it is open;
- enforcement is level-triggered: while a record is active (Quarantined through the last rung),
  an exclusion found missing (a DeviceTaintRule or node annotation entry someone deleted) is put
  back, with a warning Event that says so; a record is never Abandoned for it (Abandoned stays
  readable, for records an older responder wrote);
- the expiry only ever grows on a failure: `max(current, now + backoff)`.
- with the health source unavailable (`Health.UNAVAILABLE`: Prometheus unreachable) a firing
  alert is still enforced and its work still moved (the alert is the quarantine's warrant),
  while no step towards a release is taken: no attempt starts, no rung is passed, a window
  counts nothing; failures (an alert firing again, a failed or timed-out check) still send
  the device back to Quarantined;
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

from gpuhealth import yaml_keys
from gpuhealth.kube.meta import parse_rfc3339, rfc3339
from responder.ladder import CANARY_TAINT, QUARANTINE_TAINT, Kind, LadderSettings, Rung
from responder.reconcile import breaker, requests
from responder.reconcile.breaker import BreakerSettings, BreakerState, Counts
from responder.reconcile.limits import Bucket
from responder.records import ENDED_PHASES, CheckOutcome, Phase, Quarantine, Verdict

__all__ = ["CANARY_TAINT", "QUARANTINE_TAINT"]  # re-exported: the checks tolerate both

ACTOR = "responder"
BACKING_OFF = "BackingOff"
"""Phase reason of a Quarantined device whose alerts resolved while the backoff of its last
failure runs: the next release attempt starts at `spec.expiresAt`."""
MIGRATING = "MigrationInFlight"
"""Phase reason of a Quarantined device whose alerts resolved while a move of its work is
unfinished: the release attempt starts once every move has an outcome, so exactly one flow
owns the device and the job (a move is never dropped half-way, its pods evicted with no
outcome written, nor a device probed under a job that is being moved)."""
DEVICE_IN_USE = "DeviceInUse"
"""Phase reason of a Quarantined device whose alerts resolved while a pod still holds it (a
restricted device's workload, an unrecoverable job): no probe can get the device, and a
probe timing out would count as the device's failure; the attempt starts once it is free."""
STILL_UNHEALTHY = "StillUnhealthy"
"""Phase reason of a Quarantined device whose alerts resolved while the device still reads
Unhealthy (an idle device's evidence: its ResourceSlice taints, the kubelet's allocatable
devices, NVML): the alert resolving is not evidence of recovery on its own, so no attempt starts
until the device itself reads otherwise."""
HEALTH_UNAVAILABLE = "HealthUnavailable"
"""Phase reason of a record whose next step towards a release needs Healthy evidence while the
health source gives none (Prometheus unreachable): it holds where it stands until it answers."""
UNAVAILABLE_RECHECK = 5.0
"""How soon a record held for the health source is looked at again: the source is asked every
pass, and the pass after it answers should carry the step out."""
RESTRICTION_HELD = "RestrictionHeld"
"""Phase reason of a restricted device whose Unknown ended before the restriction's length ran
out: the rules' schedule (`node_device:gpu_device_unknown_restriction:seconds`, carried by the
alert as `restrict_for` and written to `status.retryAt` at intake) makes a repeated Unknown's
restriction last longer; the release attempt starts at `status.retryAt`."""
RELEASE_WAITS = frozenset(
    {BACKING_OFF, RESTRICTION_HELD, MIGRATING, DEVICE_IN_USE, STILL_UNHEALTHY, HEALTH_UNAVAILABLE}
)


class Health(StrEnum):
    """A device's health as the metrics say it (effective: a stale report counts as Unknown)."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"
    UNAVAILABLE = "Unavailable"
    """The health source said nothing this pass (Prometheus unreachable, an unreadable answer):
    no evidence either way. Not Unknown, which is the device's own state: an outage of our
    source must neither fail a release (as Unknown on a judged rung would) nor pass one."""

    @property
    def known(self) -> bool:
        """The source answered for the device (Healthy, Unhealthy or Unknown)."""
        return self is not Health.UNAVAILABLE


class CheckResult(StrEnum):
    """The Job of the current attempt's check rung, as observed."""

    ABSENT = "Absent"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclass(frozen=True, slots=True)
class DeviceView:
    """What the reconciler observed about one record's device and what it owns for it."""

    health: Health
    healthy_since: float | None = None
    """Since when the device has been Healthy without a break (None: not Healthy now)."""
    enforcement_present: bool = False
    """The enforcement gpuhealth owns for the record exists (its backend's: a DeviceTaintRule,
    a node annotation entry)."""
    enforced_as: str = ""
    """What the record's backend calls its enforcement (`DeviceTaintRule/<name>`, `Node/<node>`):
    the `status.enforced` of a record it enforces."""
    node_opted_out: bool = False
    """The node carries `gpuhealth.io/remediation=disabled`: record and page, enforce nothing."""
    check: CheckResult = CheckResult.ABSENT
    """The Job of the check rung the record stands on, or the reset request of the reset rung
    (`responder.reset`); Absent on any other phase."""
    holders: tuple[str, ...] = ()
    """Pods (`namespace/name`) still holding the device, gpuhealth's own checks aside; observed
    only when a release attempt may start (`needs_holders`)."""


@dataclass(frozen=True, slots=True)
class PolicySettings(LadderSettings):
    """The ladder and its rungs' lengths (`LadderSettings`, declared beside the rungs), and how
    the policy backs off, admits and forgets."""

    backoff_seconds: float = field(
        default=3600.0, metadata=yaml_keys.key("policy.backoff", yaml_keys.duration)
    )
    """First extension of a quarantine whose release failed or that expired still failing;
    doubled on every consecutive failure."""
    max_backoff_seconds: float = field(
        default=7 * 86400.0, metadata=yaml_keys.key("policy.max_backoff", yaml_keys.duration)
    )
    """Cap on one extension."""
    requested_wait_seconds: float = field(
        default=300.0, metadata=yaml_keys.key("policy.requested_wait", yaml_keys.duration)
    )
    """A release request a person made, when honoured, cuts each waiting rung (the stability
    window, the ramp) to at most this long; never a check, and never to nothing: the device is
    still watched Healthy, and still ramps, for this long."""
    deferred_max_age_seconds: float = field(
        default=3600.0, metadata=yaml_keys.key("policy.deferred_max_age", yaml_keys.duration)
    )
    """After the breaker closes, a deferred device that is Unknown (not Unhealthy) is admitted
    only if it was deferred within this long: an old Unknown is no evidence of a failure now."""
    dry_run: bool = False
    """Enforce nothing: DRA rules are written with effect None (the apiserver previews what they
    would evict), device-plugin nodes are not annotated."""
    breaker: BreakerSettings = field(default_factory=BreakerSettings)

    def __post_init__(self) -> None:
        LadderSettings.__post_init__(self)  # a slotted dataclass has no zero-argument super()
        for name in (
            "requested_wait_seconds",
            "backoff_seconds",
            "max_backoff_seconds",
            "deferred_max_age_seconds",
        ):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ValueError(f"{name} must be finite and greater than zero, not {value!r}")
        if self.max_backoff_seconds < self.backoff_seconds:
            raise ValueError("max_backoff_seconds must be at least backoff_seconds")


@dataclass(frozen=True, slots=True)
class Context:
    now: float
    settings: PolicySettings
    breaker: BreakerState
    counts: Counts
    """The breaker's inputs: eligible devices, quarantines started within its window, quarantined now."""
    bucket: Bucket
    """New quarantines' token bucket, rebuilt from the records."""


# ----- effects: what an executor does, each idempotent --------------------------------------------


@dataclass(frozen=True, slots=True)
class Enforce:
    """Keep new allocations off the device, through the record's backend (`responder.enforce.backends`)."""

    taint_key: str
    taint_value: str
    effect: str
    """`NoSchedule`; `None` in dry-run (a backend previews what it can, or writes nothing)."""


@dataclass(frozen=True, slots=True)
class Unenforce:
    """Remove what gpuhealth put in place (never what anyone else did)."""


@dataclass(frozen=True, slots=True)
class StartCheck:
    """Create the probe or canary Job of `attempt` for the device (a no-op if it exists)."""

    kind: str
    """`probe` or `canary`."""
    attempt: int


@dataclass(frozen=True, slots=True)
class StartReset:
    """Ask the reset controller to reset the device's card for `attempt` (a no-op if asked)."""

    attempt: int


@dataclass(frozen=True, slots=True)
class SaveBreaker:
    state: BreakerState


@dataclass(frozen=True, slots=True)
class Notify:
    """A Kubernetes Event on the record (and in the log)."""

    reason: str
    message: str
    warning: bool = False


Effect = Enforce | Unenforce | StartCheck | StartReset | SaveBreaker | Notify


@dataclass(frozen=True, slots=True)
class Step:
    record: Quarantine
    effects: tuple[Effect, ...] = ()
    recheck_seconds: float | None = None
    """When to look again even if nothing changes (timeouts, windows, rate limits)."""
    took_token: bool = False
    """A new quarantine was admitted: the caller takes one token from the bucket."""


def step(record: Quarantine, view: DeviceView, ctx: Context) -> Step:
    if record.status.phase in ENDED_PHASES:
        return Step(record)
    # A person's release request (responder.reconcile.requests): answered before the step, to
    # decide whether its waits are shortened, and after it, for the condition the record keeps
    # (a failure in this very step refuses it from now on).
    wait, ladder = ctx.settings.requested_wait_seconds, ctx.settings.rungs
    unhealthy = view.health == Health.UNHEALTHY
    before = requests.answer(record, unhealthy=unhealthy, wait_seconds=wait, ladder=ladder)
    decided = _decide(record, view, ctx, shorten=before is not None and before.honoured)
    after = requests.answer(decided.record, unhealthy=unhealthy, wait_seconds=wait, ladder=ladder)
    answered, turned = requests.answered(decided.record, after, rfc3339(ctx.now))
    if after is not None and after.honoured and decided.recheck_seconds is not None:
        # A shortened wait ends sooner than the rung's own length the step planned to look at.
        decided = replace(decided, recheck_seconds=min(decided.recheck_seconds, wait))
    if not turned or after is None:
        return replace(decided, record=answered)
    notice = Notify(f"ReleaseRequest{after.reason}", after.message, warning=not after.honoured)
    answered = answered.with_phase(
        answered.status.phase,
        time=rfc3339(ctx.now),
        actor=ACTOR,
        message=after.message,
        reason=answered.status.phase_reason,
    )
    return replace(decided, record=answered, effects=(*decided.effects, notice))


def _decide(record: Quarantine, view: DeviceView, ctx: Context, *, shorten: bool) -> Step:
    phase = record.status.phase
    if phase == Phase.PENDING:
        return _pending(record, view, ctx)
    if phase == Phase.DEFERRED:
        return _deferred(record, view, ctx)
    if record.status.enforced and not view.enforcement_present and not ctx.settings.dry_run:
        return _restore(record, ctx)
    if phase == Phase.QUARANTINED:
        return _quarantined(record, view, ctx)
    rung = ctx.settings.rungs.rung(phase)
    if rung is None:
        # A phase this responder's ladder does not have (a rung taken out since the record
        # was written): the attempt cannot go on, and the device stays enforced.
        return _fail(record, ctx, f"{phase} is no rung of this responder's release ladder")
    if shorten:
        rung = requests.shortened(rung, ctx.settings.requested_wait_seconds)
    if _firing(record):
        return _fail(record, ctx, f"an alert fired again while {phase}")
    if view.health == Health.UNHEALTHY or (rung.metrics_judge and view.health == Health.UNKNOWN):
        # Unhealthy fails every rung, the probe's too: a device that reports a failure is not
        # cleared by a check that passed. Only Unknown is left to a rung that judges for itself.
        return _fail(record, ctx, f"the device reported {view.health.value} while {phase}")
    if view.health.known and record.status.phase_reason == HEALTH_UNAVAILABLE:
        record = _move(record, ctx, phase, "the health source answers again", reason="")
    if rung.kind in (Kind.CHECK, Kind.RESET):
        return _check(record, view, ctx, rung)
    if rung.kind == Kind.WINDOW:
        return _window(record, view, ctx, rung)
    return _ramp(record, view, ctx, rung)


def _pending(record: Quarantine, view: DeviceView, ctx: Context) -> Step:
    if view.node_opted_out:
        return _wait(
            record, ctx, "NodeOptedOut", "node has gpuhealth.io/remediation=disabled: recorded, not enforced"
        )
    automatic = record.spec.actor.startswith("alert/")
    if automatic:
        admitted, state = breaker.admit(ctx.breaker, ctx.counts, now=ctx.now, settings=ctx.settings.breaker)
        if not admitted:
            notice = Notify(
                "BreakerOpen", f"quarantine deferred: {state.detail or 'breaker open'}", warning=True
            )
            saved: tuple[Effect, ...] = (SaveBreaker(state),) if state != ctx.breaker else ()
            deferred = _move(
                record, ctx, Phase.DEFERRED, "circuit breaker open: deferred", reason="BreakerOpen"
            )
            return Step(deferred, (*saved, *_stray(view), notice))
        wait = ctx.bucket.wait_seconds(ctx.now)
        if wait > 0:
            return _wait(
                record, ctx, "RateLimited", f"over the rate of new quarantines: waits {wait:.0f} s", wait
            )
    enforced = _move(record, ctx, Phase.QUARANTINED, f"enforced: {_enforcement(view)}")
    enforced = replace(enforced, status=replace(enforced.status, enforced=_enforcement(view)))
    effects: tuple[Effect, ...] = (
        _enforce(record, ctx),
        Notify("Quarantined", f"{record.spec.reason}: {_enforcement(view)}"),
    )
    return Step(enforced, effects, recheck_seconds=0.0, took_token=automatic)


def _deferred(record: Quarantine, view: DeviceView, ctx: Context) -> Step:
    if ctx.breaker.tripped:
        # A person's reset (with --backlog) decides what happens to the backlog.
        return Step(record, _stray(view))
    deferred_at = _seconds(record.status.phase_since)
    discarded = ctx.breaker.discarded_before
    if discarded is not None and deferred_at is not None and deferred_at <= discarded:
        # A person reset the breaker with `--backlog discard` (audited in its ConfigMap).
        message = "breaker reset, backlog discarded: nothing was enforced"
        return Step(_move(record, ctx, Phase.RELEASED, message), _stray(view))
    # Re-evaluated against the device's current health, never replayed blindly: only a device
    # that still fails now (Unhealthy, or Unknown not older than the age limit) is admitted.
    age = ctx.now - (_seconds(record.status.phase_since) or ctx.now)
    recent = age <= ctx.settings.deferred_max_age_seconds
    if not view.health.known and _firing(record) and not (record.spec.action == "quarantine" or recent):
        # An old Unknown is judged by the device's health now; dismissing it needs that answer.
        return _wait(record, ctx, HEALTH_UNAVAILABLE, "breaker closed: re-evaluation waits for device health")
    failing = (
        view.health == Health.UNHEALTHY
        or (view.health == Health.UNKNOWN and recent)
        # No answer from the health source: the firing alert is the warrant of a confirmed
        # failure, and of a young Unknown, as it was when the device was deferred.
        or not view.health.known
    )
    if not (failing and _firing(record)):
        message = (
            f"breaker closed; re-evaluated: {view.health.value} now, deferred {age:.0f} s: nothing enforced"
        )
        return Step(_move(record, ctx, Phase.RELEASED, message))
    return Step(
        _move(record, ctx, Phase.PENDING, "breaker closed: re-evaluated, still failing"), recheck_seconds=0.0
    )


def _quarantined(record: Quarantine, view: DeviceView, ctx: Context) -> Step:
    if not record.status.enforced:
        # Quarantined with nothing recorded as ours (an edited record, an older responder):
        # enforce and say so, rather than trust the phase.
        repaired = replace(record, status=replace(record.status, enforced=_enforcement(view)))
        return Step(repaired, (_enforce(record, ctx),), recheck_seconds=0.0)
    expires = _seconds(record.spec.expires_at)
    if not _firing(record):
        attempt = record.status.attempt + 1
        held = _release_held(record, ctx.now)
        if held is not None:
            reason, why, recheck = held
            return _wait(
                record, ctx, reason, f"source alerts resolved: release attempt {attempt} {why}", recheck
            )
        if not view.health.known:
            return _wait(
                record,
                ctx,
                HEALTH_UNAVAILABLE,
                f"source alerts resolved: release attempt {attempt} waits for the health source",
            )
        if view.health == Health.UNHEALTHY:
            return _wait(
                record,
                ctx,
                STILL_UNHEALTHY,
                f"source alerts resolved: release attempt {attempt} waits, the device still reads "
                "Unhealthy (the alert resolving is not evidence of recovery on its own)",
            )
        if view.holders:
            pods = ", ".join(view.holders[:3]) + (
                f" and {len(view.holders) - 3} more" if len(view.holders) > 3 else ""
            )
            return _wait(
                record,
                ctx,
                DEVICE_IN_USE,
                f"source alerts resolved: release attempt {attempt} waits for the device to be free "
                f"(held by {pods})",
            )
        first = ctx.settings.rungs.first
        climbing = replace(record, status=replace(record.status, attempt=attempt))
        return _enter(
            climbing, ctx, first, f"source alerts resolved: release attempt {attempt} begins: {first.name}"
        )
    if expires is not None and ctx.now >= expires:
        return _extend(record, ctx, "expired while still failing")
    if record.status.phase_reason in RELEASE_WAITS:
        # An alert fired again: the device waits for its alerts now, not for its release attempt.
        record = _move(record, ctx, Phase.QUARANTINED, "an alert fired again while its release waited")
    return Step(record, recheck_seconds=None if expires is None else max(0.0, expires - ctx.now))


def needs_holders(record: Quarantine, now: float) -> bool:
    """Whether `step` would start a release attempt now were the device free: the only time the
    executor needs to look for pods holding it (a list of the node's pods, and for DRA of the
    claims)."""
    return (
        record.status.phase == Phase.QUARANTINED
        and bool(record.status.enforced)
        and not _firing(record)
        and _release_held(record, now) is None
    )


def _release_held(record: Quarantine, now: float) -> tuple[str, str, float | None] | None:
    """(reason, why, recheck) when the record itself holds its release attempt back, else None."""
    # A move whose evictions landed and that only awaits its replacements (`replacingSince`)
    # holds nothing back: the device is free, and its ramp may be where a replacement runs.
    moving = [m.owner for m in record.status.migrations if not m.outcome.finished and not m.replacing_since]
    if moving:
        # The migrator advances a move only while its record is Quarantined: leaving now would
        # drop it half-way (pods evicted with no outcome written, a checkpoint asked for and
        # never acted on) and probe a device the job may still hold.
        return MIGRATING, f"waits for the move of {', '.join(sorted(moving))} to end", None
    # Records a responder wrote before `retryAt` existed: their expiry was the backoff's end.
    until_text = record.status.retry_at or record.spec.expires_at
    until = _seconds(until_text)
    if record.status.failures and until is not None and now < until:
        # A failure (a check, a fresh alert, Unhealthy on the way out) extended the
        # quarantine by the doubled backoff: the next attempt waits for it, or a device that
        # fails its probe would be probed again at once, over and over.
        return BACKING_OFF, f"waits for the backoff until {until_text}", until - now
    held = _seconds(record.status.retry_at)
    if record.spec.action == "restrict" and held is not None and now < held:
        # The restriction's own length (longer for each repeated Unknown): a device whose Unknown
        # keeps coming back stays out of new allocations longer before its release is tried.
        return (
            RESTRICTION_HELD,
            f"waits for the restriction to run until {record.status.retry_at}",
            held - now,
        )
    return None


def _enter(record: Quarantine, ctx: Context, rung: Rung, message: str) -> Step:
    """The record moved onto `rung`, with what the rung starts (its check's Job, its taint)."""
    moved = _move(record, ctx, rung.phase, message)
    effects: tuple[Effect, ...] = ()
    if rung.kind in (Kind.CHECK, Kind.RESET):
        effects = (_start(rung, record.status.attempt),)
    elif rung.kind == Kind.RAMP:
        effects = (Enforce(rung.taint, record.spec.reason, _effect(ctx)),)
    return Step(moved, effects, recheck_seconds=rung.seconds)


def _passed(record: Quarantine, view: DeviceView, ctx: Context, rung: Rung, why: str) -> Step:
    """`rung` passed: onto the next rung, or released after the last; held where it stands while
    the health source gives no answer (every step towards a release needs it)."""
    following = ctx.settings.rungs.after(rung)
    if not view.health.known:
        onto = following.name if following is not None else "the release"
        return _wait(
            record, ctx, HEALTH_UNAVAILABLE, f"{why}: {onto} waits for the health source", UNAVAILABLE_RECHECK
        )
    if following is not None:
        return _enter(record, ctx, following, f"{why}: {following.name} follows")
    released = _move(record, ctx, Phase.RELEASED, f"{why}: released")
    released = replace(released, status=replace(released.status, enforced="", failures=0))
    return Step(released, (Unenforce(), Notify("Released", f"{ctx.settings.rungs.describe()} passed")))


def _start(rung: Rung, attempt: int) -> StartCheck | StartReset:
    """What starts a check rung (its Job) or the reset rung (its request)."""
    return StartReset(attempt) if rung.kind == Kind.RESET else StartCheck(rung.name, attempt)


def _check(record: Quarantine, view: DeviceView, ctx: Context, rung: Rung) -> Step:
    """A check rung, or the reset rung walked as one: its verdict is kept in `lastCheck` (a reset
    that failed blocks a person's release as a failed probe does: the card was not cleared)."""
    attempt, kind, timeout = record.status.attempt, rung.name, rung.seconds
    if view.check == CheckResult.SUCCEEDED:
        passed = replace(
            record, status=replace(record.status, last_check=CheckOutcome(kind, attempt, Verdict.PASSED))
        )
        return _passed(passed, view, ctx, rung, f"{kind} of attempt {attempt} passed")
    failed = CheckOutcome(kind, attempt, Verdict.FAILED)
    if view.check == CheckResult.FAILED:
        return _fail(record, ctx, f"{kind} of attempt {attempt} failed", check=failed)
    elapsed = ctx.now - (_seconds(record.status.phase_since) or ctx.now)
    if elapsed >= timeout:
        return _fail(
            record, ctx, f"{kind} of attempt {attempt} timed out after {timeout:.0f} s", check=failed
        )
    effects: tuple[Effect, ...] = (_start(rung, attempt),) if view.check == CheckResult.ABSENT else ()
    return Step(record, effects, recheck_seconds=timeout - elapsed)


def _window(record: Quarantine, view: DeviceView, ctx: Context, rung: Rung) -> Step:
    window = rung.seconds
    since_phase = _seconds(record.status.phase_since) or ctx.now
    healthy_since = view.healthy_since if view.healthy_since is not None else ctx.now
    stable_from = max(since_phase, healthy_since)
    if ctx.now - stable_from >= window:
        return _passed(record, view, ctx, rung, f"healthy for {window:.0f} s")
    return Step(record, recheck_seconds=window - (ctx.now - stable_from))


def _ramp(record: Quarantine, view: DeviceView, ctx: Context, rung: Rung) -> Step:
    elapsed = ctx.now - (_seconds(record.status.phase_since) or ctx.now)
    if elapsed >= rung.seconds:
        return _passed(record, view, ctx, rung, f"{rung.name} of {rung.seconds:.0f} s complete")
    return Step(record, recheck_seconds=rung.seconds - elapsed)


def _fail(record: Quarantine, ctx: Context, why: str, *, check: CheckOutcome | None = None) -> Step:
    moved = _failed(record, ctx, f"{why}: quarantined again")
    if check is not None:
        moved = replace(moved, status=replace(moved.status, last_check=check))
    effects: tuple[Effect, ...] = (_enforce(record, ctx), Notify("ReleaseFailed", why, warning=True))
    return Step(moved, effects, recheck_seconds=0.0)


def _extend(record: Quarantine, ctx: Context, why: str) -> Step:
    moved = _failed(record, ctx, f"{why}: extended")
    message = f"{why}; re-evaluated at {moved.spec.expires_at}"
    return Step(moved, (Notify("QuarantineExtended", message, warning=True),))


def _failed(record: Quarantine, ctx: Context, why: str) -> Quarantine:
    """`record` Quarantined with one more failure counted: no attempt before the doubled backoff
    has run (`status.retryAt`), and the expiry moved to that backoff's end if it was earlier
    (never earlier than it was: a failure must not cut a person's 24 h extension to an hour)."""
    failures = record.status.failures + 1
    s = ctx.settings
    backoff = min(s.max_backoff_seconds, s.backoff_seconds * 2 ** min(failures - 1, 32))
    retry_at = rfc3339(ctx.now + backoff)
    current = _seconds(record.spec.expires_at)
    expires = record.spec.expires_at if current is not None and current >= ctx.now + backoff else retry_at
    moved = _move(record, ctx, Phase.QUARANTINED, f"{why} until {retry_at}")
    status = replace(moved.status, failures=failures, retry_at=retry_at)
    return replace(moved, spec=replace(moved.spec, expires_at=expires), status=status)


def _restore(record: Quarantine, ctx: Context) -> Step:
    """The record's enforcement put back: someone deleted it while the record is active.

    Level-triggered: what the record's phase holds (the quarantine taint, or the ramp's) is
    wanted while it stands, whoever removed it; a person who means to end a quarantine asks for
    a release, which goes through the ladder. The record keeps its phase and its clocks."""
    wanted = holding(record, ctx.settings)
    message = (
        f"{record.status.enforced} was found missing while {record.status.phase}: "
        f"restored ({wanted.taint_key}); a release goes through the ladder, never by deleting it"
    )
    restored = _move(record, ctx, record.status.phase, message, reason=record.status.phase_reason)
    return Step(
        restored,
        (wanted, Notify("EnforcementRestored", message, warning=True)),
        recheck_seconds=0.0,
    )


def _stray(view: DeviceView) -> tuple[Effect, ...]:
    """Remove an enforcement a deferred device must not have.

    An admission whose enforcement was applied but whose record write then lost a conflict is
    decided again on the next pass; if the breaker has tripped meanwhile, the device is
    deferred and its exclusion, left from the lost attempt, would outlive the decision.
    """
    return (Unenforce(),) if view.enforcement_present else ()


def _wait(record: Quarantine, ctx: Context, reason: str, message: str, recheck: float | None = None) -> Step:
    if record.status.phase_reason == reason:
        return Step(record, recheck_seconds=recheck)
    return Step(_move(record, ctx, record.status.phase, message, reason=reason), recheck_seconds=recheck)


def _move(record: Quarantine, ctx: Context, phase: str, message: str, *, reason: str = "") -> Quarantine:
    return record.with_phase(phase, time=rfc3339(ctx.now), actor=ACTOR, message=message, reason=reason)


def _enforce(record: Quarantine, ctx: Context) -> Enforce:
    return Enforce(QUARANTINE_TAINT, record.spec.reason, _effect(ctx))


def _effect(ctx: Context) -> str:
    return "None" if ctx.settings.dry_run else "NoSchedule"


def _enforcement(view: DeviceView) -> str:
    if not view.enforced_as:
        raise ValueError("the view names no enforcement for the record (DeviceView.enforced_as)")
    return view.enforced_as


def holding(record: Quarantine, settings: PolicySettings) -> Enforce:
    """The enforcement the record's phase has in place: the taint of the ramp it stands on, else
    the quarantine's (what a new backend puts in place when the device's identity changed)."""
    rung = settings.rungs.rung(record.status.phase)
    taint = rung.taint if rung is not None and rung.kind == Kind.RAMP else QUARANTINE_TAINT
    return Enforce(taint, record.spec.reason, "None" if settings.dry_run else "NoSchedule")


def _firing(record: Quarantine) -> bool:
    return any(source.firing for source in record.spec.source_alerts)


def _seconds(stamp: str) -> float | None:
    return parse_rfc3339(stamp)
