"""The simulated fleet's shared records: nodes and pods as every component sees them.

Plain mutable dataclasses, no store and no clock. The fleet (`simulator.fleet.fleet`) creates
one `SimNode` per node and one `SimPod` per running pod and hands the same dicts to each
component; a field belongs to the component its docstring names, the others only read it.
`DeviceDriver` is what the kubelet and the timeline need from a node's device plugin or DRA
driver, so neither imports the driver modules.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from simulator.fleet.health import Gpu
from simulator.model import DRA, NodeGroup, Slot, Workload, node_slots

RUNNING = "running"
STOPPED = "kubelet-stop"
PARTITIONED = "node-partition"

Rows = tuple[tuple[str, str, str | None], ...]
"""(resourceID, health, message) per allocated device of a pod, as the kubelet renders them."""


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
    written: Rows = ()
    """(resourceID, health, message) per device as last written to the API."""
    started: float = 0.0
    index: int = 0
    api: bool = False
    """Created through the API (not by the scenario): run by the kubelet's pod runner."""
    resource_name: str | None = None
    """allocatedResourcesStatus[].name when not the workload's (an API pod's claim reference)."""
    waiting: bool = False
    """Pod runner: no container running (starting, backing off): syncs leave readiness alone."""
    stopped: bool = False
    """Pod runner: containers killed for a graceful deletion, devices already freed."""
    replaced: bool = False
    """Fleet: its workload's controller already replaced it (it began terminating)."""
    cpu_milli: int = 4000
    memory_bytes: int = 32 << 30
    containers: tuple[dict[str, Any], ...] | None = None
    """An API pod's app containers as its spec names them (the kubelet's device manager gives
    each its own request's devices); None: a scenario pod, whose containers its workload makes."""
    extended: bool = False
    """Its GPUs are a DRA-backed extended resource (KEP-5004): its claim is the special one of
    `status.extendedResourceClaimStatus`, and the kubelet writes no allocatedResourcesStatus for
    it (kubernetes#139939, open in 1.37)."""

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
    """Kubelet: running, or the fault that stopped it (kubelet-stop, node-partition)."""
    kubelet_token: int = 0
    stream_ok: bool = True
    """Device plugin / DRA driver: whether its health stream to the kubelet works."""
    stream_token: int = 0
    health_frozen: tuple[tuple[str, str | None], ...] | None = None
    """Timeline (health-stream-stale): the kubelet's DRA health cache, per GPU, as the dead stream
    left it; the kubelet keeps rendering it (lazy expiry). None while the stream is alive."""
    stale_token: int = 0
    pods: list[SimPod] = field(default_factory=list)
    renewed_at: float = 0.0
    """Kubelet: simulated time of the last Lease renewal."""
    ready: str = "True"
    """Node lifecycle controller: the Ready condition as last written."""
    allocatable_written: int = -1
    slice_name: str | None = None
    """DRA driver: its ResourceSlice (one per node), its generation and whether a write is owed."""
    slice_generation: int = 1
    slice_dirty: bool = False
    sync_pending: bool = False
    last_sig: tuple[Any, ...] | None = None
    """Kubelet: the device views and pod count of the last status sync (nothing changed: no work)."""
    free: list[Slot] = field(default_factory=list)
    """Scheduler: unallocated slots, in allocation order."""
    device_order: random.Random = field(default_factory=lambda: random.Random(0))
    """Kubelet (its device manager): the order its unordered set of free healthy devices is
    iterated in, drawn afresh per allocation (`device_manager`); the fleet seeds it per node."""
    xids: list[tuple[int, str, int, float]] = field(default_factory=list)
    """(seq, uuid, xid, wall time) of every XID event on this node."""

    @property
    def is_dra(self) -> bool:
        return self.group.path == DRA

    @property
    def writes(self) -> bool:
        """Whether the kubelet can write to the API server (running and reachable)."""
        return self.kubelet == RUNNING

    def reserve(self, slots: tuple[Slot, ...]) -> None:
        """Take `slots` out of the free list for a pod."""
        for slot in slots:
            self.free.remove(slot)
            self.gpus[slot.gpu].allocated += 1

    def release(self, pod: SimPod) -> None:
        """Give the pod's slots back, keeping the free list in allocation order."""
        for slot in pod.slots:
            self.gpus[slot.gpu].allocated = max(0, self.gpus[slot.gpu].allocated - 1)
            if slot not in self.free:
                self.free.append(slot)
        order = {s: i for i, s in enumerate(node_slots(self.group))}
        self.free.sort(key=order.__getitem__)


@dataclass(slots=True)
class PendingPod:
    name: str
    namespace: str
    workload: Workload
    since: float

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class DeviceDriver(Protocol):
    """A node's device plugin or DRA driver, as the kubelet and the fault timeline reach it."""

    def health(self, node: SimNode, gpu: Gpu, now: float) -> tuple[str, str | None]:
        """(health, message) the kubelet puts in allocatedResourcesStatus for `gpu` at `now`."""
        ...

    def resource_id(self, node: SimNode, pod: SimPod, gpu: Gpu, slot: Slot) -> str:
        """The device's id in the pod's allocatedResourcesStatus."""
        ...

    def report(self, node: SimNode, gpu: Gpu, health: str, message: str | None) -> None:
        """The driver reports `health` for `gpu` over its stream to the kubelet."""
        ...

    def taint(self, node: SimNode, gpu: Gpu, key: str, value: str) -> None:
        """Mark the device as not to be scheduled (DRA device taint; nothing on the device plugin)."""
        ...

    def xid(self, node: SimNode, gpu: Gpu, xid: int, fatal: bool, message: str) -> None:
        """An XID reached the driver's health checks; `fatal`: the card is broken by it."""
        ...

    def reset(self, node: SimNode, gpu: Gpu) -> None:
        """The GPU was reset: drop what the driver published about its faults."""
        ...

    def reconnect(self, node: SimNode) -> None:
        """The node reaches the API server again: publish what could not be written meanwhile."""
        ...
