"""Leader election on a `coordination.k8s.io/v1` Lease: the record, and every decision, as pure data.

The rules are those of client-go's `leaderelection`, so a gpuhealth replica and any other
client-go-style candidate read one Lease the same way:

- The record is the Lease's spec: `holderIdentity`, `leaseDurationSeconds`, `acquireTime`,
  `renewTime` (MicroTime) and `leaseTransitions`.
- A candidate notes the *local monotonic time* at which it first saw the current record
  (`Observed.observed_at`). The lease counts as expired once that time plus the record's
  `leaseDurationSeconds` has passed. `renewTime` is never compared with the local clock: the
  holder's wall clock may be skewed from ours, and only elapsed time on our own clock is
  trustworthy.
- Acquiring and renewing are conditional writes (an update at the resourceVersion read, or a
  create when no Lease exists), so of two candidates deciding on the same record only one
  write lands; the other gets 409 and reads again.
- A holder leads only until `renew_deadline_seconds` after the start of its last successful
  write (`still_leading`). The write landed no earlier than it started, and nobody else may
  take the lease until `leaseDurationSeconds` after it landed, so the holder stops at least
  `lease_duration - renew_deadline` before anyone else may start: that margin is the time the
  leader's tasks have to finish once cancelled.

The elector (`gpuhealth.kube.elector`) runs these decisions against the API; nothing here
does I/O or reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuhealth.kube.meta import parse_rfc3339, rfc3339

JITTER_FACTOR = 1.2
"""A candidate waits `retry_period * (1 + JITTER_FACTOR * random())` between tries (client-go's factor)."""


@dataclass(frozen=True, slots=True)
class ElectionSettings:
    """How long a lease lasts and how often it is renewed (client-go's defaults)."""

    lease_duration_seconds: int = 15
    """How long others wait, from when they first saw the current record, before taking the lease.
    Whole seconds: the Lease's field is an integer."""
    renew_deadline_seconds: float = 10.0
    """The leader stops leading this long after the start of its last successful renewal.
    Shorter than the lease duration; the difference is the time its tasks get to stop."""
    retry_period_seconds: float = 2.0
    """Seconds between renewals, and (jittered) between a candidate's tries."""
    jitter_factor: float = JITTER_FACTOR
    """A candidate's wait is stretched by up to this fraction, so replicas do not try in step."""
    release_on_shutdown: bool = True
    """On shutdown (after its tasks stopped) the leader clears the lease so a peer takes over at once."""

    def __post_init__(self) -> None:
        duration = self.lease_duration_seconds
        if isinstance(duration, float) and math.isfinite(duration) and duration == int(duration):
            # "15s" parsed as a duration is 15.0: whole seconds all the same.
            object.__setattr__(self, "lease_duration_seconds", int(duration))
        problems = validate_settings(self)
        if problems:
            raise ValueError("leader election settings: " + "; ".join(problems))


def validate_settings(settings: ElectionSettings) -> list[str]:
    """Every contradiction in `settings`, worded for the operator (empty when consistent)."""
    s = settings
    problems = []
    if isinstance(s.lease_duration_seconds, bool) or not isinstance(s.lease_duration_seconds, int):
        problems.append(f"lease_duration_seconds must be whole seconds, got {s.lease_duration_seconds!r}")
    for name in ("lease_duration_seconds", "renew_deadline_seconds", "retry_period_seconds"):
        value = getattr(s, name)
        if not math.isfinite(value) or value <= 0:
            problems.append(f"{name} must be a positive number of seconds, got {value!r}")
    if not math.isfinite(s.jitter_factor) or s.jitter_factor < 0:
        problems.append(f"jitter_factor must be zero or more, got {s.jitter_factor!r}")
    if problems:
        return problems
    if s.renew_deadline_seconds >= s.lease_duration_seconds:
        problems.append(
            f"renew_deadline_seconds ({s.renew_deadline_seconds}) must be less than "
            f"lease_duration_seconds ({s.lease_duration_seconds}): "
            "a leader must stop before others may take over"
        )
    if s.renew_deadline_seconds <= s.retry_period_seconds * s.jitter_factor:
        problems.append(
            f"renew_deadline_seconds ({s.renew_deadline_seconds}) must be greater than retry_period_seconds "
            f"times jitter_factor ({s.retry_period_seconds} * {s.jitter_factor}): "
            "a leader needs room to retry"
        )
    return problems


# ----- the record ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The election state a Lease's spec carries."""

    holder_identity: str = ""
    """Who holds the lease; empty when nobody does (released)."""
    lease_duration_seconds: int = 0
    """How long others must wait after seeing this record; 0 (absent) counts as expired at once."""
    acquire_time: float | None = None
    """Epoch seconds (holder's clock) the current holder acquired it; for people, not for decisions."""
    renew_time: float | None = None
    """Epoch seconds (holder's clock) of the last renewal; for people, never compared with our clock."""
    lease_transitions: int = 0
    """How many times the lease changed holder."""

    @classmethod
    def from_spec(cls, spec: Any) -> LeaseRecord:
        """The record in a Lease's spec; a field that is absent or malformed reads as unset.

        Tolerant on purpose: a Lease someone else wrote badly must not stop the election (an
        unreadable duration counts as 0, i.e. expired once observed, as client-go treats it).
        """
        spec = spec if isinstance(spec, dict) else {}
        holder = spec.get("holderIdentity")
        return cls(
            holder_identity=holder if isinstance(holder, str) else "",
            lease_duration_seconds=_count(spec.get("leaseDurationSeconds")),
            acquire_time=parse_rfc3339(spec.get("acquireTime")),
            renew_time=parse_rfc3339(spec.get("renewTime")),
            lease_transitions=_count(spec.get("leaseTransitions")),
        )

    @classmethod
    def from_lease(cls, lease: Any) -> LeaseRecord:
        """The record of a Lease object (a plain dict)."""
        return cls.from_spec(lease.get("spec") if isinstance(lease, dict) else None)

    def to_spec(self) -> dict[str, Any]:
        """The Lease spec that carries this record (the whole spec: a write replaces it)."""
        spec: dict[str, Any] = {
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "leaseTransitions": self.lease_transitions,
        }
        if self.acquire_time is not None:
            spec["acquireTime"] = rfc3339(self.acquire_time)
        if self.renew_time is not None:
            spec["renewTime"] = rfc3339(self.renew_time)
        return spec


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _micro(epoch_seconds: float) -> float:
    # Stamps are rounded to what MicroTime carries, so a record read back equals the one written.
    parsed = parse_rfc3339(rfc3339(epoch_seconds))
    return epoch_seconds if parsed is None else parsed


# ----- observing ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Observed:
    """A record as one candidate saw it, and when (its own monotonic clock) it first saw it."""

    record: LeaseRecord
    observed_at: float
    """Local monotonic seconds at which this record was first seen (reset whenever it changes)."""

    @property
    def expires_at(self) -> float:
        """Local monotonic time from which the lease counts as expired."""
        return self.observed_at + self.record.lease_duration_seconds

    def expired(self, now_monotonic: float) -> bool:
        return now_monotonic >= self.expires_at

    def held_by_other(self, identity: str, now_monotonic: float) -> bool:
        """Whether someone else holds an unexpired lease, as far as this candidate can tell."""
        holder = self.record.holder_identity
        return bool(holder) and holder != identity and not self.expired(now_monotonic)


def observe(previous: Observed | None, record: LeaseRecord, now_monotonic: float) -> Observed:
    """The observation after reading `record`: its clock restarts only when the record changed.

    Any change counts, the holder's renewal above all: a renewed record is a live holder.
    An unchanged record keeps its first-seen time, so a holder that stopped renewing expires.
    """
    if previous is not None and previous.record == record:
        return previous
    return Observed(record, now_monotonic)


# ----- deciding -----------------------------------------------------------------------------


class Action(StrEnum):
    """What a candidate does after reading the Lease."""

    CREATE = "create"
    """No Lease exists: create it, holding it."""
    ACQUIRE = "acquire"
    """Released or expired: take it over (a conditional update; one more transition)."""
    RENEW = "renew"
    """We hold it: write a fresh renewTime (a conditional update)."""
    WAIT = "wait"
    """Someone else holds an unexpired lease: read again later."""


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    record: LeaseRecord | None = None
    """The record to write (None for WAIT)."""
    expires_at: float | None = None
    """For WAIT: the local monotonic time at which the holder's lease would expire unrenewed."""


def decide(
    observed: Observed | None,
    *,
    identity: str,
    settings: ElectionSettings,
    now_wall: float,
    now_monotonic: float,
) -> Decision:
    """The next step of `identity` given what it read (None: no Lease exists) and the time now.

    The wall time only stamps the record; the judgement of expiry uses the monotonic time.
    """
    now = _micro(now_wall)
    if observed is None:
        return Decision(Action.CREATE, LeaseRecord(identity, settings.lease_duration_seconds, now, now, 0))
    old = observed.record
    if old.holder_identity == identity:
        # Ours: keep when we acquired it and the transition count; only the renewal moves.
        acquired = old.acquire_time if old.acquire_time is not None else now
        renewed = LeaseRecord(identity, settings.lease_duration_seconds, acquired, now, old.lease_transitions)
        return Decision(Action.RENEW, renewed)
    if observed.held_by_other(identity, now_monotonic):
        return Decision(Action.WAIT, expires_at=observed.expires_at)
    taken = LeaseRecord(identity, settings.lease_duration_seconds, now, now, old.lease_transitions + 1)
    return Decision(Action.ACQUIRE, taken)


def release_record(record: LeaseRecord, now_wall: float) -> LeaseRecord:
    """What a stopping holder writes so that any candidate may take the lease at its next read.

    The holder is cleared (an empty holder is free at once) and the duration cut to a second,
    for readers that look only at the duration; the transition count stays.
    """
    now = _micro(now_wall)
    return LeaseRecord("", 1, now, now, record.lease_transitions)


def still_leading(renewed_at: float | None, now_monotonic: float, settings: ElectionSettings) -> bool:
    """Whether a holder whose last successful write started at `renewed_at` may still act.

    None: no successful write in this term. Judged on the holder's own monotonic clock.
    """
    return renewed_at is not None and now_monotonic < renewed_at + settings.renew_deadline_seconds


def next_retry_delay(settings: ElectionSettings, random_fraction: float) -> float:
    """A candidate's wait before its next try, for `random_fraction` drawn from [0, 1)."""
    return settings.retry_period_seconds * (1.0 + settings.jitter_factor * random_fraction)
