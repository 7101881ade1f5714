"""A live watch on the simulated apiserver's store: the events one watcher receives.

`Store.watch` builds a `Watch` with its replay (synthetic ADDED events for a fresh watch, or
the retained events newer than the requested resourceVersion) and registers it; every later
write of that resource is offered to it (`_offer`) and queued when it passes the watch's
namespace and selectors. With selectors, an object moving into or out of the selection is seen
as ADDED or DELETED, as the real watch cache translates it. The queue is bounded: a watcher
that falls that far behind is ended after what it already holds, and its client re-lists.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from simulator.apiserver.resources import ResourceInfo
from simulator.apiserver.selectors import FieldSelector, LabelSelector
from simulator.apiserver.stored import Entry, fields_match
from simulator.apiserver.watch_cache import LogEvent

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"


class Watch:
    """A live watch: an async iterator of (event type, object) pairs.

    Replayed events come first, then live ones from a bounded queue. `close()` stops it; a
    watcher whose queue overflows is ended after what it already holds.
    """

    def __init__(
        self,
        unregister: Callable[[Watch], None],
        info: ResourceInfo,
        namespace: str | None,
        label_selector: LabelSelector,
        field_selector: FieldSelector,
        min_rv: int,
        maxsize: int,
    ) -> None:
        """`unregister(watch)` stops the store offering it events (on close and on overflow)."""
        self._unregister = unregister
        self.info = info
        self._namespace = namespace
        self._labels = label_selector
        self._fields = field_selector
        self._min_rv = min_rv
        self._backlog: deque[tuple[str, Entry]] = deque()
        self._queue: asyncio.Queue[tuple[str, Entry] | None] = asyncio.Queue(maxsize=maxsize)
        self._stopped = False
        self._ended = False
        self.overflowed = False

    def _accepts(self, entry: Entry | None) -> bool:
        if entry is None:
            return False
        if self._namespace is not None and entry.namespace != self._namespace:
            return False
        if not self._labels.empty and not self._labels.matches(entry.labels or {}):
            return False
        return self._fields.empty or fields_match(self._fields, entry)

    def _translate(self, etype: str, new: Entry, old: Entry | None) -> tuple[str, Entry] | None:
        # With selectors, an object moving into or out of the selection is seen as ADDED or DELETED.
        if etype == ADDED:
            return (ADDED, new) if self._accepts(new) else None
        if etype == DELETED:
            return (DELETED, new) if self._accepts(new) else None
        now, before = self._accepts(new), self._accepts(old)
        if now and before:
            return MODIFIED, new
        if now:
            return ADDED, new
        if before:
            return DELETED, new
        return None

    def replay(self, events: list[tuple[str, Entry]]) -> None:
        """Events the watch delivers before any live one (already translated)."""
        self._backlog.extend(events)

    def replay_log(self, events: list[LogEvent]) -> None:
        """Retained store events to deliver first, translated through this watch's selection."""
        for event in events:
            item = self._translate(event[2], event[3], event[4])
            if item is not None:
                self._backlog.append(item)

    def _offer(self, event: LogEvent) -> None:
        if self._stopped or self._ended:
            return
        rv, _, etype, new, old = event
        if rv <= self._min_rv:
            return
        item = self._translate(etype, new, old)
        if item is None:
            return
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.overflowed = True
            self._ended = True
            self._unregister(self)

    def close(self) -> None:
        """Stop the watch now; pending events are dropped."""
        if self._stopped:
            return
        self._stopped = True
        self._backlog.clear()
        self._unregister(self)
        # On a full queue the consumer is not waiting; it sees _stopped on its next get.
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)

    def _end(self) -> None:
        """End after the events already queued (the resource went away)."""
        self._ended = True
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)

    @property
    def closed(self) -> bool:
        return self._stopped

    @property
    def backlog_rv(self) -> int:
        """The resourceVersion the replayed events bring a client up to; live events are newer."""
        return self._min_rv

    @property
    def in_backlog(self) -> bool:
        """Whether replayed events (synthetic ADDED or retained history) are still to come."""
        return bool(self._backlog)

    def pending(self) -> bool:
        """Whether an event is ready without waiting."""
        return bool(self._backlog) or not self._queue.empty()

    async def next_entry(self) -> tuple[str, Entry] | None:
        """The next (type, entry); None when the watch ended (wrap in `asyncio.timeout` to bound the wait)."""
        if self._stopped:
            return None
        if self._backlog:
            return self._backlog.popleft()
        if self._ended and self._queue.empty():
            return None
        item = await self._queue.get()
        if item is None or self._stopped:
            return None
        return item

    def __aiter__(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        while True:
            item = await self.next_entry()
            if item is None:
                return
            yield item[0], item[1].load()


__all__ = ["ADDED", "DELETED", "MODIFIED", "Watch"]
