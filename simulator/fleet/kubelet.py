"""The kubelets of the simulated nodes: registration, Lease renewal and pod status.

A kubelet registers its Node (capacity from its device plugin) and Lease, renews the Lease,
and syncs the status of its pods: `allocatedResourcesStatus` from what the device plugin or
DRA driver says of each allocated device (`DeviceDriver.health`), readiness, a finished Job
pod's Succeeded phase. A health change pushed over a driver's stream is synced promptly;
the periodic sync is where a DRA report older than the timeout becomes Unknown. On
device-plugin nodes it lowers the node's allocatable `nvidia.com/gpu` by the devices not
Healthy. A stopped or partitioned kubelet writes nothing. Running pods that arrive through
the API and stopping deleted pods are its pod workers' part (`pod_runner`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet import objects
from simulator.fleet.events import DeviceHealthChanged, Emit
from simulator.fleet.health import HEALTHY
from simulator.fleet.node_api import NodeApi
from simulator.fleet.state import DeviceDriver, Rows, SimNode, SimPod
from simulator.fleet.timers import Timers
from simulator.fleet.writes import PodStatusWriter, create_ignore_exists
from simulator.model import Settings

_LEASES = "leases.coordination.k8s.io"


class Kubelet:
    """The kubelet of every simulated node (one object, so 10,000 nodes cost no more than their state).

    Owns the per-node kubelet fields of `SimNode` (run state, Lease renewal, sync bookkeeping)
    and `SimPod.written`/`ready`/`terminated`; removes pods that left the node from `pods`.
    """

    def __init__(
        self,
        api: NodeApi,
        settings: Settings,
        timers: Timers,
        nodes: Mapping[str, SimNode],
        pods: dict[str, SimPod],
        drivers: Mapping[str, DeviceDriver],
        pod_status: PodStatusWriter,
        emit: Emit,
        pod_finished: Callable[[SimPod], None],
        synced: Callable[[SimNode], None] | None = None,
    ) -> None:
        self._api = api
        self._settings = settings
        self._timers = timers
        self._nodes = nodes
        self._pods = pods
        self._drivers = drivers
        self._pod_status = pod_status
        self._emit = emit
        self._pod_finished = pod_finished
        self._synced = synced
        """Called at each status sync of a writing node: the pod runner's work owed to the node."""

    # ------------------------------------------------------------------ node registration and Lease

    def register(self, node: SimNode, wall: float) -> None:
        """Create the Node (with its status: one write) and the node's Lease."""
        create_ignore_exists(self._api, "nodes", objects.node(node.name, node.index, node.group, wall))
        if not node.is_dra:
            node.allocatable_written = node.group.gpus_per_node
        create_ignore_exists(
            self._api, _LEASES, objects.lease(node.name, wall, self._settings.lease_duration_seconds)
        )
        node.renewed_at = self._timers.now()

    def renew(self, node: SimNode) -> None:
        wall = objects.micro_time(self._timers.wall())

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            obj["spec"]["renewTime"] = wall
            obj["spec"]["holderIdentity"] = node.name
            return obj

        try:
            self._api.mutate(_LEASES, node.name, "kube-node-lease", fn)
        except ApiError as exc:
            if exc.code != 404:
                raise
            # Someone deleted the Lease: the kubelet creates it again, as a real one does.
            lease = objects.lease(node.name, self._timers.wall(), self._settings.lease_duration_seconds)
            self._api.create(_LEASES, lease)
        node.renewed_at = self._timers.now()

    def post_ready(self, node: SimNode) -> None:
        """The kubelet posts its node status again (it was stopped or cut off): Ready=True, now.

        What brings a node back under a real node lifecycle controller, which only ever sets
        Ready to Unknown; the simulated one writes Ready=True itself (`node_lifecycle`).
        """
        ts = format_timestamp(self._timers.wall())

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            kept = [c for c in obj["status"].get("conditions", []) if c.get("type") != "Ready"]
            obj["status"]["conditions"] = [*kept, objects.ready_condition("True", ts)]
            return obj

        self._api.mutate("nodes", node.name, None, fn, subresource="status")

    # ------------------------------------------------------------------ pod status

    def admit(
        self,
        pod: SimPod,
        node: SimNode,
        pod_obj: dict[str, Any],
        claim_statuses: list[dict[str, Any]] | None,
        wall: float,
    ) -> dict[str, Any]:
        """The first status of a pod that starts on `node` (running, its devices' health rendered).

        What it renders becomes `pod.written`: later syncs write only what differs from it.
        """
        rows = self._render(pod, node, self._timers.now())
        pod.written = rows
        return objects.pod_status(
            pod_obj=pod_obj,
            node_index=node.index,
            pod_index=pod.index,
            started=wall,
            ready=True,
            allocated=self._allocated_status(pod, rows),
            claim_statuses=claim_statuses,
        )

    def allocated(self, pod: SimPod, node: SimNode) -> list[dict[str, Any]]:
        """allocatedResourcesStatus of a pod starting now; what it renders becomes `pod.written`."""
        rows = self._render(pod, node, self._timers.now())
        pod.written = rows
        return self._allocated_status(pod, rows)

    def _render(self, pod: SimPod, node: SimNode, now: float) -> Rows:
        driver = self._drivers[node.group.path]
        rows = []
        for slot in pod.slots:
            gpu = node.gpus[slot.gpu]
            health, message = driver.health(node, gpu, now)
            rows.append((driver.resource_id(node, pod, gpu, slot), health, message))
        return tuple(rows)

    def _allocated_status(self, pod: SimPod, rows: Rows) -> list[dict[str, Any]]:
        if not rows or pod.extended:
            return []
        if not self._nodes[pod.node].group.resource_health_status:
            return []  # an older kubelet (or the feature gate off) names no pod's devices
        if pod.resource_name is not None:
            name = pod.resource_name
        elif pod.claim_name is None:
            name = pod.workload.resource
        else:
            name = objects.allocated_resource_name(objects.claim_reference(pod.workload))
        resources = []
        for resource_id, health, message in rows:
            entry = {"resourceID": resource_id, "health": health}
            if message:
                entry["message"] = message
            resources.append(entry)
        return [{"name": name, "resources": resources}]

    def sync_tick(self, node: SimNode) -> None:
        """The periodic status sync of one node's kubelet."""
        self._timers.at(self._timers.now() + self._settings.status_sync_interval, self.sync_tick, node)
        self.sync_node(node)

    def push(self, node: SimNode, *, resync: bool = False) -> None:
        """A health change pushed by the plugin/driver stream: the kubelet syncs the node's pods promptly.

        `resync`: look at every pod again even if the device views did not change (a pod
        came or went, a device came back from silence).
        """
        if resync:
            node.last_sig = None
        if node.writes and not node.sync_pending:
            node.sync_pending = True
            self._timers.at(self._timers.now(), self._pushed_sync, node)
            self._timers.wake()

    def _pushed_sync(self, node: SimNode) -> None:
        node.sync_pending = False
        self.sync_node(node)

    def resync(self, node: SimNode) -> None:
        """Sync the node's pods now, every pod looked at again (the kubelet came back)."""
        node.last_sig = None
        self.sync_node(node)

    def sync_node(self, node: SimNode) -> None:
        """The kubelet's status sync: evaluate device health now, write what changed."""
        if not node.writes:
            return
        if self._synced is not None:
            self._synced(node)
        now = self._timers.now()
        driver = self._drivers[node.group.path]
        views = [driver.health(node, g, now) for g in node.gpus]
        if not node.is_dra:
            healthy = sum(1 for h, _ in views if h == HEALTHY)
            if healthy != node.allocatable_written:
                self._write_allocatable(node, healthy)
        sig = (tuple(views), len(node.pods))
        if sig == node.last_sig and all(p.ready or p.terminated or p.waiting for p in node.pods):
            return
        changes: dict[int, tuple[str, str, str | None, list[str]]] = {}
        for pod in list(node.pods):
            if pod.terminated or pod.stopped:
                continue  # the kubelet stops updating pods that finished
            rows = self._render(pod, node, now)
            if pod.waiting:
                continue  # no container running: nothing to report yet (the runner writes at start)
            if rows == pod.written and pod.ready:
                continue
            # A DRA-backed extended resource's pod gets no allocatedResourcesStatus (kubernetes#139939):
            # its devices' health changes and nothing of it reaches the pod's status.
            allocated = (
                self._allocated_status(pod, rows) if rows != pod.written and not pod.extended else None
            )
            if allocated is not None or not pod.ready:
                update = self._pod_status.update(None if pod.ready else True, allocated)
                if not self._pod_status.mutate(pod, update):
                    continue
            pod.ready = True
            for slot, before, after in zip(pod.slots, pod.written, rows, strict=False):
                if before[1] != after[1]:
                    entry = changes.setdefault(slot.gpu, (before[1], after[1], after[2], []))
                    entry[3].append(pod.key)
            pod.written = rows
        node.last_sig = sig
        wall = self._timers.wall()
        for gpu_index, (old, new, message, pods) in sorted(changes.items()):
            self._emit(
                DeviceHealthChanged(now, wall, node.name, f"gpu-{gpu_index}", old, new, tuple(pods), message)
            )

    def _write_allocatable(self, node: SimNode, healthy: int) -> None:
        _, allocatable = objects.gpu_capacity(node.group, healthy)

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            obj["status"]["allocatable"][node.group.resource] = allocatable
            return obj

        self._api.mutate("nodes", node.name, None, fn, subresource="status")
        node.allocatable_written = healthy

    # ------------------------------------------------------------------ pods finishing and leaving

    def complete(self, pod: SimPod) -> None:
        """The pod's containers exit 0: the kubelet writes Succeeded and frees its devices."""
        if pod.terminated or pod.key not in self._pods:
            return
        node = self._nodes[pod.node]
        if not node.writes:
            self._timers.at(self._timers.now() + self._settings.status_sync_interval, self.complete, pod)
            return
        finished = self._timers.wall()

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            status = obj["status"]
            status["phase"] = "Succeeded"
            for cond in status.get("conditions", []):
                if cond.get("type") in ("Ready", "ContainersReady"):
                    cond["status"] = "False"
                    cond["reason"] = "PodCompleted"
                    cond["lastTransitionTime"] = format_timestamp(finished)
            for cs in status.get("containerStatuses", []):
                started = cs.get("state", {}).get("running", {}).get("startedAt")
                cs["state"] = {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": started or format_timestamp(pod.started),
                        "finishedAt": format_timestamp(finished),
                        "containerID": cs.get("containerID", ""),
                    }
                }
                cs["ready"] = False
                cs["started"] = False
            return obj

        if self._pod_status.mutate(pod, fn):
            pod.terminated = True
            node.release(pod)
            self._pod_finished(pod)

    def forget(self, pod: SimPod) -> None:
        """The pod is gone from the API: it leaves its node and, unless finished, frees its devices."""
        node = self._nodes.get(pod.node)
        if self._pods.pop(pod.key, None) is None or node is None:
            return
        if pod in node.pods:
            node.pods.remove(pod)
        if not pod.terminated and not pod.stopped:
            node.release(pod)
        node.last_sig = None
