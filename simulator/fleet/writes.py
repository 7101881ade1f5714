"""API writes more than one component makes: create-or-get, a status write, a pod status update.

Components write through a `NodeApi` (`node_api`: the in-process store, or HTTP), as the real
ones write through the API server. `PodStatusWriter` is shared by the kubelet (its status
syncs, a pod finishing) and the simulated node lifecycle controller (pods of an unreachable node
lose Ready): both find out the same way that a pod was deleted through the API before the watch
said so.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet.node_api import Mutation, NodeApi
from simulator.fleet.objects import KUBELET_CONDITIONS, gates_not_ready, others_conditions, per_container
from simulator.fleet.state import SimPod


def create_ignore_exists(api: NodeApi, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Create `obj` as given (its status too: one write), or get the existing one."""
    try:
        return api.create(resource, obj)
    except ApiError as exc:
        if exc.code != 409:
            raise
        return api.get(resource, obj["metadata"]["name"], obj["metadata"].get("namespace"))


def write_status(
    api: NodeApi, resource: str, name: str, namespace: str | None, status: dict[str, Any]
) -> None:
    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        obj["status"] = status
        return obj

    api.mutate(resource, name, namespace, fn, subresource="status")


def set_ready(obj: dict[str, Any], containers_ready: bool, ts: str) -> bool:
    """The pod's ContainersReady and Ready conditions as the kubelet computes them: Ready also
    needs every readiness gate's condition True (reason ReadinessGatesNotReady). True when
    either changed."""
    gated = gates_not_ready(obj) if containers_ready else None
    wanted = {
        "ContainersReady": "True" if containers_ready else "False",
        "Ready": "True" if containers_ready and gated is None else "False",
    }
    changed = False
    for cond in (obj.get("status") or {}).get("conditions", []):
        ctype = cond.get("type")
        if ctype not in wanted:
            continue
        if cond.get("status") != wanted[ctype]:
            cond["status"] = wanted[ctype]
            cond["lastTransitionTime"] = ts
            changed = True
        if ctype == "Ready" and gated is not None:
            changed = changed or cond.get("message") != gated
            cond.update(reason="ReadinessGatesNotReady", message=gated)
        elif ctype == "Ready" and cond.get("reason") == "ReadinessGatesNotReady":
            cond.pop("reason", None)
            cond.pop("message", None)
            changed = True
    return changed


def keep_others_conditions(obj: dict[str, Any], status: dict[str, Any], ts: str) -> dict[str, Any]:
    """`status` (the kubelet's whole write) with the conditions of others the pod holds (a
    readiness gate's) kept, and its Ready condition reading them."""
    own = [c for c in status["conditions"] if c.get("type") in KUBELET_CONDITIONS]
    status["conditions"] = own + others_conditions(obj)
    # The scheduler's record of a DRA-backed extended resource's claim (KEP-5004): not the kubelet's to drop.
    extended = (obj.get("status") or {}).get("extendedResourceClaimStatus")
    if extended and "extendedResourceClaimStatus" not in status:
        status["extendedResourceClaimStatus"] = extended
    set_ready({**obj, "status": status}, True, ts)
    return status


log = logging.getLogger(__name__)


class PodStatusWriter:
    """Writes to pods' status subresource; a pod found gone is passed to `gone(namespace, name)`."""

    def __init__(self, api: NodeApi, wall: Callable[[], float], gone: Callable[[str, str], None]) -> None:
        self._api = api
        self._wall = wall
        self._gone = gone

    def mutate(self, pod: SimPod, fn: Mutation) -> bool:
        """Apply `fn` to the pod's status; False when the pod is gone from the API."""
        try:
            self._api.mutate("pods", pod.name, pod.namespace, fn, subresource="status")
        except ApiError as exc:
            if exc.code == 404:  # deleted through the API before the watch told us
                self._gone(pod.namespace, pod.name)
                return False
            raise
        return True

    def gates_changed(self, pod: SimPod, obj: dict[str, Any]) -> None:
        """A readiness gate's condition changed (written by someone else): the kubelet reads it
        into the pod's Ready condition, as the real one's status manager does at its next sync."""
        ts = format_timestamp(self._wall())
        if not set_ready(copy.deepcopy(obj), True, ts):
            return

        def fn(current: dict[str, Any]) -> dict[str, Any]:
            set_ready(current, True, ts)
            return current

        try:
            self.mutate(pod, fn)
        except ApiError as exc:
            log.info("pod %s: Ready not updated from its readiness gates: %s", pod.key, exc)

    def update(self, ready: bool | None, allocated: list[dict[str, Any]] | None) -> Mutation:
        """One pod status write: readiness (when given) and allocatedResourcesStatus (when given)."""
        ts = format_timestamp(self._wall())

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            status = obj["status"]
            if ready is not None:
                set_ready(obj, ready, ts)
            containers = (obj.get("spec") or {}).get("containers") or []
            own = dict(
                zip(
                    (c.get("name") for c in containers),
                    per_container(containers, allocated or []),
                    strict=True,
                )
            )
            for cs in status.get("containerStatuses", []):
                if ready is not None:
                    cs["ready"] = ready
                # Only regular containers get allocatedResourcesStatus (init containers never
                # do), each its own: what it asks for.
                if allocated is not None:
                    if own.get(cs.get("name")):
                        cs["allocatedResourcesStatus"] = own[cs.get("name")]
                    else:
                        cs.pop("allocatedResourcesStatus", None)
            return obj

        return fn

    def set_ready(self, pod: SimPod, ready: bool) -> None:
        if self.mutate(pod, self.update(ready, None)):
            pod.ready = ready
