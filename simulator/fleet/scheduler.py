"""The scheduler: binds pods to nodes and devices, and writes what binding creates.

Initial pods go where the scenario's first-fit layout puts them (`simulator.model`); a
replacement pod waits Pending until a node passes the filters (Ready, kubelet writing,
schedulable, enough usable free slots: `placement.blocked_devices`) and is retried every
status sync interval. Binding writes the pod with its node, on DRA the ResourceClaim (created
up front, or generated from the template by the resource claim controller) and its allocation,
then the kubelet's first status: one step, as a real cluster reaches it within a second.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from simulator.fleet import objects
from simulator.fleet.events import Emit, NodeChanged
from simulator.fleet.placement import blocked_devices
from simulator.fleet.state import PendingPod, SimNode, SimPod
from simulator.fleet.timers import Timers
from simulator.fleet.writes import write_status
from simulator.model import PodPlacement, Settings, Slot, Workload, eligible

if TYPE_CHECKING:
    from simulator.apiserver.store import Store

_CLAIMS = "resourceclaims.resource.k8s.io"

Admit = Callable[[SimPod, SimNode, dict[str, Any], list[dict[str, Any]] | None, float], dict[str, Any]]
"""The kubelet's first status of a pod bound to a node (`Kubelet.admit`)."""


class Scheduler:
    """kube-scheduler with the resource claim controller's part in binding.

    Owns `SimNode.free` (through `reserve`), `pending` (replacement pods not yet bound) and
    adds bound pods to `pods` and their node.
    """

    def __init__(
        self,
        store: Store,
        settings: Settings,
        timers: Timers,
        nodes: Mapping[str, SimNode],
        pods: dict[str, SimPod],
        pending: dict[str, PendingPod],
        job_uids: Mapping[tuple[str, str], str],
        rng: random.Random,
        admit: Admit,
        bound: Callable[[SimPod], None],
        emit: Emit,
    ) -> None:
        self._store = store
        self._settings = settings
        self._timers = timers
        self._nodes = nodes
        self._pods = pods
        self._pending = pending
        self._job_uids = job_uids
        self._rng = rng
        self._admit = admit
        self._bound = bound
        self._emit = emit
        self._pod_counter = itertools.count()

    def start_pod(self, workload: Workload, placement: PodPlacement, wall: float) -> SimPod:
        """Create an initial pod where the scenario's layout puts it."""
        node = self._nodes[placement.node]
        name = objects.pod_name(workload, placement.ordinal, self._rng)
        while f"{workload.namespace}/{name}" in self._pods:  # generated suffixes can collide
            name = objects.pod_name(workload, placement.ordinal, self._rng)
        pod = SimPod(name, workload.namespace, node.name, workload, placement.slots)
        pod.started = wall
        pod.index = next(self._pod_counter)
        node.reserve(placement.slots)
        self._write_bound(pod, node, wall)
        node.pods.append(pod)
        self._pods[pod.key] = pod
        return pod

    def try_bind(self, pending: PendingPod) -> None:
        """Bind a Pending pod to usable devices, or try again after a status sync interval."""
        if self._pending.get(pending.key) is not pending:
            return  # deleted meanwhile
        found = self._find_devices(pending.workload)
        if found is None:
            self._timers.at(self._timers.now() + self._settings.status_sync_interval, self.try_bind, pending)
            return
        node, slots = found
        del self._pending[pending.key]
        wall = self._timers.wall()
        pod = SimPod(pending.name, pending.namespace, node.name, pending.workload, slots)
        pod.started = wall
        pod.index = next(self._pod_counter)
        node.reserve(slots)
        self._write_bound(pod, node, wall, bind_existing=True)
        node.pods.append(pod)
        node.last_sig = None
        self._pods[pod.key] = pod
        self._bound(pod)
        self._emit(NodeChanged(self._timers.now(), wall, node.name, f"pod {pod.key} scheduled (replacement)"))

    def _find_devices(self, workload: Workload) -> tuple[SimNode, tuple[Slot, ...]] | None:
        """First node with enough usable free slots: what the scheduler (and its filters) would pick."""
        rules: list[dict[str, Any]] | None = None
        for node in self._nodes.values():
            if len(node.free) < workload.gpus_per_pod or not eligible(workload, node.group):
                continue
            if node.ready != "True" or not node.writes:
                continue
            obj = self._store.get("nodes", node.name)
            if not objects.schedulable(obj):
                continue
            if node.is_dra and rules is None:
                rules = self._store.list("devicetaintrules.resource.k8s.io")[0]
            blocked = blocked_devices(node, obj, rules or [])
            usable = [s for s in node.free if s.gpu not in blocked]
            if len(usable) >= workload.gpus_per_pod:
                return node, tuple(usable[: workload.gpus_per_pod])
        return None

    def _put_pod(self, pod_obj: dict[str, Any], bind_existing: bool) -> dict[str, Any]:
        """Create the pod, or bind an existing Pending one (same uid) as the scheduler's binding does."""
        if not bind_existing:
            return self._store.create(
                "pods", pod_obj, namespace=pod_obj["metadata"]["namespace"], validate=False
            )

        def bind(obj: dict[str, Any]) -> dict[str, Any]:
            obj["spec"] = pod_obj["spec"]
            obj["status"] = pod_obj["status"]
            return obj

        meta = pod_obj["metadata"]
        return self._store.mutate("pods", meta["name"], meta["namespace"], bind)

    def _write_bound(self, pod: SimPod, node: SimNode, wall: float, bind_existing: bool = False) -> None:
        """Write the pod (and, on DRA, its claim) as scheduler, controllers and kubelet would."""
        workload = pod.workload
        job_uid = self._job_uids.get((pod.namespace, workload.name))
        if not node.is_dra:
            pod_obj = objects.pod(
                name=pod.name, workload=workload, node_name=node.name, gpus=len(pod.slots),
                dra=False, claim_name=None, job_uid=job_uid,
            )  # fmt: skip
            pod_obj["status"] = self._admit(pod, node, pod_obj, None, wall)
            pod.uid = self._put_pod(pod_obj, bind_existing)["metadata"]["uid"]
            return
        template = workload.dra_claim == "template"
        if template:
            pod.claim_name = f"{pod.name}-gpus-{objects.suffix(self._rng)}"
        else:
            # A claim created up front (by the workload's owner), referenced by name.
            pod.claim_name = f"{pod.name}-gpus"
            claim = objects.resource_claim(
                name=pod.claim_name, namespace=pod.namespace, gpus=len(pod.slots), owner=None, template=None
            )
            pod.claim_uid = self._store.create(_CLAIMS, claim, validate=False)["metadata"]["uid"]
        pod_obj = objects.pod(
            name=pod.name, workload=workload, node_name=node.name, gpus=len(pod.slots),
            dra=True, claim_name=pod.claim_name, job_uid=job_uid,
        )  # fmt: skip
        pod_obj["status"] = {"phase": "Pending"}
        pod.uid = self._put_pod(pod_obj, bind_existing)["metadata"]["uid"]
        claim_statuses = None
        if template:
            # The resource claim controller generates the claim, owned by the pod.
            owner = {
                "apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid,
                "controller": True, "blockOwnerDeletion": True,
            }  # fmt: skip
            claim = objects.resource_claim(
                name=pod.claim_name,
                namespace=pod.namespace,
                gpus=len(pod.slots),
                owner=owner,
                template=f"{workload.name}-gpus",
            )
            pod.claim_uid = self._store.create(_CLAIMS, claim, validate=False)["metadata"]["uid"]
            claim_statuses = [{"name": "gpus", "resourceClaimName": pod.claim_name}]
        # The scheduler allocates the devices and reserves the claim for the pod.
        allocation = objects.claim_status(node.name, [f"gpu-{s.gpu}" for s in pod.slots], pod.name, pod.uid)
        write_status(self._store, _CLAIMS, pod.claim_name, pod.namespace, allocation)
        status = self._admit(pod, node, pod_obj, claim_statuses, wall)
        write_status(self._store, "pods", pod.name, pod.namespace, status)
