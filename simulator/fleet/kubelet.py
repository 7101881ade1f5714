"""The simulated fleet: nodes, kubelets, device plugins, DRA drivers and the fault timeline.

`Fleet` owns the simulated state of every node and GPU and writes what real components would
write into the in-process `Store`: Nodes and Leases (kubelet), pod status with
`allocatedResourcesStatus` (kubelet), ResourceSlices with device taints (DRA driver),
ResourceClaims (scheduler and resource claim controller) and the Ready=Unknown transition of
a node whose Lease stopped (node lifecycle controller).

One scheduler loop over a heap of timers drives everything (no task per object): Lease
renewals and status syncs of 10,000 nodes are spread across their period. Time is simulated
seconds since start, read from the injected clock and scaled by `speed`; timestamps written
to the API are the clock's wall time. With a `ManualClock`, `await fleet.advance(s)` steps
the clock from timer to timer, so tests run the kubelet's quirks without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuhealth.clock import Clock, ManualClock
from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet import objects
from simulator.fleet.health import (
    HEALTHY,
    UNHEALTHY,
    Gpu,
    device_plugin_health,
    dra_health,
)
from simulator.fleet.placement import PodPlacement, Slot, eligible, place_workloads
from simulator.scenario import DEVICE_PLUGIN, DRA, GPU_RESOURCE, Fault, NodeGroup, Scenario, Workload

if TYPE_CHECKING:
    from simulator.apiserver.store import Store, Watch

log = logging.getLogger(__name__)

RUNNING = "running"
STOPPED = "kubelet-stop"
PARTITIONED = "node-partition"

_EPS = 1e-9
_UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
_BATCH = 500  # objects written between yields to the event loop while building

XID_DESCRIPTIONS = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
}


@dataclass(slots=True)
class SimPod:
    name: str
    namespace: str
    node: str
    workload: Workload
    slots: tuple[Slot, ...]
    uid: str = ""
    claim_name: str | None = None
    claim_uid: str | None = None
    terminated: bool = False
    ready: bool = True
    written: tuple[tuple[str, str, str | None], ...] = ()
    """(resourceID, health, message) per device as last written to the API."""
    started: float = 0.0
    index: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(slots=True)
class SimNode:
    name: str
    index: int
    group: NodeGroup
    gpus: list[Gpu]
    kubelet: str = RUNNING
    kubelet_token: int = 0
    stream_ok: bool = True
    stream_token: int = 0
    pods: list[SimPod] = field(default_factory=list)
    renewed_at: float = 0.0
    ready: str = "True"
    allocatable_written: int = -1
    slice_name: str | None = None
    slice_generation: int = 1
    slice_dirty: bool = False
    sync_pending: bool = False
    last_sig: tuple[Any, ...] | None = None
    free: list[Slot] = field(default_factory=list)
    xids: list[tuple[int, str, int, float]] = field(default_factory=list)
    """(seq, uuid, xid, wall time) of every XID event on this node."""

    @property
    def is_dra(self) -> bool:
        return self.group.path == DRA

    @property
    def writes(self) -> bool:
        """Whether the kubelet can write to the API server (running and reachable)."""
        return self.kubelet == RUNNING


@dataclass(slots=True)
class PendingPod:
    name: str
    namespace: str
    workload: Workload
    since: float

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class FaultApplied:
    time: float
    wall: float
    fault: Fault


@dataclass(frozen=True, slots=True)
class DeviceHealthChanged:
    """A device's health as written into pods' allocatedResourcesStatus changed."""

    time: float
    wall: float
    node: str
    device: str
    """The GPU (`gpu-<index>`) on the node."""
    old: str
    new: str
    pods: tuple[str, ...]
    message: str | None = None


@dataclass(frozen=True, slots=True)
class NodeChanged:
    time: float
    wall: float
    node: str
    what: str


FleetEvent = FaultApplied | DeviceHealthChanged | NodeChanged


class Fleet:
    """Simulated nodes with their kubelets, GPUs and drivers, writing into `store`."""

    replacement_delay = 5.0
    """Simulated seconds from a pod's deletion to its replacement's creation (controller + scheduler)."""

    def __init__(
        self,
        scenario: Scenario,
        store: Store,
        clock: Clock,
        *,
        speed: float = 1.0,
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.scenario = scenario
        self.settings = scenario.settings
        self.store = store
        self.clock = clock
        self.speed = speed
        self.nodes: dict[str, SimNode] = {}
        self.pods: dict[str, SimPod] = {}
        self.listeners: list[Callable[[FleetEvent], None]] = []
        self.applied: list[FaultApplied] = []
        self._rng = random.Random(scenario.settings.seed)
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._xid_seq = 0
        self._mono0 = clock.monotonic()
        self._wakeup = asyncio.Event()
        self._stopped = False
        self._started = False
        self._job_uids: dict[tuple[str, str], str] = {}
        self._pod_counter = itertools.count()
        self._timeline_done = 0
        self._pod_watch: Watch | None = None
        self.pending: dict[str, PendingPod] = {}
        """Replacement pods waiting for a node with usable GPUs, by namespace/name."""

    # ------------------------------------------------------------------ time

    def now(self) -> float:
        """Simulated seconds since the fleet finished building (its timeline's zero)."""
        return (self.clock.monotonic() - self._mono0) * self.speed

    def wall(self) -> float:
        return self.clock.now()

    def _at(self, due: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), fn, args))

    def call_at(self, sim_time: float, fn: Callable[[], None]) -> None:
        """Run `fn` on the fleet's scheduler once simulated time reaches `sim_time`."""
        self._at(sim_time, fn)
        self._wakeup.set()

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def tick(self, limit: int | None = None) -> int:
        """Run every timer that is due now; returns how many ran (at most `limit`)."""
        ran = 0
        now = self.now()
        while self._heap and self._heap[0][0] <= now + _EPS:
            _, _, fn, args = heapq.heappop(self._heap)
            try:
                fn(*args)
            except Exception:  # one failing timer must not stop the fleet
                log.exception("simulated fleet timer %s failed", getattr(fn, "__name__", fn))
            ran += 1
            if limit is not None and ran >= limit:
                break
        return ran

    async def advance(self, seconds: float) -> None:
        """ManualClock only: move simulated time forward, running each timer at its due time."""
        if not isinstance(self.clock, ManualClock):
            raise TypeError("advance() needs a ManualClock; a real clock runs the fleet with run()")
        target = self.now() + seconds
        while True:
            due = self.next_due()
            if due is None or due > target + _EPS:
                break
            step = (due - self.now()) / self.speed
            if step > 0:
                self.clock.advance(step)
            self.tick()
            await asyncio.sleep(0)
        rest = (target - self.now()) / self.speed
        if rest > 0:
            self.clock.advance(rest)
        self.tick()
        await asyncio.sleep(0)

    async def run(self) -> None:
        """Run timers in real time (scaled by speed) until `stop()`."""
        while not self._stopped:
            if self.tick(limit=2000) >= 2000:
                await asyncio.sleep(0)  # keep the HTTP server responsive under bursts
                continue
            due = self.next_due()
            delay = 3600.0 if due is None else max(0.0, (due - self.now()) / self.speed)
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wakeup.wait()

    def stop(self) -> None:
        self._stopped = True
        self._wakeup.set()
        if self._pod_watch is not None:
            self._pod_watch.close()

    def _emit(self, event: FleetEvent) -> None:
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:
                log.exception("fleet listener failed")

    # ------------------------------------------------------------------ building

    async def start(self) -> None:
        """Write namespaces, nodes, leases, slices, jobs and pods; schedule timers and the timeline."""
        if self._started:
            return
        self._started = True
        sc = self.scenario
        wall = self.wall()
        for ns in sorted({"default", "kube-node-lease", *(w.namespace for w in sc.workloads)}):
            self._create_ignore_exists("namespaces", objects.namespace(ns))
        written = 0
        index = 0
        for group in sc.fleet:
            for name in group.node_names():
                gpus = [
                    Gpu(name, i, objects.gpu_uuid(name, i), group.path) for i in range(group.gpus_per_node)
                ]
                node = SimNode(name, index, group, gpus)
                node.free = _node_slots(group)
                self.nodes[name] = node
                self._write_node(node, wall)
                index += 1
                written += 1
                if written % _BATCH == 0:
                    await asyncio.sleep(0)
        if any(g.path == DRA for g in sc.fleet):
            self._create_ignore_exists("deviceclasses.resource.k8s.io", objects.device_class())
        for workload in sc.workloads:
            if any(eligible(workload, g) and g.path == DRA for g in sc.fleet):
                self._create_ignore_exists(
                    "resourceclaimtemplates.resource.k8s.io", objects.resource_claim_template(workload)
                )
            if workload.kind == "Job":
                template = objects.pod(
                    name="template",
                    workload=workload,
                    node_name="",
                    gpus=workload.gpus_per_pod,
                    dra=workload.path == DRA,
                    claim_name=None,
                    job_uid=None,
                )
                created = self._create_ignore_exists("jobs.batch", objects.job(workload, template))
                self._job_uids[(workload.namespace, workload.name)] = created["metadata"].get("uid", "")
        for placement in place_workloads(sc):
            self._start_pod(placement, wall)
            written += 1
            if written % _BATCH == 0:
                await asyncio.sleep(0)
        self._update_jobs()
        # Simulated time starts once the fleet stands: building 10,000 nodes takes seconds.
        self._mono0 = self.clock.monotonic()
        for node in self.nodes.values():
            node.renewed_at = 0.0
        for pod in self.pods.values():
            if pod.workload.complete_after is not None:
                self._at(pod.workload.complete_after, self._complete_pod, pod)
        self._schedule_periodic()
        for fault in sc.timeline:
            self._at(fault.at, self._apply_timeline_fault, fault)
        self._wakeup.set()

    def _create_ignore_exists(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.store.create(
                resource, obj, namespace=obj["metadata"].get("namespace"), validate=False
            )
        except ApiError as exc:
            if exc.code != 409:
                raise
            return self.store.get(resource, obj["metadata"]["name"], obj["metadata"].get("namespace"))

    def _write_status(self, resource: str, name: str, namespace: str | None, status: dict[str, Any]) -> None:
        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            obj["status"] = status
            return obj

        self.store.mutate(resource, name, namespace, fn, subresource="status")

    def _write_node(self, node: SimNode, wall: float) -> None:
        # validate=False stores what it is given, status included: one write per object.
        self._create_ignore_exists("nodes", objects.node(node.name, node.index, node.group, wall))
        if not node.is_dra:
            node.allocatable_written = node.group.gpus_per_node
        self._create_ignore_exists(
            "leases.coordination.k8s.io",
            objects.lease(node.name, wall, self.settings.lease_duration_seconds),
        )
        node.renewed_at = self.now()
        if node.is_dra:
            node.slice_name = f"{node.name}-{objects.DRA_DRIVER}-{objects.suffix(self._rng)}"
            self.store.create("resourceslices.resource.k8s.io", self._slice(node), validate=False)

    def _slice(self, node: SimNode) -> dict[str, Any]:
        assert node.slice_name is not None
        return objects.resource_slice(
            node.slice_name,
            node.name,
            node.group,
            [g.uuid for g in node.gpus],
            [list(g.taints) for g in node.gpus],
            node.slice_generation,
        )

    def _start_pod(self, placement: PodPlacement, wall: float) -> SimPod:
        workload = self.scenario.workloads[placement.workload]
        node = self.nodes[placement.node]
        name = objects.pod_name(workload, placement.ordinal, self._rng)
        while f"{workload.namespace}/{name}" in self.pods:  # generated suffixes can collide
            name = objects.pod_name(workload, placement.ordinal, self._rng)
        pod = SimPod(name, workload.namespace, node.name, workload, placement.slots)
        pod.started = wall
        pod.index = next(self._pod_counter)
        for slot in placement.slots:
            node.free.remove(slot)
            node.gpus[slot.gpu].allocated += 1
        self._create_pod_objects(pod, node, wall)
        node.pods.append(pod)
        self.pods[pod.key] = pod
        return pod

    def _put_pod(self, pod_obj: dict[str, Any], bind_existing: bool) -> dict[str, Any]:
        """Create the pod, or bind an existing Pending one (same uid) as the scheduler's binding does."""
        if not bind_existing:
            return self.store.create(
                "pods", pod_obj, namespace=pod_obj["metadata"]["namespace"], validate=False
            )

        def bind(obj: dict[str, Any]) -> dict[str, Any]:
            obj["spec"] = pod_obj["spec"]
            obj["status"] = pod_obj["status"]
            return obj

        meta = pod_obj["metadata"]
        return self.store.mutate("pods", meta["name"], meta["namespace"], bind)

    def _create_pod_objects(
        self, pod: SimPod, node: SimNode, wall: float, bind_existing: bool = False
    ) -> None:
        """Write the pod (and, on DRA, its claim) as scheduler, controllers and kubelet would."""
        workload = pod.workload
        job_uid = self._job_uids.get((pod.namespace, workload.name))
        if not node.is_dra:
            pod_obj = objects.pod(
                name=pod.name, workload=workload, node_name=node.name, gpus=len(pod.slots),
                dra=False, claim_name=None, job_uid=job_uid,
            )  # fmt: skip
            rows = self._render(pod, node, self.now())
            pod_obj["status"] = self._pod_status(pod, node, pod_obj, rows, None, wall)
            pod.uid = self._put_pod(pod_obj, bind_existing)["metadata"]["uid"]
            pod.written = rows
            return
        claims = "resourceclaims.resource.k8s.io"
        template = workload.dra_claim == "template"
        if template:
            pod.claim_name = f"{pod.name}-gpus-{objects.suffix(self._rng)}"
        else:
            # A claim created up front (by the workload's owner), referenced by name.
            pod.claim_name = f"{pod.name}-gpus"
            claim = objects.resource_claim(
                name=pod.claim_name, namespace=pod.namespace, gpus=len(pod.slots), owner=None, template=None
            )
            pod.claim_uid = self.store.create(claims, claim, validate=False)["metadata"]["uid"]
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
            pod.claim_uid = self.store.create(claims, claim, validate=False)["metadata"]["uid"]
            claim_statuses = [{"name": "gpus", "resourceClaimName": pod.claim_name}]
        # The scheduler allocates the devices and reserves the claim for the pod.
        allocation = objects.claim_status(node.name, [f"gpu-{s.gpu}" for s in pod.slots], pod.name, pod.uid)
        self._write_status(claims, pod.claim_name, pod.namespace, allocation)
        rows = self._render(pod, node, self.now())
        status = self._pod_status(pod, node, pod_obj, rows, claim_statuses, wall)
        self._write_status("pods", pod.name, pod.namespace, status)
        pod.written = rows

    def _pod_status(
        self,
        pod: SimPod,
        node: SimNode,
        pod_obj: dict[str, Any],
        rows: tuple[tuple[str, str, str | None], ...],
        claim_statuses: list[dict[str, Any]] | None,
        wall: float,
    ) -> dict[str, Any]:
        return objects.pod_status(
            pod_obj=pod_obj,
            node_index=node.index,
            pod_index=pod.index,
            started=wall,
            ready=True,
            allocated=self._allocated_status(pod, rows),
            claim_statuses=claim_statuses,
        )

    # ------------------------------------------------------------------ rendering

    def _resource_id(self, pod: SimPod, gpu: Gpu, slot: Slot) -> str:
        if gpu.path == DEVICE_PLUGIN:
            return objects.device_id(gpu.uuid, slot.replica)
        assert pod.claim_uid is not None
        return objects.cdi_id(pod.claim_uid, gpu.name)

    def _device_view(self, node: SimNode, gpu: Gpu, now: float) -> tuple[str, str | None]:
        if node.is_dra:
            return dra_health(gpu, node.stream_ok, now, self.settings.dra_health_timeout)
        return device_plugin_health(gpu, node.stream_ok), None

    def _render(self, pod: SimPod, node: SimNode, now: float) -> tuple[tuple[str, str, str | None], ...]:
        rows = []
        for slot in pod.slots:
            gpu = node.gpus[slot.gpu]
            health, message = self._device_view(node, gpu, now)
            rows.append((self._resource_id(pod, gpu, slot), health, message))
        return tuple(rows)

    def _allocated_status(
        self, pod: SimPod, rows: tuple[tuple[str, str, str | None], ...]
    ) -> list[dict[str, Any]]:
        if not rows:
            return []
        if pod.claim_name is None:
            name = GPU_RESOURCE
        else:
            name = objects.allocated_resource_name(objects.claim_reference(pod.workload))
        resources = []
        for resource_id, health, message in rows:
            entry = {"resourceID": resource_id, "health": health}
            if message:
                entry["message"] = message
            resources.append(entry)
        return [{"name": name, "resources": resources}]

    # ------------------------------------------------------------------ periodic work

    def _schedule_periodic(self) -> None:
        n = max(1, len(self.nodes))
        lease = self.settings.lease_renew_interval
        sync = self.settings.status_sync_interval
        now = self.now()
        for node in self.nodes.values():
            # Spread over the period, so 10,000 nodes renew ~1,000 Leases a second, not all at once.
            phase = (node.index + 0.5) / n
            self._at(now + phase * lease, self._lease_tick, node)
            self._at(now + phase * sync, self._sync_tick, node)

    def _lease_tick(self, node: SimNode) -> None:
        self._at(self.now() + self.settings.lease_renew_interval, self._lease_tick, node)
        if node.writes:
            self._renew(node)
        else:
            self._node_monitor(node)

    def _renew(self, node: SimNode) -> None:
        wall = objects.micro_time(self.wall())

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            obj["spec"]["renewTime"] = wall
            obj["spec"]["holderIdentity"] = node.name
            return obj

        try:
            self.store.mutate("leases.coordination.k8s.io", node.name, "kube-node-lease", fn)
        except ApiError as exc:
            if exc.code != 404:
                raise
            # Someone deleted the Lease: the kubelet creates it again, as a real one does.
            lease = objects.lease(node.name, self.wall(), self.settings.lease_duration_seconds)
            self.store.create("leases.coordination.k8s.io", lease, validate=False)
        node.renewed_at = self.now()

    def _node_monitor(self, node: SimNode) -> None:
        """The node lifecycle controller: no Lease renewal within the grace period -> Ready Unknown."""
        if node.ready != "True" or self.now() - node.renewed_at < self.settings.node_monitor_grace_period:
            return
        self._write_node_ready(node, "Unknown")
        for pod in node.pods:
            if not pod.terminated:
                self._set_pod_ready(pod, False)
        self._emit(NodeChanged(self.now(), self.wall(), node.name, "Ready=Unknown (lease not renewed)"))

    def _write_node_ready(self, node: SimNode, status: str) -> None:
        """The node's Ready condition, and the node lifecycle controller's unreachable taints
        (NoSchedule and NoExecute) while it is not True."""
        node.ready = status
        ts = format_timestamp(self.wall())

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

        self.store.mutate("nodes", node.name, None, condition, subresource="status")
        self.store.mutate("nodes", node.name, None, taints)

    def _set_pod_ready(self, pod: SimPod, ready: bool) -> None:
        if self._mutate_pod(pod, self._status_update(ready, None)):
            pod.ready = ready

    def _status_update(
        self, ready: bool | None, allocated: list[dict[str, Any]] | None
    ) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """One pod status write: readiness (when given) and allocatedResourcesStatus (when given)."""
        ts = format_timestamp(self.wall())

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            status = obj["status"]
            if ready is not None:
                value = "True" if ready else "False"
                for cond in status.get("conditions", []):
                    if cond.get("type") in ("Ready", "ContainersReady") and cond.get("status") != value:
                        cond["status"] = value
                        cond["lastTransitionTime"] = ts
            for cs in status.get("containerStatuses", []):
                if ready is not None:
                    cs["ready"] = ready
                # Only regular containers get allocatedResourcesStatus; init containers never do.
                if allocated is not None:
                    cs["allocatedResourcesStatus"] = allocated
            return obj

        return fn

    def _mutate_pod(self, pod: SimPod, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
        try:
            self.store.mutate("pods", pod.name, pod.namespace, fn, subresource="status")
        except ApiError as exc:
            if exc.code == 404:  # deleted through the API before the watch told us
                self.pod_deleted(pod.namespace, pod.name)
                return False
            raise
        return True

    def _sync_tick(self, node: SimNode) -> None:
        self._at(self.now() + self.settings.status_sync_interval, self._sync_tick, node)
        self.sync_node(node)

    def _push(self, node: SimNode) -> None:
        """A health change pushed by the plugin/driver stream: the kubelet syncs the node's pods promptly."""
        if node.writes and not node.sync_pending:
            node.sync_pending = True
            self._at(self.now(), self._pushed_sync, node)
            self._wakeup.set()

    def _pushed_sync(self, node: SimNode) -> None:
        node.sync_pending = False
        self.sync_node(node)

    def sync_node(self, node: SimNode) -> None:
        """The kubelet's status sync: evaluate device health now, write what changed."""
        if not node.writes:
            return
        now = self.now()
        views = [self._device_view(node, g, now) for g in node.gpus]
        if not node.is_dra:
            healthy = sum(1 for h, _ in views if h == HEALTHY)
            if healthy != node.allocatable_written:
                self._write_allocatable(node, healthy)
        sig = (tuple(views), len(node.pods))
        if sig == node.last_sig and all(p.ready or p.terminated for p in node.pods):
            return
        changes: dict[int, tuple[str, str, str | None, list[str]]] = {}
        for pod in list(node.pods):
            if pod.terminated:
                continue  # the kubelet stops updating pods that finished
            rows = self._render(pod, node, now)
            if rows == pod.written and pod.ready:
                continue
            allocated = self._allocated_status(pod, rows) if rows != pod.written else None
            if not self._mutate_pod(pod, self._status_update(None if pod.ready else True, allocated)):
                continue
            pod.ready = True
            for slot, before, after in zip(pod.slots, pod.written, rows, strict=False):
                if before[1] != after[1]:
                    entry = changes.setdefault(slot.gpu, (before[1], after[1], after[2], []))
                    entry[3].append(pod.key)
            pod.written = rows
        node.last_sig = sig
        wall = self.wall()
        for gpu_index, (old, new, message, pods) in sorted(changes.items()):
            self._emit(
                DeviceHealthChanged(now, wall, node.name, f"gpu-{gpu_index}", old, new, tuple(pods), message)
            )

    def _write_allocatable(self, node: SimNode, healthy: int) -> None:
        _, allocatable = objects.gpu_capacity(node.group, healthy)

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            obj["status"]["allocatable"][GPU_RESOURCE] = allocatable
            return obj

        self.store.mutate("nodes", node.name, None, fn, subresource="status")
        node.allocatable_written = healthy

    def _write_slice(self, node: SimNode) -> None:
        """The DRA driver republishes its ResourceSlice (it talks to the API server itself)."""
        if not node.is_dra or node.slice_name is None:
            return
        if node.kubelet == PARTITIONED:
            node.slice_dirty = True  # the driver cannot reach the API server either
            return
        node.slice_dirty = False
        node.slice_generation += 1
        spec = self._slice(node)["spec"]

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            obj["spec"] = spec
            return obj

        self.store.mutate("resourceslices.resource.k8s.io", node.slice_name, None, fn)

    # ------------------------------------------------------------------ pods finishing and going away

    def _complete_pod(self, pod: SimPod) -> None:
        if pod.terminated or pod.key not in self.pods:
            return
        node = self.nodes[pod.node]
        if not node.writes:
            self._at(self.now() + self.settings.status_sync_interval, self._complete_pod, pod)
            return
        finished = self.wall()

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

        if self._mutate_pod(pod, fn):
            pod.terminated = True
            self._release_slots(pod, node)
            self._update_jobs()

    def _release_slots(self, pod: SimPod, node: SimNode) -> None:
        for slot in pod.slots:
            node.gpus[slot.gpu].allocated = max(0, node.gpus[slot.gpu].allocated - 1)
            if slot not in node.free:
                node.free.append(slot)
        order = {s: i for i, s in enumerate(_node_slots(node.group))}
        node.free.sort(key=order.__getitem__)

    def _forget_pod(self, pod: SimPod) -> None:
        node = self.nodes.get(pod.node)
        if self.pods.pop(pod.key, None) is None or node is None:
            return
        if pod in node.pods:
            node.pods.remove(pod)
        if not pod.terminated:
            self._release_slots(pod, node)
        node.last_sig = None

    async def follow_deletions(self) -> None:
        """Follow pods deleted through the API (delete, eviction) until `stop()`.

        One watch for the whole fleet, events left unparsed except deletions. A deleted pod
        leaves its node: its devices are freed, its generated ResourceClaim goes (garbage
        collection), and its Deployment or Job gets a replacement pod after
        `replacement_delay` simulated seconds, placed on usable devices only.
        """
        while not self._stopped:
            watch = self.store.watch("pods", resource_version=str(self.store.resource_version))
            self._pod_watch = watch
            try:
                while True:
                    item = await watch.next_entry()
                    if item is None:
                        break
                    etype, entry = item
                    if etype == "DELETED":
                        self.pod_deleted(entry.namespace, entry.name)
            finally:
                watch.close()
                self._pod_watch = None
            if not self._stopped:
                self._resync_pods()  # the watch fell behind and was ended: compare with a list

    def _resync_pods(self) -> None:
        entries, _ = self.store.list_entries("pods")
        present = {f"{e.namespace}/{e.name}" for e in entries}
        for key in [k for k in self.pods if k not in present]:
            namespace, name = key.split("/", 1)
            self.pod_deleted(namespace, name)

    def pod_deleted(self, namespace: str, name: str) -> None:
        """A pod of the fleet is gone from the API."""
        key = f"{namespace}/{name}"
        if self.pending.pop(key, None) is not None:
            return
        pod = self.pods.get(key)
        if pod is None:
            return
        self._forget_pod(pod)
        if pod.claim_name is not None:
            with contextlib.suppress(ApiError):
                self.store.delete("resourceclaims.resource.k8s.io", pod.claim_name, namespace)
        if not pod.terminated:
            self._at(self.now() + self.replacement_delay, self._replace, pod.workload)
        self._update_jobs()

    def _replace(self, workload: Workload) -> None:
        name = objects.pod_name(workload, 0, self._rng)
        while f"{workload.namespace}/{name}" in self.pods or f"{workload.namespace}/{name}" in self.pending:
            name = objects.pod_name(workload, 0, self._rng)
        pending = PendingPod(name, workload.namespace, workload, self.now())
        pod_obj = objects.pod(
            name=name,
            workload=workload,
            node_name="",
            gpus=workload.gpus_per_pod,
            dra=workload.path == DRA,
            claim_name=f"{name}-gpus",
            job_uid=self._job_uids.get((workload.namespace, workload.name)),
        )
        del pod_obj["spec"]["nodeName"]
        pod_obj["status"] = objects.pending_status(self.wall())
        self.store.create("pods", pod_obj, namespace=workload.namespace, validate=False)
        self.pending[pending.key] = pending
        self._try_bind(pending)

    def _try_bind(self, pending: PendingPod) -> None:
        if self.pending.get(pending.key) is not pending:
            return  # deleted meanwhile
        found = self._find_devices(pending.workload)
        if found is None:
            self._at(self.now() + self.settings.status_sync_interval, self._try_bind, pending)
            return
        node, slots = found
        del self.pending[pending.key]
        pod = SimPod(pending.name, pending.namespace, node.name, pending.workload, slots)
        pod.started = self.wall()
        pod.index = next(self._pod_counter)
        for slot in slots:
            node.free.remove(slot)
            node.gpus[slot.gpu].allocated += 1
        self._create_pod_objects(pod, node, self.wall(), bind_existing=True)
        node.pods.append(pod)
        node.last_sig = None
        self.pods[pod.key] = pod
        if pending.workload.complete_after is not None:
            self._at(self.now() + pending.workload.complete_after, self._complete_pod, pod)
        self._update_jobs()
        self._emit(NodeChanged(self.now(), self.wall(), node.name, f"pod {pod.key} scheduled (replacement)"))

    def _find_devices(self, workload: Workload) -> tuple[SimNode, tuple[Slot, ...]] | None:
        """First node with enough usable free slots: what the scheduler (and its filters) would pick."""
        rules: list[dict[str, Any]] | None = None
        for node in self.nodes.values():
            if len(node.free) < workload.gpus_per_pod or not eligible(workload, node.group):
                continue
            if node.ready != "True" or not node.writes:
                continue
            obj = self.store.get("nodes", node.name)
            if not objects.schedulable(obj):
                continue
            if node.is_dra and rules is None:
                rules = self.store.list("devicetaintrules.resource.k8s.io")[0]
            blocked = self._blocked_devices(node, obj, rules or [])
            usable = [s for s in node.free if s.gpu not in blocked]
            if len(usable) >= workload.gpus_per_pod:
                return node, tuple(usable[: workload.gpus_per_pod])
        return None

    def _blocked_devices(
        self, node: SimNode, node_obj: dict[str, Any], rules: list[dict[str, Any]]
    ) -> set[int]:
        """GPU indexes new pods must not get on `node`.

        Device plugin: devices the plugin reports Unhealthy (not in allocatable) and devices in
        the node annotation `gpuhealth.io/quarantined-devices` (the scheduler extender's view).
        DRA: devices with a NoSchedule/NoExecute taint, from the slice or a DeviceTaintRule;
        health alone does not keep the DRA scheduler away, as in a real cluster.
        """
        blocked: set[int] = set()
        if not node.is_dra:
            quarantined = objects.quarantined_devices(node_obj)
            for gpu in node.gpus:
                if device_plugin_health(gpu, node.stream_ok) != HEALTHY:
                    blocked.add(gpu.index)
                if gpu.uuid in quarantined or gpu.name in quarantined:
                    blocked.add(gpu.index)
            return blocked
        for gpu in node.gpus:
            if any(t.get("effect") in ("NoSchedule", "NoExecute") for t in gpu.taints):
                blocked.add(gpu.index)
        for rule in rules:
            selector = (rule.get("spec") or {}).get("deviceSelector") or {}
            taint = (rule.get("spec") or {}).get("taint") or {}
            if taint.get("effect") not in ("NoSchedule", "NoExecute"):
                continue
            if selector.get("driver") not in (None, objects.DRA_DRIVER):
                continue
            if selector.get("pool") not in (None, node.name):
                continue
            for gpu in node.gpus:
                if selector.get("device") in (None, gpu.name):
                    blocked.add(gpu.index)
        return blocked

    def _update_jobs(self) -> None:
        counts: dict[tuple[str, str], list[int]] = {}
        for pod in self.pods.values():
            if pod.workload.kind != "Job":
                continue
            c = counts.setdefault((pod.namespace, pod.workload.name), [0, 0])
            c[1 if pod.terminated else 0] += 1
        wall = format_timestamp(self.wall())
        for (ns, name), (active, succeeded) in counts.items():

            def fn(obj: dict[str, Any], active: int = active, succeeded: int = succeeded) -> dict[str, Any]:
                status = obj.setdefault("status", {})
                status["active"] = active
                status["succeeded"] = succeeded
                status.setdefault("startTime", wall)
                want = obj["spec"].get("completions") or 0
                if succeeded >= want and active == 0 and not status.get("completionTime"):
                    status["completionTime"] = wall
                    status["conditions"] = [
                        {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": wall},
                        {"type": "Complete", "status": "True", "lastTransitionTime": wall},
                    ]
                return obj

            with contextlib.suppress(Exception):
                self.store.mutate("jobs.batch", name, ns, fn, subresource="status")

    # ------------------------------------------------------------------ faults

    def inject(self, fault: Fault) -> None:
        """Apply `fault` at its `at` (simulated seconds since start); now if that has passed."""
        self._at(max(fault.at, self.now()), self._apply_fault, fault)
        self._wakeup.set()

    def timeline_progress(self) -> tuple[int, int]:
        return self._timeline_done, len(self.scenario.timeline)

    def gpu(self, node: str, index: int) -> Gpu:
        return self.nodes[node].gpus[index]

    def _apply_timeline_fault(self, fault: Fault) -> None:
        self._timeline_done += 1
        self._apply_fault(fault)

    def _apply_fault(self, fault: Fault) -> None:
        now = self.now()
        applied = FaultApplied(now, self.wall(), fault)
        self.applied.append(applied)
        self._emit(applied)
        kind = fault.kind
        if fault.device is not None:
            node = self.nodes[fault.device.node]
            gpu = node.gpus[fault.device.gpu]
            if kind == "device-unhealthy":
                self._set_reported(
                    node, gpu, UNHEALTHY, fault.message or "device reported unhealthy by the driver"
                )
                if fault.duration is not None:
                    gpu.unhealthy_token += 1
                    self._at(now + fault.duration, self._end_unhealthy, node, gpu, gpu.unhealthy_token)
            elif kind == "device-unknown":
                gpu.unknown_token += 1
                if gpu.reporting:
                    gpu.reporting = False
                    gpu.silent_since = now
                self._at(now + (fault.duration or 0), self._end_unknown, node, gpu, gpu.unknown_token)
            elif kind == "flap":
                period = fault.period or 1.0
                for i in range(fault.times or 1):
                    self._at(now + i * period, self._set_reported, node, gpu, UNHEALTHY, "device flapping")
                    self._at(now + i * period + period / 2, self._set_reported, node, gpu, HEALTHY, None)
            elif kind == "xid":
                self._xid(node, gpu, fault.xid or 0, fault.unhealthy, fault.message)
            elif kind == "ecc":
                gpu.ecc_corrected += fault.corrected
                gpu.ecc_uncorrected += fault.uncorrected
            elif kind == "row-remap-failure":
                gpu.rows_uncorrectable += 1
                gpu.rows_failure = True
                gpu.rows_pending = False
            elif kind == "gpu-lost":
                gpu.lost = True
                self._xid(node, gpu, 79, True, fault.message or "GPU is lost (NVML_ERROR_GPU_IS_LOST)")
                self._taint(node, gpu, "gpu.nvidia.com/gpu-lost", "true")
            elif kind == "recover":
                self._recover_gpu(node, gpu)
            return
        assert fault.node is not None
        node = self.nodes[fault.node]
        if kind in (STOPPED, PARTITIONED):
            node.kubelet = kind
            node.kubelet_token += 1
            self._emit(
                NodeChanged(now, self.wall(), node.name, f"{kind}: lease renewals and status writes stop")
            )
            if fault.duration is not None:
                self._at(now + fault.duration, self._end_node_fault, node, node.kubelet_token)
        elif kind == "health-stream-broken":
            node.stream_ok = False
            node.stream_token += 1
            self._push(node)
            if fault.duration is not None:
                self._at(now + fault.duration, self._end_stream, node, node.stream_token)
        elif kind == "recover":
            self._end_node_fault(node, node.kubelet_token)
            self._end_stream(node, node.stream_token)

    def _set_reported(self, node: SimNode, gpu: Gpu, health: str, message: str | None) -> None:
        changed = gpu.reported != health or gpu.message != message
        gpu.reported = health
        gpu.message = message if node.is_dra else None
        if changed:
            self._push(node)

    def _end_unhealthy(self, node: SimNode, gpu: Gpu, token: int) -> None:
        if gpu.unhealthy_token == token and not gpu.lost:
            self._set_reported(node, gpu, HEALTHY, None)

    def _end_unknown(self, node: SimNode, gpu: Gpu, token: int) -> None:
        if gpu.unknown_token != token:
            return
        gpu.reporting = True
        # The first report after the silence reaches the kubelet through the stream: prompt.
        self._push(node)
        node.last_sig = None

    def _end_node_fault(self, node: SimNode, token: int) -> None:
        if node.kubelet_token != token or node.kubelet == RUNNING:
            return
        node.kubelet = RUNNING
        self._renew(node)
        if node.ready != "True":
            self._write_node_ready(node, "True")
        if node.slice_dirty:
            self._write_slice(node)
        self._emit(
            NodeChanged(self.now(), self.wall(), node.name, "kubelet back: lease renewed, status syncing")
        )
        node.last_sig = None
        self.sync_node(node)

    def _end_stream(self, node: SimNode, token: int) -> None:
        if node.stream_token != token or node.stream_ok:
            return
        node.stream_ok = True
        self._push(node)

    def _xid(self, node: SimNode, gpu: Gpu, xid: int, unhealthy: bool | None, message: str | None) -> None:
        self._xid_seq += 1
        node.xids.append((self._xid_seq, gpu.uuid, xid, self.wall()))
        if unhealthy:
            text = message or f"XID {xid}: {XID_DESCRIPTIONS.get(xid, 'critical error')} on {gpu.uuid}"
            self._set_reported(node, gpu, UNHEALTHY, text)
            self._taint(node, gpu, "gpu.nvidia.com/xid", str(xid))

    def _taint(self, node: SimNode, gpu: Gpu, key: str, value: str) -> None:
        if not node.is_dra:
            return
        gpu.taints = [t for t in gpu.taints if t["key"] != key]
        gpu.taints.append(
            {"key": key, "value": value, "effect": "NoSchedule", "timeAdded": format_timestamp(self.wall())}
        )
        self._write_slice(node)

    def _recover_gpu(self, node: SimNode, gpu: Gpu) -> None:
        gpu.lost = False
        gpu.reporting = True
        gpu.unknown_token += 1
        gpu.unhealthy_token += 1
        # A reset clears the volatile ECC counters and any pending row remap.
        gpu.ecc_corrected = 0
        gpu.ecc_uncorrected = 0
        gpu.rows_pending = False
        gpu.rows_failure = False
        had_taints = bool(gpu.taints)
        gpu.taints = []
        if had_taints:
            self._write_slice(node)
        self._set_reported(node, gpu, HEALTHY, None)
        node.last_sig = None
        self._push(node)

    # ------------------------------------------------------------------ views

    def xid_events(self, node: str, since: int = 0) -> list[tuple[int, str, int, float]]:
        return [e for e in self.nodes[node].xids if e[0] > since]

    @property
    def xid_seq(self) -> int:
        return self._xid_seq

    def status(self) -> dict[str, Any]:
        done, total = self.timeline_progress()
        return {
            "scenario": self.scenario.name,
            "simulatedSeconds": round(self.now(), 3),
            "wallTime": format_timestamp(self.wall()),
            "speed": self.speed,
            "nodes": len(self.nodes),
            "gpus": sum(len(n.gpus) for n in self.nodes.values()),
            "pods": len(self.pods),
            "timeline": {"applied": done, "total": total},
            "faultsApplied": [{"time": round(a.time, 3), **a.fault.to_json()} for a in self.applied],
        }


def _node_slots(group: NodeGroup) -> list[Slot]:
    from simulator.fleet.placement import node_slots

    return node_slots(group)
