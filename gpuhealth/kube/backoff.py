"""`Backoff`: exponential delays with jitter, the one throttling helper for every retry.

Watches, lists and writes retry through it, so one policy (and one set of settings) decides
how hard a service presses an apiserver that is failing.
"""

from __future__ import annotations

import random
from typing import Protocol


class BackoffPolicy(Protocol):
    """The parameters a service's settings give (the exporter's `BackoffSettings`)."""

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
