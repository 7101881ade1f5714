"""NVSentinel's janitor, its GPU reset part: serves `GPUReset` requests on the simulated cluster.

What the janitor installs and does, as far as a requester sees it: the `GPUReset` CRD
(`janitor.dgxc.nvidia.com/v1alpha1`, cluster-scoped, `spec.nodeName`, `spec.selector.uuids`,
a status subresource), and for each request: `status.phase` InProgress with `startTime` and the
condition `Ready` True at once; after `reset_seconds` simulated seconds (the real one stops the
node's GPU services, runs a reset Job on the node and starts them again) the condition
`Complete` True, `completionTime`, and the outcome in the condition's reason and the phase:
`GPUResetSucceeded` / Succeeded, or a failure reason / Failed (`NodeNotFound` for a node that is
not there, `ResetJobFailed` for a card a reset cannot fix). The janitor marks a failed reset
Complete too: `Complete` means done, not succeeded.

A reset clears what a reset clears (`Gpu.needs_reset`: a sticky fatal XID's state, set by a
`device-unhealthy` fault with `reset: clears`) and nothing else: a card whose fault no reset
mends (`reset: fails`, a hardware fault) fails its reset and stays as it is. The scenario's
`janitor.resetSeconds` installs it (`Scenario.janitor`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet.events import Emit, GpuReset
from simulator.fleet.informer import Informer
from simulator.fleet.state import SimNode
from simulator.fleet.timers import Timers

if TYPE_CHECKING:
    from simulator.apiserver.store import Entry, Store

GROUP = "janitor.dgxc.nvidia.com"
RESOURCE = f"gpuresets.{GROUP}"
CRDS = "customresourcedefinitions.apiextensions.k8s.io"
SUCCEEDED = "GPUResetSucceeded"


def gpureset_crd() -> dict[str, Any]:
    """The CRD as the janitor's chart installs it (the fields a requester writes and reads)."""
    uuid = {
        "type": "string",
        "pattern": "^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    }
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["nodeName"],
                "properties": {
                    "nodeName": {"type": "string", "minLength": 1},
                    "selector": {
                        "type": "object",
                        "properties": {
                            "uuids": {"type": "array", "items": uuid},
                            "pciBusIDs": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                },
            },
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": RESOURCE},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "plural": "gpuresets",
                "singular": "gpureset",
                "kind": "GPUReset",
                "listKind": "GPUResetList",
            },
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


class Janitor:
    """Resets the simulated GPUs a `GPUReset` names, on the fleet's nodes."""

    def __init__(
        self, store: Store, timers: Timers, nodes: Mapping[str, SimNode], reset_seconds: float, emit: Emit
    ) -> None:
        self._store = store
        self._timers = timers
        self._nodes = nodes
        self._emit = emit
        self.reset_seconds = reset_seconds
        self._started: set[str] = set()
        self.resets: list[tuple[str, str, bool]] = []
        """(request, node, succeeded) of every reset finished, in order."""
        with contextlib.suppress(ApiError):  # installed already (a restarted control plane)
            store.create(CRDS, gpureset_crd())
        self.informers = [Informer(store, RESOURCE, self._event)]

    def close(self) -> None:
        for informer in self.informers:
            informer.close()

    def _event(self, etype: str, entry: Entry) -> None:
        if etype == "DELETED" or entry.name in self._started:
            return
        self._started.add(entry.name)
        ts = format_timestamp(self._timers.wall())

        def start(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            if status.get("startTime"):
                return
            status.update(
                phase="InProgress",
                startTime=ts,
                conditions=[_condition("Ready", "True", "ReadyForReset", "Node ready for GPU reset", ts)],
            )

        try:
            obj = self._store.mutate(RESOURCE, entry.name, None, start, subresource="status")
        except ApiError:
            return
        self._report(obj, "started")
        self._timers.at(self._timers.now() + self.reset_seconds, self._finish, entry.name)

    def _finish(self, name: str) -> None:
        try:
            obj = self._store.get(RESOURCE, name)
        except ApiError:
            return  # deleted while it ran
        spec = obj.get("spec") or {}
        node = self._nodes.get(str(spec.get("nodeName") or ""))
        uuids = set((spec.get("selector") or {}).get("uuids") or ())
        if node is None:
            reason, message = "NodeNotFound", "Target node for GPU reset was not found"
        else:
            gpus = [g for g in node.gpus if not uuids or g.uuid in uuids]
            if any(g.reset_fails for g in gpus) or (uuids and len(gpus) < len(uuids)):
                reason, message = "ResetJobFailed", "GPU reset job failed"
            else:
                for gpu in gpus:
                    gpu.needs_reset = False
                reason, message = SUCCEEDED, "GPU reset completed successfully"
        ts = format_timestamp(self._timers.wall())
        succeeded = reason == SUCCEEDED

        def complete(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            conditions = [c for c in status.get("conditions") or () if c.get("type") != "Complete"]
            status.update(
                phase="Succeeded" if succeeded else "Failed",
                completionTime=ts,
                conditions=[*conditions, _condition("Complete", "True", reason, message, ts)],
            )

        with contextlib.suppress(ApiError):
            self._store.mutate(RESOURCE, name, None, complete, subresource="status")
            self.resets.append((name, str(spec.get("nodeName") or ""), succeeded))
            self._report(obj, "succeeded" if succeeded else "failed", reason)

    def _report(self, obj: dict[str, Any], what: str, reason: str = "") -> None:
        spec = obj.get("spec") or {}
        uuids = tuple(str(u) for u in (spec.get("selector") or {}).get("uuids") or ())
        node, name = str(spec.get("nodeName") or ""), str((obj.get("metadata") or {}).get("name") or "")
        self._emit(GpuReset(self._timers.now(), self._timers.wall(), node, uuids, name, what, reason))


def _condition(ctype: str, status: str, reason: str, message: str, ts: str) -> dict[str, Any]:
    return {"type": ctype, "status": status, "lastTransitionTime": ts, "reason": reason, "message": message}
