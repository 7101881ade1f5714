"""The namespace controller: a namespace being deleted is emptied, then removed.

Deleting a namespace (while this controller runs, `Store.finalizing_controllers`) gives it a
deletionTimestamp and `status.phase: Terminating`, keeping the `kubernetes` finalizer in
`spec.finalizers`; creating anything in it is then 403 Forbidden and re-creating it 409
AlreadyExists (both the store's). This controller deletes every object of every namespaced
resource in it (in the background: the garbage collector and the objects' own finalizers take
their course), reports what remains in the status conditions (NamespaceContentRemaining,
NamespaceFinalizersRemaining, as the real controller words them), retries every
`retry_seconds` simulated seconds while something remains, and then removes the finalizer,
which removes the namespace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.propagation import NAMESPACE_FINALIZER
from simulator.apiserver.store import format_timestamp
from simulator.fleet.informer import Informer
from simulator.fleet.timers import Timers

if TYPE_CHECKING:
    from simulator.apiserver.store import Entry, Store


def _condition(ctype: str, status: str, reason: str, message: str, ts: str) -> dict[str, Any]:
    return {"type": ctype, "status": status, "lastTransitionTime": ts, "reason": reason, "message": message}


class NamespaceController:
    """Empties and removes namespaces that are Terminating."""

    def __init__(self, store: Store, timers: Timers, *, retry_seconds: float = 2.0) -> None:
        self._store = store
        self._timers = timers
        self.retry_seconds = retry_seconds
        self._dirty: set[str] = set()
        self._retrying: set[str] = set()
        self.informers = [Informer(store, "namespaces", self._event, self.sync)]

    def _event(self, etype: str, entry: Entry) -> None:
        if etype != "DELETED" and b'"phase":"Terminating"' in entry.data:
            self._dirty.add(entry.name)

    def close(self) -> None:
        for informer in self.informers:
            informer.close()

    def sync(self) -> None:
        while self._dirty:
            self.sync_one(self._dirty.pop())

    def _retry(self, name: str) -> None:
        self._retrying.discard(name)
        self._dirty.add(name)
        self.sync()

    def sync_one(self, name: str) -> None:
        try:
            namespace = self._store.get("namespaces", name)
        except ApiError:
            return
        if not namespace["metadata"].get("deletionTimestamp"):
            return
        remaining: dict[str, int] = {}
        finalizing: dict[str, int] = {}
        for info in self._store.registry.all():
            if not info.namespaced:
                continue
            entries, _ = self._store.list_entries(info.key, name)
            for entry in entries:
                try:
                    obj = self._store.delete(info.key, entry.name, name, policy="Background")
                except ApiError as exc:
                    if exc.code == 404:
                        continue
                    raise
                if obj["metadata"].get("finalizers"):
                    remaining[info.key] = remaining.get(info.key, 0) + 1
                    for finalizer in obj["metadata"]["finalizers"]:
                        finalizing[finalizer] = finalizing.get(finalizer, 0) + 1
        if remaining:
            self._write_conditions(name, remaining, finalizing)
            if name not in self._retrying:
                self._retrying.add(name)
                self._timers.at(self._timers.now() + self.retry_seconds, self._retry, name)
            return

        def finalize(obj: dict[str, Any]) -> None:
            obj["spec"]["finalizers"] = [
                f for f in obj["spec"].get("finalizers") or () if f != NAMESPACE_FINALIZER
            ]

        self._store.mutate("namespaces", name, None, finalize)

    def _write_conditions(self, name: str, remaining: dict[str, int], finalizing: dict[str, int]) -> None:
        ts = format_timestamp(self._timers.wall())
        content = ", ".join(f"{key} has {n} resource instances" for key, n in sorted(remaining.items()))
        held = ", ".join(f"{f} in {n} resource instances" for f, n in sorted(finalizing.items()))
        conditions = [
            _condition(ctype, status, reason, message, ts)
            for ctype, status, reason, message in (
                ("NamespaceDeletionDiscoveryFailure", "False", "ResourcesDiscovered",
                 "All resources successfully discovered"),
                ("NamespaceDeletionGroupVersionParsingFailure", "False", "ParsedGroupVersions",
                 "All legacy kube types successfully parsed"),
                ("NamespaceDeletionContentFailure", "False", "ContentDeleted",
                 "All content successfully deleted, may be waiting on finalization"),
                ("NamespaceContentRemaining", "True", "SomeResourcesRemain",
                 f"Some resources are remaining: {content}"),
                ("NamespaceFinalizersRemaining", "True", "SomeFinalizersRemain",
                 f"Some content in the namespace has finalizers remaining: {held}"),
            )
        ]  # fmt: skip

        def apply(obj: dict[str, Any]) -> None:
            old = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or ()}
            for cond in conditions:
                prev = old.get(cond["type"])
                if prev is not None and prev.get("status") == cond["status"]:
                    cond["lastTransitionTime"] = prev.get("lastTransitionTime", ts)
            obj["status"]["conditions"] = conditions

        self._store.mutate("namespaces", name, None, apply, subresource="status")
