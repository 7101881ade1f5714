"""`NodeApi` over HTTP: the node agents talk to an API server as real node agents do.

Every call goes through the product's own `KubeClient` (its transport, auth, TLS and error
vocabulary), so the same kubelet, pod workers, DRA driver and checkpoint agent that write into
the in-process store (`node_api.StoreNodeApi`) register Nodes, renew Leases, publish
ResourceSlices and write pod status on a kube-apiserver: the simulated one served on loopback,
or a real one (`gpuhealth sim --control-plane real`).

- A read-modify-write (`mutate`) is a GET, the agent's function on it, and a PUT conditional on
  the resourceVersion read (retried on 409 Conflict, as client-go's RetryOnConflict does); a
  change-free result writes nothing, as in the store.
- The pods of each node are watched as a kubelet watches them: a list, then a watch from its
  resourceVersion, both with the field selector `spec.nodeName=<node>`; a 410 Gone lists again.
  Each node's watch runs in its own thread (the client is synchronous) and hands its events to
  the agents' event loop in order (`call_soon_threadsafe`).
- Errors come back as `simulator.apiserver.errors.ApiError` with the HTTP code the server sent
  (503 when no answer came), so the agents decide the same way on both adapters.

The calls block the agents' event loop for one round trip each: the price of the synchronous
client, paid only in this mode (small fleets; the store adapter is the fast path). The API
server must therefore not be served by that same event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import orjson

from gpuhealth.kube import errors as kube_errors
from gpuhealth.kube import resources as r
from gpuhealth.kube.backoff import Backoff
from gpuhealth.kube.client import ClientClosed, KubeClient
from gpuhealth.kube.watch import BOOKMARK
from simulator.apiserver.errors import ApiError
from simulator.fleet.node_api import PODS, Mutation, OnPod, OnRelist, PodEntry

log = logging.getLogger(__name__)

RESOURCES: Final[dict[str, r.Resource]] = {
    PODS: r.POD,
    "nodes": r.NODE,
    "namespaces": r.NAMESPACE,
    "serviceaccounts": r.Resource("", "v1", "serviceaccounts", namespaced=True),
    "events": r.Resource("", "v1", "events", namespaced=True),
    "leases.coordination.k8s.io": r.LEASE,
    "resourceslices.resource.k8s.io": r.RESOURCE_SLICE,
    "resourceclaims.resource.k8s.io": r.RESOURCE_CLAIM,
    "deviceclasses.resource.k8s.io": r.Resource("resource.k8s.io", "v1", "deviceclasses", namespaced=False),
    "runtimeclasses.node.k8s.io": r.Resource("node.k8s.io", "v1", "runtimeclasses", namespaced=False),
    "deployments.apps": r.Resource("apps", "v1", "deployments", namespaced=True),
}
"""The resources the node agents touch, by the store's names."""

CONFLICT_RETRIES = 5
"""Read-modify-write attempts before a 409 reaches the agent (client-go's default backoff has 5 steps)."""
WATCH_TIMEOUT_SECONDS = 300
"""How long the server keeps one watch open before the agent resumes it from its resourceVersion."""


@dataclass(frozen=True, slots=True)
class WatchBackoff:
    """How a node's pod watch retries after a failure (connection refused, a 5xx)."""

    initial_seconds: float = 0.5
    max_seconds: float = 10.0
    """A kubelet's watch retries within seconds: the API server is its only source of pods."""
    factor: float = 2.0
    jitter: float = 0.2


WATCH_BACKOFF: Final = WatchBackoff()


class HttpPodEntry:
    """A pod from a list or watch, shaped as the store's entries (`node_api.PodEntry`)."""

    __slots__ = ("data", "fields", "name", "namespace")

    def __init__(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.namespace: str = meta.get("namespace", "")
        self.name: str = meta.get("name", "")
        self.fields: dict[str, str] | None = {
            "spec.nodeName": (obj.get("spec") or {}).get("nodeName") or "",
            "status.phase": (obj.get("status") or {}).get("phase") or "",
        }
        self.data: bytes = orjson.dumps(obj)

    def load(self) -> dict[str, Any]:
        obj: dict[str, Any] = orjson.loads(self.data)
        return obj


@contextmanager
def _as_api_error(what: str) -> Iterator[None]:
    """The client's errors as the seam's: the HTTP code, the reason and message the server gave."""
    try:
        yield
    except kube_errors.ApiError as exc:
        raise ApiError(exc.status or 503, exc.reason, f"{what}: {exc.message}") from exc
    except ClientClosed as exc:
        raise ApiError(503, "ServiceUnavailable", f"{what}: {exc}") from exc


class HttpNodeApi:
    """The node agents' API over HTTP; `client` makes one `KubeClient` per use (writes, each node's watch)."""

    def __init__(self, client: Callable[[], KubeClient]) -> None:
        self._new_client = client
        self._client = client()
        self._watch_clients: list[KubeClient] = []
        self._lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self._done: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @staticmethod
    def _resource(name: str) -> r.Resource:
        try:
            return RESOURCES[name]
        except KeyError:
            raise ValueError(f"the node agents do not write {name!r} (known: {sorted(RESOURCES)})") from None

    def create(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        res = self._resource(resource)
        with _as_api_error(f"create {resource}"):
            return self._client.create(res, obj)

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        res = self._resource(resource)
        with _as_api_error(f"get {resource} {name}"):
            return self._client.get(res, name, namespace=namespace if res.namespaced else None)

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        res = self._resource(resource)
        with _as_api_error(f"list {resource}"):
            found = self._client.list(
                res,
                namespace=namespace if res.namespaced else None,
                label_selector=label_selector,
                field_selector=field_selector,
            )
        return list(found.items)

    def mutate(
        self,
        resource: str,
        name: str,
        namespace: str | None,
        fn: Mutation,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        res = self._resource(resource)
        ns = namespace if res.namespaced else None
        with _as_api_error(f"update {resource} {name}"):
            for attempt in range(CONFLICT_RETRIES):
                current = self._client.get(res, name, namespace=ns)
                before = orjson.dumps(current)
                result = fn(current)
                new = current if result is None else result
                if orjson.dumps(new) == before:
                    return new  # nothing changed: nothing to write
                try:
                    return self._client.update(res, new, subresource=subresource)
                except kube_errors.Conflict:
                    if attempt == CONFLICT_RETRIES - 1:
                        raise
        raise AssertionError("unreachable")  # pragma: no cover

    def delete(
        self, resource: str, name: str, namespace: str | None, *, grace_period_seconds: int | None = None
    ) -> None:
        res = self._resource(resource)
        with _as_api_error(f"delete {resource} {name}"):
            self._client.delete(
                res,
                name,
                namespace=namespace if res.namespaced else None,
                grace_period_seconds=grace_period_seconds,
            )

    # ------------------------------------------------------------------ the pods bound to the nodes

    async def follow_pods(
        self, nodes: Collection[str], on_pod: OnPod, on_relist: OnRelist, stopped: Callable[[], bool]
    ) -> None:
        """One list-then-watch per node, each in a thread, until `close()`."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._done = asyncio.Event()
        if self._closed:
            return
        threads = [
            threading.Thread(
                target=self._follow_node,
                args=(node, loop, on_pod, on_relist, stopped),
                name=f"gpuhealth-sim-kubelet-watch-{node}",
                daemon=True,
            )
            for node in sorted(nodes)
        ]
        for thread in threads:
            thread.start()
        try:
            await self._done.wait()
        finally:
            self._close_watches()
            for thread in threads:
                await asyncio.to_thread(thread.join, 10)

    def _follow_node(
        self,
        node: str,
        loop: asyncio.AbstractEventLoop,
        on_pod: OnPod,
        on_relist: OnRelist,
        stopped: Callable[[], bool],
    ) -> None:
        with self._lock:
            if self._closed:
                return
            client = self._new_client()
            self._watch_clients.append(client)
        selector = f"spec.nodeName={node}"
        backoff = Backoff(WATCH_BACKOFF)
        rv: str | None = None

        def hand(fn: Callable[..., None], *args: Any) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_guarded, fn, *args)

        while not self._closed and not stopped():
            try:
                if rv is None:
                    listed = client.list(r.POD, field_selector=selector)
                    entries: list[PodEntry] = [HttpPodEntry(o) for o in listed.items]
                    hand(on_relist, (node,), entries)
                    rv = listed.resource_version
                stream = client.watch(
                    r.POD, resource_version=rv, field_selector=selector, timeout_seconds=WATCH_TIMEOUT_SECONDS
                )
                with stream:
                    for event in stream:
                        if event.type != BOOKMARK:
                            hand(on_pod, event.type, HttpPodEntry(event.object))
                rv = stream.resource_version or rv
                backoff.reset()
            except kube_errors.Gone:
                rv = None  # the resourceVersion expired: list again
            except ClientClosed:
                return
            except (kube_errors.ApiError, ValueError) as exc:
                if self._closed:
                    return
                delay = backoff.next_delay()
                log.warning("kubelet of %s: pod watch failed (%s); again in %.1f s", node, exc, delay)
                if self._stop.wait(delay):
                    return

    def _close_watches(self) -> None:
        with self._lock:
            clients = list(self._watch_clients)
        for client in clients:
            client.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._stop.set()
        self._close_watches()
        self._client.close()
        if self._done is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._done.set)


def _guarded(fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # one bad pod must not stop the node's watch
        log.exception("kubelet: handling a pod event failed")
