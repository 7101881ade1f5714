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
