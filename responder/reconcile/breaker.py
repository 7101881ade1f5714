"""The circuit breaker: when too much breaks at once, the cause is rarely the devices.

Pure: no I/O, time passed in. Two triggers, both counting unique devices among the eligible
ones (the GPUs the exporter reports):
- rate: automatic quarantines started within a sliding window would exceed
  max(`rate_fraction` x eligible, `rate_floor`);
- capacity: devices under quarantine would exceed max(`capacity_fraction` x eligible,
  `capacity_floor`), in the spirit of Medik8s' `maxUnhealthy`.
Zero eligible devices disables the breaker (nothing to compare with); it never trips on
its own arithmetic. An unknown number (None: the health source has not answered since the
responder started leading) leaves the floors as the limits, the safe side of not knowing.

Tripped, it blocks new *automatic* quarantines and migrations only: the alerts are still
recorded (phase Deferred, reason BreakerOpen) and paged, and releases, probes and what a
person asks for go on. It stays tripped until a person resets it; the state is persisted
by the caller, so a restart or a new leader does not close it.

Defaults, for a 12,000-GPU fleet: 600 devices failing together (5 %) stay below the rate
trigger (8 %: 960), a tenth of the fleet at once trips it, and no more than 15 % of the
fleet is ever taken out of service automatically. The floors keep small clusters usable:
up to 5 quarantines in a window and 4 quarantined devices whatever the fleet's size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpuhealth import yaml_keys

RATE = "rate"
CAPACITY = "capacity"


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    window_seconds: float = field(default=600.0, metadata=yaml_keys.key("breaker.window", yaml_keys.duration))
    """Sliding window of the rate trigger: a storm shows within minutes."""
    rate_fraction: float = field(
        default=0.08, metadata=yaml_keys.key("breaker.rate_fraction", yaml_keys.fraction)
    )
    """Share of eligible devices whose quarantine within the window trips the breaker."""
    rate_floor: int = field(default=5, metadata=yaml_keys.key("breaker.rate_floor", yaml_keys.whole(0)))
    """Quarantines always allowed within the window, however small the fleet."""
    capacity_fraction: float = field(
        default=0.15, metadata=yaml_keys.key("breaker.capacity_fraction", yaml_keys.fraction)
    )
    """Largest share of eligible devices kept under automatic quarantine at once."""
    capacity_floor: int = field(
        default=4, metadata=yaml_keys.key("breaker.capacity_floor", yaml_keys.whole(0))
    )
    """Devices that may always be under quarantine, however small the fleet."""

    def __post_init__(self) -> None:
        if not 0 < self.window_seconds < math.inf:
            raise ValueError(
                f"window_seconds must be finite and greater than zero, not {self.window_seconds!r}"
            )
        for name in ("rate_fraction", "capacity_fraction"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], not {value!r}")
        for name in ("rate_floor", "capacity_floor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, not {value!r}")


@dataclass(frozen=True, slots=True)
class BreakerState:
    tripped: bool = False
    trigger: str = ""
    """`rate` or `capacity` while tripped."""
    tripped_at: float | None = None
    detail: str = ""
    """What the counts were when it tripped, for the record and the operator."""
    discarded_before: float | None = None
    """The last reset that discarded the backlog: the reconciler dismisses records deferred
    before it (the person's command writes this state, never the records' status)."""


@dataclass(frozen=True, slots=True)
class Counts:
    """What the breaker reads: unique devices, never events."""

    eligible: int | None
    """GPUs the exporter reports (None: not known; the floors are the limits)."""
    started_in_window: int
    """Devices whose automatic quarantine started within the window."""
    quarantined: int
    """Devices under quarantine now (any active phase)."""


def count(
    eligible: int | None,
    quarantine_starts: Iterable[tuple[str, float]],
    active: Iterable[str],
    *,
    now: float,
    settings: BreakerSettings,
) -> Counts:
    """Counts from (device, start time) pairs and the devices under quarantine now."""
    since = now - settings.window_seconds
    recent = {device for device, started in quarantine_starts if since <= started <= now}
    known = None if eligible is None else max(0, eligible)
    return Counts(eligible=known, started_in_window=len(recent), quarantined=len(set(active)))


def rate_limit(settings: BreakerSettings, eligible: int) -> int:
    return max(math.floor(settings.rate_fraction * eligible), settings.rate_floor)


def capacity_limit(settings: BreakerSettings, eligible: int) -> int:
    return max(math.floor(settings.capacity_fraction * eligible), settings.capacity_floor)


def admit(
    state: BreakerState, counts: Counts, *, now: float, settings: BreakerSettings
) -> tuple[bool, BreakerState]:
    """May one more automatic quarantine start? (allowed, the state after).

    Judged before acting ("would exceed"), so the quarantine that would cross a limit is the
    one deferred, and the breaker trips then.
    """
    if state.tripped:
        return False, state
    if counts.eligible is not None and counts.eligible <= 0:
        return True, state
    eligible = counts.eligible or 0
    of = f"{eligible} devices" if counts.eligible is not None else "an unknown number of devices"
    rate = rate_limit(settings, eligible)
    if counts.started_in_window + 1 > rate:
        return False, _trip(
            state,
            RATE,
            now,
            f"{counts.started_in_window + 1} quarantines within {settings.window_seconds:g} s would exceed "
            f"{rate} ({settings.rate_fraction:.0%} of {of}, "
            f"at least {settings.rate_floor})",
        )
    capacity = capacity_limit(settings, eligible)
    if counts.quarantined + 1 > capacity:
        return False, _trip(
            state,
            CAPACITY,
            now,
            f"{counts.quarantined + 1} devices under quarantine would exceed {capacity} "
            f"({settings.capacity_fraction:.0%} of {of}, "
            f"at least {settings.capacity_floor})",
        )
    return True, state


def reset(state: BreakerState, *, discard_at: float | None = None) -> BreakerState:
    """A person's reset: the breaker closes (the caller records who, why and the backlog choice).
    `discard_at`: the backlog deferred before then is dismissed, not re-evaluated."""
    discarded = discard_at if discard_at is not None else state.discarded_before
    return replace(state, tripped=False, trigger="", tripped_at=None, detail="", discarded_before=discarded)


def _trip(state: BreakerState, trigger: str, now: float, detail: str) -> BreakerState:
    return replace(state, tripped=True, trigger=trigger, tripped_at=now, detail=detail)
