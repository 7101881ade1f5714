"""The controllers' view of the store: one in-process watch per resource, re-listed when it ends.

A controller hands `Informer` what to do with each event (`on_event`, cheap: usually marking a
key dirty) and what to do once the watch has nothing more ready (`on_idle`: the controller's
sync of its dirty keys), so a burst of writes costs one sync, not one per event. Controllers
read the store itself when they sync (the store is the cache: every write is visible at once),
so there are no stale caches and no expectations to keep, unlike the real informers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.apiserver.store import Entry, Store, Watch

log = logging.getLogger(__name__)

OnEvent = Callable[[str, "Entry"], None]


class Informer:
    """Follows `resource` in `store` until `close()`: synthetic ADDED for what exists, then live events."""

    def __init__(
        self, store: Store, resource: str, on_event: OnEvent, on_idle: Callable[[], None] | None = None
    ) -> None:
        self._store = store
        self.resource = resource
        self._on_event = on_event
        self._on_idle = on_idle
        self._watch: Watch | None = None
        self._closed = False

    async def run(self) -> None:
        while not self._closed:
            # A fresh watch replays the current objects as ADDED: handlers are idempotent, so a
            # watch that fell behind and was ended simply starts over from a full view.
            watch = self._store.watch(self.resource)
            self._watch = watch
            try:
                while not self._closed:
                    item = await watch.next_entry()
                    if item is None:
                        break
                    try:
                        self._on_event(*item)
                        if not watch.pending() and self._on_idle is not None:
                            self._on_idle()
                    except Exception:  # one bad object must not stop the controller
                        log.exception("controller failed on %s", self.resource)
            finally:
                watch.close()
                self._watch = None

    def close(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.close()
