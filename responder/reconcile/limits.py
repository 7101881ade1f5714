"""Rate limits as token buckets that a new leader can rebuild from the records.

Pure: no I/O, time passed in. A bucket holds up to `burst` tokens and gains `per_hour / 3600`
tokens a second; an action takes one. Work over the limit is not dropped: the caller keeps it
waiting in its record (phase Pending, reason RateLimited) and asks again after `wait_seconds`.

Why rebuild instead of persisting the bucket: every action the buckets limit is already
written, with its time, into a record's history (a quarantine enforced, a pod evicted). A
leader that starts (first start, restart, fail-over) replays those times through a full
bucket, so a change of leader can never hand out a second burst, and there is no extra
object to keep in step with the records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpuhealth import yaml_keys


@dataclass(frozen=True, slots=True)
class BucketSettings:
    burst: int = field(metadata=yaml_keys.key("new_quarantines.burst", yaml_keys.whole(1)))
    """Tokens a full bucket holds: how many actions may happen at once."""
    per_hour: float = field(metadata=yaml_keys.key("new_quarantines.per_hour", yaml_keys.rate))
    """Sustained rate: tokens regained per hour."""

    def __post_init__(self) -> None:
        if self.burst < 1:
            raise ValueError(f"burst must be at least 1, not {self.burst!r}")
        if not 0 < self.per_hour < math.inf:
            raise ValueError(f"per_hour must be a finite number greater than zero, not {self.per_hour!r}")

    @property
    def refill_seconds(self) -> float:
        """Seconds to regain one token."""
        return 3600.0 / self.per_hour


@dataclass(frozen=True, slots=True)
class Bucket:
    settings: BucketSettings
    tokens: float
    updated_at: float

    @classmethod
    def full(cls, settings: BucketSettings, now: float) -> Bucket:
        return cls(settings, float(settings.burst), now)

    @classmethod
    def replay(cls, settings: BucketSettings, times: Iterable[float], now: float) -> Bucket:
        """The bucket after the actions at `times` (any order; future times count as now).

        It starts full one whole refill before the first action, so given every action since
        the live bucket was last full, it is that bucket exactly. Actions are counted even
        where the bucket was empty (they happened): a rebuilt bucket is never fuller.
        """
        ordered = sorted(min(t, now) for t in times)
        start = (ordered[0] if ordered else now) - settings.burst * settings.refill_seconds
        bucket = cls.full(settings, start)
        for time in ordered:
            bucket = bucket.at(time)
            bucket = replace(bucket, tokens=bucket.tokens - 1.0)
        return bucket.at(now)

    def at(self, now: float) -> Bucket:
        """The bucket refilled up to `now` (never back in time: a clock step back refills nothing)."""
        elapsed = max(0.0, now - self.updated_at)
        tokens = min(float(self.settings.burst), self.tokens + elapsed / self.settings.refill_seconds)
        return replace(self, tokens=tokens, updated_at=max(now, self.updated_at))

    def wait_seconds(self, now: float) -> float:
        """How long until one action is allowed; 0 when one is allowed now."""
        tokens = self.at(now).tokens
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) * self.settings.refill_seconds

    def take(self, now: float) -> tuple[bool, Bucket]:
        """(allowed, the bucket after): one token taken when allowed, nothing changed otherwise."""
        current = self.at(now)
        if current.tokens < 1.0:
            return False, current
        return True, replace(current, tokens=current.tokens - 1.0)
