"""The node lifecycle controller: a node whose Lease is not renewed becomes Ready=Unknown.

After `node_monitor_grace_period` without a renewal it sets the node's Ready condition to
Unknown, adds the `node.kubernetes.io/unreachable` NoSchedule and NoExecute taints and marks
the node's running pods not Ready. When the kubelet is back, Ready=True lifts the taints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator.apiserver.store import format_timestamp
from simulator.fleet import objects
from simulator.fleet.events import Emit, NodeChanged
from simulator.fleet.state import SimNode
from simulator.fleet.timers import Timers
from simulator.fleet.writes import PodStatusWriter
from simulator.model import Settings

if TYPE_CHECKING:
    from simulator.apiserver.store import Store

_UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"


class NodeLifecycleController:
    """Part of kube-controller-manager. Owns `SimNode.ready` and the node's unreachable taints."""

    def __init__(
        self, store: Store, settings: Settings, timers: Timers, pod_status: PodStatusWriter, emit: Emit
    ) -> None:
        self._store = store
        self._grace = settings.node_monitor_grace_period
        self._timers = timers
        self._pod_status = pod_status
        self._emit = emit

    def monitor(self, node: SimNode) -> None:
        """No Lease renewal within the grace period -> Ready Unknown."""
        now = self._timers.now()
        if node.ready != "True" or now - node.renewed_at < self._grace:
            return
        self.write_ready(node, "Unknown")
        for pod in node.pods:
            if not pod.terminated:
                self._pod_status.set_ready(pod, False)
        self._emit(NodeChanged(now, self._timers.wall(), node.name, "Ready=Unknown (lease not renewed)"))

    def write_ready(self, node: SimNode, status: str) -> None:
        """The node's Ready condition, and the unreachable taints (NoSchedule, NoExecute) unless True."""
        node.ready = status
        ts = format_timestamp(self._timers.wall())

        def condition(obj: dict[str, Any]) -> dict[str, Any]:
            conds = [c for c in obj["status"].get("conditions", []) if c.get("type") != "Ready"]
            conds.append(objects.ready_condition(status, ts))
            obj["status"]["conditions"] = conds
            return obj

        def taints(obj: dict[str, Any]) -> dict[str, Any]:
            kept = [t for t in obj["spec"].get("taints", []) if t.get("key") != _UNREACHABLE_TAINT]
            if status != "True":
                kept += [
                    {"key": _UNREACHABLE_TAINT, "effect": effect, "timeAdded": ts}
                    for effect in ("NoSchedule", "NoExecute")
                ]
            obj["spec"]["taints"] = kept
            return obj

        self._store.mutate("nodes", node.name, None, condition, subresource="status")
        self._store.mutate("nodes", node.name, None, taints)
