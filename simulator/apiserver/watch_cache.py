"""The watch cache of the simulated apiserver: per resource, the recent events and what they allow.

Like the real apiserver's cacher, each resource keeps a bounded window of its own events: at
most `capacity_events` of them, none older than `max_age_seconds`. The window decides three
things the clients' relist paths depend on:

- a watch from resourceVersion R replays the retained events newer than R; when an event newer
  than R has already left the window (or R predates the cache itself, e.g. the server restarted)
  the answer is 410 Expired "too old resource version: R (F)", F being the oldest version still
  served;
- a list at an exact older resourceVersion (`resourceVersionMatch=Exact`, continued pages) is the
  current state with the newer events undone, available while the window covers R;
- nothing newer than the store's own resourceVersion exists: such a request is 504
  ResourceVersionTooLarge (`too_large`).

Pure data over `Entry` objects; the store owns the tables and calls in on every write.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.apiserver.errors import ApiError, expired

if TYPE_CHECKING:
    from simulator.apiserver.store import Entry

ADDED = "ADDED"

LogEvent = tuple[int, str, str, "Entry", "Entry | None"]
"""(resourceVersion, resource key, event type, entry after, entry before)."""


@dataclass(frozen=True)
class WatchCacheSettings:
    """How much history each resource's watch cache keeps."""

    capacity_events: int = 100 * 1024
    """Most events kept per resource: the real cacher's upper bound on its ring buffer."""
    max_age_seconds: float = 300.0
    """Events older than this (store clock, monotonic) leave the window. The real cacher keeps at
    least 75 s and, unless full, longer; 300 s is etcd's compaction interval, past which not even a
    real apiserver falling back to etcd could serve the version."""

    def __post_init__(self) -> None:
        if self.capacity_events < 1:
            raise ValueError("capacity_events must be at least 1")
        if not self.max_age_seconds > 0:
            raise ValueError("max_age_seconds must be positive")


def too_large(requested: int, current: int) -> ApiError:
    """504 for a resourceVersion the server has not reached, as the cacher words it (retry in 1 s)."""
    return ApiError(
        504,
        "Timeout",
        f"Too large resource version: {requested}, current: {current}",
        details={
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        },
    )


class WatchCache:
    """One resource's window of events, oldest first, with the version below which history is gone."""

    __slots__ = ("_events", "_times", "floor", "settings")

    def __init__(self, settings: WatchCacheSettings, floor: int) -> None:
        self.settings = settings
        self.floor = floor
        """Every event of this resource with a resourceVersion above `floor` is retained."""
        self._events: deque[LogEvent] = deque()
        self._times: deque[float] = deque()

    def __len__(self) -> int:
        return len(self._events)

    def append(self, event: LogEvent, now: float) -> None:
        self._events.append(event)
        self._times.append(now)
        while len(self._events) > self.settings.capacity_events:
            self._drop_oldest()
        self.expire(now)

    def expire(self, now: float) -> None:
        """Drop the events that have outlived the window's age."""
        horizon = now - self.settings.max_age_seconds
        while self._times and self._times[0] < horizon:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        self.floor = self._events.popleft()[0]
        self._times.popleft()

    def since(self, rv: int) -> list[LogEvent]:
        """The retained events newer than `rv`, oldest first; 410 Expired when some are gone."""
        if rv < self.floor:
            raise expired(f"too old resource version: {rv} ({self.floor})")
        out: list[LogEvent] = []
        for event in reversed(self._events):
            if event[0] <= rv:
                break
            out.append(event)
        out.reverse()
        return out


def state_at(table: dict[tuple[str, str], Entry], events: list[LogEvent]) -> dict[tuple[str, str], Entry]:
    """The table as it was before `events` (all of one resource, oldest first) were applied."""
    if not events:
        return table
    state = dict(table)
    for _, _, etype, new, old in reversed(events):
        key = (new.namespace, new.name)
        if etype == ADDED or old is None:
            state.pop(key, None)
        else:
            state[key] = old  # MODIFIED and DELETED both carry the entry they replaced
    return state


__all__ = ["LogEvent", "WatchCache", "WatchCacheSettings", "state_at", "too_large"]
