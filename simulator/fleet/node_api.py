"""The seam between the node agents and the API server: one narrow interface, two adapters.

The node agents (kubelet, pod workers, DRA driver, checkpoint agent) reach the API only through
`NodeApi`: create, get, read-modify-write, delete, and a watch of the pods bound to their nodes
(and a list, for the person at the keyboard the timeline plays, `simulator.fleet.person`).
The same agent code runs against two control planes:

- `StoreNodeApi` (here): the in-process `Store` of the simulated control plane, called
  directly, no HTTP and no serialisation: the fast path every scenario and `make demo` use;
- `HttpNodeApi` (`node_api_http`): HTTP through the product's own `KubeClient`, as real node
  agents talk to a kube-apiserver: the simulated one served on loopback, or a real one.

Resources are named as the store names them (`pods`, `leases.coordination.k8s.io`); every
failure is a `simulator.apiserver.errors.ApiError` with the HTTP code, whichever adapter answered,
so an agent decides on `exc.code` (404: the object is gone, 409: it exists) the same way for both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from simulator.apiserver.store import Store, Watch

Mutation = Callable[[dict[str, Any]], dict[str, Any] | None]
"""Gets a private copy of the object; returns the new object (or changes the copy and returns None)."""

PODS = "pods"


class PodEntry(Protocol):
    """A pod as a watch delivers it: its key and index fields at once, the object on `load()`.

    `data` is the object's JSON, so a reader can look for a word (`deletionTimestamp`) before
    paying for a parse. `fields` holds at least `spec.nodeName` and `status.phase` when known.
    """

    namespace: str
    name: str
    fields: dict[str, str] | None
    data: bytes

    def load(self) -> dict[str, Any]: ...


OnPod = Callable[[str, PodEntry], None]
"""(event type, pod) of a pod added, modified or deleted."""
OnRelist = Callable[[Collection[str] | None, list[PodEntry]], None]
"""(nodes, pods): every pod bound to those nodes (None: every pod), listed again after a watch ended."""


class NodeApi(Protocol):
    """What the node agents do with the API server."""

    def create(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create `obj` as given, status included (an agent's own object); 409 when it exists."""
        ...

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any]: ...

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """The matching objects (a person's `kubectl get -l`, `simulator.fleet.person`)."""
        ...

    def mutate(
        self,
        resource: str,
        name: str,
        namespace: str | None,
        fn: Mutation,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Read, apply `fn`, write back (only `.status` with subresource="status"); 404 when gone."""
        ...

    def delete(
        self, resource: str, name: str, namespace: str | None, *, grace_period_seconds: int | None = None
    ) -> None: ...

    async def follow_pods(
        self, nodes: Collection[str], on_pod: OnPod, on_relist: OnRelist, stopped: Callable[[], bool]
    ) -> None:
        """Watch the pods bound to `nodes` until `stopped()` or `close()`; relist when a watch ends."""
        ...

    def close(self) -> None:
        """End the watches (the agents stop)."""
        ...


class StoreNodeApi:
    """`NodeApi` over the in-process store: direct calls, objects stored as the agents give them."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._watch: Watch | None = None
        self._closed = False
        # The store's own methods, bound: the 10,000-node fleet's ~1,000 writes a second pay no
        # extra call for the seam (its signatures are the seam's, plus options the agents leave).
        self.get = store.get
        self.mutate = store.mutate

    def create(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        namespace = obj["metadata"].get("namespace")
        return self._store.create(resource, obj, namespace=namespace, validate=False)

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        items, _ = self._store.list(
            resource, namespace, label_selector=label_selector, field_selector=field_selector
        )
        return items

    def delete(
        self, resource: str, name: str, namespace: str | None, *, grace_period_seconds: int | None = None
    ) -> None:
        self._store.delete(resource, name, namespace, grace_period_seconds=grace_period_seconds)

    async def follow_pods(
        self, nodes: Collection[str], on_pod: OnPod, on_relist: OnRelist, stopped: Callable[[], bool]
    ) -> None:
        """One watch of every pod, its entries left unparsed: 10,000 nodes cost one watch, not 10,000.

        The agents look at `spec.nodeName` themselves (`nodes` is not consulted), and the
        simulated control plane's own pods (pending replacements) reach it the same way.
        """
        while not stopped() and not self._closed:
            watch = self._store.watch(PODS, resource_version=str(self._store.resource_version))
            self._watch = watch
            try:
                while True:
                    item = await watch.next_entry()
                    if item is None:
                        break
                    on_pod(*item)
            finally:
                watch.close()
                self._watch = None
            if not stopped() and not self._closed:
                entries, _ = self._store.list_entries(PODS)  # the watch fell behind and was ended
                on_relist(None, list(entries))
            await asyncio.sleep(0)

    def close(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.close()
