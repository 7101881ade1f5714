"""A person's release request, answered: honoured through the ladder, or refused with the reason.

Pure: no I/O, no clock reads. `gpuhealth quarantine release` writes `spec.releaseRequest` (who,
why, when) and nothing else: the operator role may not write a record's status, and a
ValidatingAdmissionPolicy refuses status writes by anyone but the responder. The reconciler
answers the request on every pass (`answer`), level-triggered, and `responder.reconcile.policy.step`
walks the ladder with the answer:

- honoured: each waiting rung (a window, a ramp) lasts at most `PolicySettings.requested_wait_seconds`;
  every check rung runs in full, in order, in the attempt. A request never starts an attempt
  the record holds back (a backoff, a move in flight, a pod on the device): those are not waits
  a person may cut, they are what makes the attempt safe.
- refused while anything stands against the device: a failure since its last release (a failed
  or timed-out check, Unhealthy or an alert on the way out, an expiry while still failing), a
  source alert still firing, the device reporting Unhealthy, or nothing enforced yet. A refusal
  changes nothing in the walk; once a failure is counted the request stays refused until the
  device is released on its own.

The answer is the record's `ReleaseRequest` condition; the reconciler emits an Event when it
changes, and the command prints the same answer from the record before it writes the request.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from responder.ladder import Kind, Ladder, Rung
from responder.records import Condition, Phase, Quarantine

CONDITION = "ReleaseRequest"
"""`status.conditions[].type` of the answer."""
HONOURED = "Honoured"
FAILURE_STANDS = "FailureStands"
ALERT_FIRING = "AlertFiring"
UNHEALTHY = "UnhealthyEvidence"
NOT_ENFORCED = "NotEnforced"
DONE = "Done"
"""The record is Released (honoured to the end) or Abandoned: nothing is left to release."""


@dataclass(frozen=True, slots=True)
class Answer:
    honoured: bool
    reason: str
    message: str


def answer(record: Quarantine, *, unhealthy: bool, wait_seconds: float, ladder: Ladder) -> Answer | None:
    """The answer to the record's release request (None: it has none).

    `unhealthy`: the device's health, as observed, is Unhealthy (None of the record's own
    evidence says so; the command, which reads no metrics, passes False and leaves that to the
    reconciler)."""
    request = record.spec.release_request
    if request is None:
        return None
    status, who = record.status, f"release requested by {request.actor}"
    if status.phase == Phase.RELEASED:
        return Answer(True, DONE, f"{who}: released after {ladder.describe()} passed")
    if status.phase == Phase.ABANDONED:
        return Answer(False, DONE, f"{who}: the record is {status.phase}: nothing to release")
    if status.phase in (Phase.PENDING, Phase.DEFERRED):
        return Answer(False, NOT_ENFORCED, f"{who} refused: {status.phase}, nothing is enforced yet")
    if status.failures or (status.last_check is not None and status.last_check.failed):
        last = status.last_check
        what = f"; its last {last.check} failed" if last is not None and last.failed else ""
        return Answer(
            False,
            FAILURE_STANDS,
            f"{who} refused: {status.failures} failure(s) since its last release{what}; it stays "
            f"quarantined until {ladder.describe()} pass on their own",
        )
    firing = sorted({a.alertname for a in record.spec.source_alerts if a.firing})
    if firing:
        return Answer(False, ALERT_FIRING, f"{who} refused: {', '.join(firing)} still firing")
    if unhealthy:
        return Answer(False, UNHEALTHY, f"{who} refused: the device reports Unhealthy")
    checks = ", ".join(r.name for r in ladder.checks()) or "no check"
    waits = ", ".join(r.name for r in ladder.rungs if _waits(r)) or "nothing"
    return Answer(
        True,
        HONOURED,
        f"{who}: honoured: {checks} run in full; {waits} last at most {wait_seconds:.0f} s",
    )


def shortened(rung: Rung, wait_seconds: float) -> Rung:
    """`rung` as an honoured request walks it: a wait cut to `wait_seconds`, a check unchanged."""
    if not _waits(rung) or rung.seconds <= wait_seconds:
        return rung
    return replace(rung, seconds=wait_seconds)


def answered(record: Quarantine, given: Answer | None, now: str) -> tuple[Quarantine, bool]:
    """`record` with its `ReleaseRequest` condition set to `given` (dropped with no request), and
    whether the answer turned (honoured or refused, or another reason): the reconciler emits an
    Event only then, not for a message that only counts one more failure."""
    current = record.status.condition(CONDITION)
    others = tuple(c for c in record.status.conditions if c.type != CONDITION)
    if given is None:
        if current is None:
            return record, False
        return replace(record, status=replace(record.status, conditions=others)), False
    state = "True" if given.honoured else "False"
    if current is not None and (current.status, current.reason, current.message) == (
        state,
        given.reason,
        given.message,
    ):
        return record, False
    turned = current is None or (current.status, current.reason) != (state, given.reason)
    since = now if turned or current is None else current.last_transition_time
    condition = Condition(CONDITION, state, given.reason, given.message, since)
    return replace(record, status=replace(record.status, conditions=(*others, condition))), turned


def _waits(rung: Rung) -> bool:
    return rung.kind in (Kind.WINDOW, Kind.RAMP)
