"""Simulated time and the one timer loop that drives every component of the fleet.

Time is simulated seconds since the fleet finished building, read from the injected clock
and scaled by `speed`; timestamps written to the API are the clock's wall time. One loop over
a heap of timers runs everything (no task per object), so the Lease renewals and status syncs
of 10,000 nodes cost heap entries, not tasks. With a `ManualClock`, `advance(s)` steps the
clock from timer to timer, so tests run the kubelet's quirks without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Callable
from typing import Any

from gpuhealth.clock import Clock, ManualClock

log = logging.getLogger(__name__)

_EPS = 1e-9


class Timers:
    """The fleet's clock in simulated seconds and its heap of due callbacks."""

    def __init__(self, clock: Clock, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.clock = clock
        self.speed = speed
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._mono0 = clock.monotonic()
        self._wakeup = asyncio.Event()
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def now(self) -> float:
        """Simulated seconds since `start_time()` (the timeline's zero)."""
        return (self.clock.monotonic() - self._mono0) * self.speed

    def wall(self) -> float:
        return self.clock.now()

    def start_time(self) -> None:
        """Simulated time starts now: building 10,000 nodes takes seconds that are not the timeline's."""
        self._mono0 = self.clock.monotonic()

    def at(self, due: float, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` once simulated time reaches `due` (same-time timers run in the order set)."""
        heapq.heappush(self._heap, (due, next(self._seq), fn, args))

    def wake(self) -> None:
        """A timer was set from outside the loop: let `run()` look at the heap again."""
        self._wakeup.set()

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def tick(self, limit: int | None = None) -> int:
        """Run every timer that is due now; returns how many ran (at most `limit`)."""
        ran = 0
        now = self.now()
        while self._heap and self._heap[0][0] <= now + _EPS:
            _, _, fn, args = heapq.heappop(self._heap)
            try:
                fn(*args)
            except Exception:  # one failing timer must not stop the fleet
                log.exception("simulated fleet timer %s failed", getattr(fn, "__name__", fn))
            ran += 1
            if limit is not None and ran >= limit:
                break
        return ran

    async def advance(self, seconds: float) -> None:
        """ManualClock only: move simulated time forward, running each timer at its due time."""
        if not isinstance(self.clock, ManualClock):
            raise TypeError("advance() needs a ManualClock; a real clock runs the fleet with run()")
        target = self.now() + seconds
        while True:
            due = self.next_due()
            if due is None or due > target + _EPS:
                break
            step = (due - self.now()) / self.speed
            if step > 0:
                self.clock.advance(step)
            self.tick()
            await asyncio.sleep(0)
        rest = (target - self.now()) / self.speed
        if rest > 0:
            self.clock.advance(rest)
        self.tick()
        await asyncio.sleep(0)

    async def run(self) -> None:
        """Run timers in real time (scaled by speed) until `stop()`."""
        while not self._stopped:
            if self.tick(limit=2000) >= 2000:
                await asyncio.sleep(0)  # keep the HTTP server responsive under bursts
                continue
            due = self.next_due()
            delay = 3600.0 if due is None else max(0.0, (due - self.now()) / self.speed)
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wakeup.wait()

    def stop(self) -> None:
        self._stopped = True
        self._wakeup.set()
