"""Events as the controllers emit them (`core/v1` Events), through one helper any component can use.

`EventRecorder.emit(obj, type, reason, message)` writes an Event about `obj` from `component`
(`replicaset-controller`, `deployment-controller`, `job-controller`, `taint-eviction-controller`,
...): involvedObject, reason, message, type, source, first/last timestamps and count. A repeat
of the same (object, reason, message) within the series raises `count` on the existing Event,
as the real recorder aggregates. Where Events are not served (another part of the simulator
registers them), emitting is a no-op: events are advisory and never fail a controller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp

if TYPE_CHECKING:
    from simulator.apiserver.store import Store

EVENTS = "events"
NORMAL = "Normal"
WARNING = "Warning"


def involved(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    ref = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
    }
    return {k: v for k, v in ref.items() if v}


class EventRecorder:
    """Writes Events for one component; `wall()` gives the timestamps."""

    def __init__(self, store: Store, component: str, wall: Callable[[], float], instance: str = "") -> None:
        """`instance`: the Events' reportingInstance (which replica of the component wrote them)."""
        self._store = store
        self.component = component
        self.instance = instance
        self._wall = wall
        self._seq = 0
        self._recent: dict[tuple[str, str, str, str, str], str] = {}
        """(namespace, object uid, reason, message, type) -> the Event's name, for aggregation."""

    def emit(
        self, obj: dict[str, Any], etype: str, reason: str, message: str, action: str = ""
    ) -> str | None:
        """Write (or count up) the Event; its name, None when none was written. `action`: what
        the component did or failed to do (`Binding`, `Scheduling`), when it says."""
        try:
            self._store.registry.get(EVENTS)
        except ApiError:
            return None
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        now = self._wall()
        ts = format_timestamp(now)
        key = (namespace, str(meta.get("uid")), reason, message, etype)
        existing = self._recent.get(key)
        if existing is not None:

            def bump(ev: dict[str, Any]) -> None:
                ev["count"] = int(ev.get("count") or 1) + 1
                ev["lastTimestamp"] = ts

            with contextlib.suppress(ApiError):
                self._store.mutate(EVENTS, existing, namespace, bump)
                return existing
        self._seq += 1
        # The real recorder names an Event `<object>.<hex nanoseconds>`; the sequence keeps two
        # Events of one simulated instant apart.
        name = f"{meta.get('name')}.{int(now * 1e9) + self._seq:x}"
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved(obj),
            "reason": reason,
            "message": message,
            "type": etype,
            "source": {"component": self.component},
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
        }
        if action:
            event["action"] = action
        try:
            self._store.create(EVENTS, event, namespace=namespace, validate=False)
        except ApiError:
            return None
        self._recent[key] = name
        if len(self._recent) > 4096:  # bounded: aggregation is a courtesy, not a record
            self._recent.pop(next(iter(self._recent)))
        return name
