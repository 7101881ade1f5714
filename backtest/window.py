"""The window a backtest reads: its two ends as people write them, and its pages.

Pure: `now` is passed in. An end is `now`, a time before it (`-7d`, `-1h30m`: the one duration
grammar, `gpuhealth.durations`) or an RFC 3339 time with its offset (`2026-11-30T10:00:00Z`).
Prometheus refuses a range query of more than 11,000 points per series, so a long window is read
in pages of at most that many steps, each page starting one step after the previous one ends (no
evaluation is read twice, none is skipped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuhealth.durations import DurationError, parse_duration
from gpuhealth.kube.meta import parse_rfc3339

MAX_POINTS = 11_000
"""Prometheus' limit on the points of one series in one range query (`query_range`)."""


class WindowError(ValueError):
    """An end or a window that cannot be read; the message says what is accepted."""


def parse_time(text: str, *, now: float) -> float:
    """Unix seconds of `now`, `-DURATION` or an RFC 3339 time with an offset."""
    value = text.strip()
    if value == "now":
        return now
    if value.startswith("-"):
        try:
            return now - parse_duration(value[1:], bare_seconds=False)
        except DurationError as exc:
            raise WindowError(f"{text!r}: {exc}") from None
    parsed = parse_rfc3339(value)
    if parsed is None:
        raise WindowError(
            f"{text!r} is not a time: write now, a time before it (-7d, -1h30m) or RFC 3339 with "
            "its offset (2026-11-30T10:00:00Z)"
        )
    return parsed


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float
    step: float
    """Seconds between two points read (the rules' evaluation interval: one point per evaluation)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start) and math.isfinite(self.end)):
            raise WindowError("the window's ends must be finite times")
        if self.step <= 0:
            raise WindowError(f"the step must be above 0 s, not {self.step!r}")
        if self.end <= self.start:
            raise WindowError("--from must be before --to")

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def pages(self, max_points: int = MAX_POINTS) -> list[tuple[float, float]]:
        """(start, end) of each range query: at most `max_points` points each, on one grid."""
        if max_points < 1:
            raise WindowError(f"a page holds at least one point, not {max_points}")
        span = self.step * (max_points - 1)
        out = []
        page = 0
        while (at := self.start + page * max_points * self.step) <= self.end:
            out.append((at, min(at + span, self.end)))
            page += 1
        return out
