"""`Backoff`: exponential delays with jitter, the one throttling helper for every retry.

Watches, lists and writes retry through it, so one policy (and one set of settings) decides
how hard a service presses an apiserver that is failing. `BackoffSettings` is the parameters'
one settings class, pure, used by every service (the exporter's observer, the responder's watches
and retries, the extender's cache); `WatchBackoff` is the same class with the responder's defaults.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from gpuhealth import fields


@dataclass(frozen=True)
class BackoffSettings:
    """The one throttling helper's parameters (watch, list and write retries)."""

    initial_seconds: float = 0.5
    """First retry delay; short, since most watch failures are a dropped connection."""
    max_seconds: float = 30.0
    """Cap on the delay, so an API outage is noticed within half a minute of its end."""
    factor: float = 2.0
    """Growth per consecutive failure."""
    jitter: float = 0.5
    """Fraction of each delay drawn at random, so a fleet of exporters does not retry in step."""

    def __post_init__(self) -> None:
        fields.positive(self, "initial_seconds", "seconds")
        fields.within(self, "max_seconds", "seconds", self.initial_seconds)
        fields.within(self, "factor", "(growth per failure; below 1 the delay would shrink)", 1.0)
        fields.within(self, "jitter", "(a fraction of the delay)", 0.0, 1.0)


@dataclass(frozen=True)
class WatchBackoff(BackoffSettings):
    """The responder's pauses: after a failed watch (of the records, or of the extender's
    nodes and pods), and before a record (or a pass) whose request failed is decided again.
    A leader, not a fleet: less jitter, and a first pause of a second (the passes go on
    meanwhile; the watch only wakes them sooner)."""

    initial_seconds: float = 1.0
    jitter: float = 0.2


class BackoffPolicy(Protocol):
    """The parameters a service's settings give (`BackoffSettings`)."""

    @property
    def initial_seconds(self) -> float: ...
    @property
    def max_seconds(self) -> float: ...
    @property
    def factor(self) -> float: ...
    @property
    def jitter(self) -> float:
        """Fraction of each delay drawn at random, so a fleet does not retry in step."""
        ...


class Backoff:
    """Delays that grow by `factor` per consecutive failure up to a cap, each cut by up to `jitter`."""

    def __init__(self, policy: BackoffPolicy, rng: random.Random | None = None) -> None:
        self._policy = policy
        self._rng = rng or random.Random()
        self._failures = 0

    def next_delay(self, minimum: float = 0.0) -> float:
        """The pause before the next try (at least `minimum`, e.g. a server's Retry-After)."""
        p = self._policy
        base = min(p.max_seconds, p.initial_seconds * p.factor**self._failures)
        if base < p.max_seconds:
            # Stop counting at the cap: factor**failures overflows a float after about a
            # thousand failures (eight hours of outage at 30 s), which would end the caller.
            self._failures += 1
        return max(minimum, base * (1.0 - p.jitter * self._rng.random()))

    def reset(self) -> None:
        """A success: the next failure starts from `initial_seconds` again."""
        self._failures = 0
