"""Injected time.

Decisions and state machines never read time themselves: they receive a `Clock`.
Production uses `SystemClock`; tests drive `ManualClock`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock time in seconds since the epoch (what timestamps in the API carry)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for intervals and timeouts)."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; both readings advance together."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._wall = start
        self._mono = 0.0

    def now(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes back")
        self._wall += seconds
        self._mono += seconds


class SteppableClock(SystemClock):
    """The system clock, whose wall time can be stepped forward as NTP steps a machine's clock.

    Only `now()` moves: a step leaves monotonic time alone, as a step of CLOCK_REALTIME leaves
    CLOCK_MONOTONIC. The simulated cluster runs on one, so a chaos run can make every timestamp
    it writes from then on (Lease renewals, conditions, Events) jump ahead of other processes.
    """

    def __init__(self) -> None:
        self.offset = 0.0
        """Seconds added to the system's wall time."""

    def now(self) -> float:
        return time.time() + self.offset

    def step(self, seconds: float) -> None:
        if not 0 < seconds < float("inf"):  # also refuses NaN
            raise ValueError(f"a clock step is a finite number of seconds forward, not {seconds!r}")
        self.offset += seconds
