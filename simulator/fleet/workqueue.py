"""The keys a controller must sync, and the owner-keyed marking every workload controller shares.

Fed by `informer.Informer` handlers, drained by the controller's sync.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from simulator.apiserver.errors import ApiError
from simulator.fleet.workloads import controller_ref

if TYPE_CHECKING:
    from simulator.apiserver.store import Entry

OnEvent = Callable[[str, "Entry"], None]


Key = tuple[str, str]
"""(namespace, name) of an object a controller syncs."""


class WorkQueue:
    """The keys a controller must sync, filled by its informers' handlers and drained by `sync`.

    The shape every owner-keyed controller shares (Deployments, StatefulSets, Jobs): an event of
    its own kind marks that object; an event of a dependent marks the dependent's controller
    (its ownerReference with `controller: true`) when that is of the controller's kind. A key
    whose object is gone by the time it syncs (404) is skipped: there is nothing left to sync.
    """

    def __init__(self, sync_one: Callable[[str, str], None]) -> None:
        self._sync_one = sync_one
        self._dirty: set[Key] = set()

    def add(self, key: Key) -> None:
        self._dirty.add(key)

    def own(self, etype: str, entry: Entry) -> None:
        """Handler for the controller's own resource."""
        if etype != "DELETED":
            self._dirty.add((entry.namespace, entry.name))

    def owned_by(self, kind: str) -> OnEvent:
        """Handler for dependents: marks their controlling owner when it is a `kind`."""
        marker = f'"kind":"{kind}"'.encode()

        def handle(_etype: str, entry: Entry) -> None:
            if marker not in entry.data:  # cheap: most events are of other owners' dependents
                return
            ref = controller_ref(entry.load())
            if ref is not None and ref.get("kind") == kind:
                self._dirty.add((entry.namespace, str(ref.get("name"))))

        return handle

    def sync(self) -> None:
        while self._dirty:
            namespace, name = self._dirty.pop()
            try:
                self._sync_one(namespace, name)
            except ApiError as exc:
                if exc.code != 404:
                    raise
