"""In-memory device state: applies watched objects and NVML readings, produces Snapshots.

`DeviceStateStore` is the coordinator: it routes each kind of evidence to the part that owns it,
keeps the joins between sources (who speaks for a device no pod holds, what a deleted node
takes with it) and builds the snapshots. The parts, one per source:

- `exporter.state_pods` (`PodReports`): pods' `allocatedResourcesStatus` reports, their
  resourceVersions and pending confirmations; `exporter.state_pod_layout` (`PodLayout`): how a
  pod's entries resolve to devices and allocations.
- `exporter.state_slices` (`SliceEvidence`): ResourceClaims, ResourceSlices and identities.
- `exporter.state_nodes` (`NodeEvidence`): kubelet Leases and Node allocatable counts;
  `exporter.state_producers` (`HealthProducers`): DRA drivers' health producer pods.
- `exporter.state_nvml` (`NvmlEvidence`): NVML readings and the kubelet's allocatable devices;
  `exporter.state_listed` (`ListedAssignments`): the kubelet's pod-resources `List`.
- `exporter.state_directory` (`DirectorySync`): what the directory is handed, and the replay.

All of them write devices through one `exporter.state_table.DeviceTable` (copy-on-write against
snapshots, status versions, holders).

The rules of the state model, which the parts keep together:

- A device is keyed by (node, canonical device identity). Several containers or pods on
  one device make one device with several allocations.
- Each pod's latest reported (health, message) per device is remembered. A pod event that
  reports a new value for a device applies it: if it differs from the device's current
  value the status version increases by one, else it is a confirmation (heartbeat). A
  pod repeating what it said before confirms the device only while that still is the
  device's current value, so one pod with a stale view cannot flip a device another pod
  updated. A confirmation counts no later than the node's latest kubelet Lease renewal:
  others (the node lifecycle controller) update a node's pods after its kubelet stopped.
- Where one pod reports several entries for one device (replicas, shared containers),
  the most severe value wins: Unhealthy over Unknown over Healthy.
- Pod events with the same or an older resourceVersion change nothing (duplicates and
  out-of-order deliveries are counted, not applied).
- A pod that is deleted or terminal (Succeeded/Failed) releases its allocations; the
  device stays, with its last health, because a broken card with no pod is still broken.
- A device disappears only when nothing can report on it any more: its node's kubelet
  Lease is deleted (the node was deleted), its ResourceSlice device is removed, or it was
  a provisional identity (claim not yet known, or `<driver>/<pool>/<device>` superseded by
  a uuid) — and in every case only once no pod holds it. Its status version is kept, so a
  device that comes back continues its numbering.
- DRA entries whose claim is not known yet get a provisional identity
  `unresolved/<namespace>/<claim>/<resourceID>` (counted as `claim_unresolved`) and are
  resolved again when the claim or slice arrives.

Status changes go to a `DirectorySink` (the SQLite directory, or nothing) as they
happen. Confirmations are cheap by design, since most pod events are nothing else: such
an event only notes "pod P confirmed at t"; allocation changes likewise only mark the
device. `sync_sink()` (before the directory's periodic write) hands the confirmation
times, allocation changes and pods' latest resourceVersions to the sink; `sync()`
(called by `snapshot()`) also folds them into the immutable devices. Snapshots are built
lazily: the device dict is handed out read-only and copied on the next write (at most
one copy per snapshot), so a burst of events costs dictionary updates, not copies of
80,000 devices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from exporter.decode import Pod
from exporter.identity import IdentityIndex
from exporter.podresources import Allocatable, Assignments
from exporter.sharding import UNSHARDED, OwnedNodes, Shard
from exporter.snapshot import DeviceState, Snapshot
from exporter.state_copies import observed
from exporter.state_directory import DirectorySync
from exporter.state_listed import ListedAssignments
from exporter.state_model import (
    DUPLICATE,
    MIG_PREFIX,
    OUT_OF_ORDER,
    UNRESOLVED_PREFIX,
    DeviceKey,
    DirectorySink,
    ObservationRecord,
    PodVersion,
    StateStats,
)
from exporter.state_nodes import NodeEvidence
from exporter.state_nvml import NVML_REACHABLE_MESSAGE, POD_RESOURCES_UNLISTED, NvmlEvidence, nvml_health
from exporter.state_pod_layout import PodLayout
from exporter.state_pods import PodReports
from exporter.state_producers import HealthProducers
from exporter.state_slices import SliceEvidence
from exporter.state_table import DeviceTable
from gpuhealth.clock import Clock
from gpuhealth.nvml import DeviceReading, XidEvent

__all__ = [
    "CLAIMS",
    "DUPLICATE",
    "LEASES",
    "MIG_PREFIX",
    "NODES",
    "NVML_REACHABLE_MESSAGE",
    "OUT_OF_ORDER",
    "PODS",
    "POD_RESOURCES_UNLISTED",
    "PRODUCER_PREFIX",
    "RESOURCES",
    "SLICES",
    "UNRESOLVED_PREFIX",
    "DeviceKey",
    "DeviceStateStore",
    "DirectorySink",
    "ObservationRecord",
    "PodVersion",
    "StateStats",
    "in_shard",
    "nvml_health",
    "object_node",
    "producer_resource",
]

PODS, CLAIMS, SLICES, LEASES, NODES = "pods", "resourceclaims", "resourceslices", "leases", "nodes"
RESOURCES = (PODS, CLAIMS, SLICES, LEASES, NODES)
PRODUCER_PREFIX = "health-producer/"
"""`health-producer/<driver>`: the pods of one DRA driver's health producer (`producer_resource`)."""


def producer_resource(driver: str) -> str:
    """The state's name for the pods of `driver`'s health producer (one watch per driver)."""
    return PRODUCER_PREFIX + driver


class DeviceStateStore:
    """The exporter's state; single-threaded (the observer applies everything in one task).

    The coordinator of the parts (one per source of evidence, see the module docstring): events
    go to the part that owns their kind, and the joins between sources happen here."""

    def __init__(
        self,
        clock: Clock,
        *,
        sink: DirectorySink | None = None,
        node_name: str | None = None,
        nvml: bool = False,
        slice_health_drivers: Iterable[str] = (),
        shard: Shard = UNSHARDED,
    ) -> None:
        """`slice_health_drivers`: DRA drivers whose device health is their ResourceSlice taints
        alone (`ObserverSettings.slice_health_drivers`). `shard`: keep only the objects of the
        nodes in this shard (`in_shard`), cluster mode split across exporters."""
        self._shard = shard
        self._owns = OwnedNodes(shard)
        self._clock = clock
        self.node_name = node_name
        self.stats = StateStats()
        self.table = DeviceTable(sink, self.stats, frozenset(slice_health_drivers))
        self.pods = PodReports(self, self.table, clock)
        self.layout = PodLayout(self, self.table)
        self.slices = SliceEvidence(self, self.table, clock, node_name)
        self.identity: IdentityIndex = self.slices.identity
        self.nodes = NodeEvidence(self, self.table, clock)
        self.producers = HealthProducers(self.table, clock.now)
        self.nvml = NvmlEvidence(self, self.table, clock, node_name, nvml=nvml)
        self.listed = ListedAssignments(self, self.table, node_name)
        self.directory = DirectorySync(self, self.table, shard, self._owns)

    @property
    def _sink(self) -> DirectorySink | None:
        """The table's sink (`bench_exporter_events` detaches it for its memory-only ablation)."""
        return self.table.sink

    @_sink.setter
    def _sink(self, sink: DirectorySink | None) -> None:
        self.table.sink = sink

    # ----- reading -----------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The current state as an immutable Snapshot (cached until the next change)."""
        table, pods = self.table, self.pods
        if pods.confirmed or pods.dirty_pods or table.dirty_allocations:
            self.sync()
        if table.snapshot is None:
            table.shared = True
            table.snapshot = Snapshot(
                devices=MappingProxyType(table.devices),
                nodes=MappingProxyType(dict(self.nodes.leases)),
                nvml=self.nvml.view,
                node_name=self.node_name,
                producers=MappingProxyType(dict(self.producers.states)),
            )
        return table.snapshot

    def device(self, node: str, device: str) -> DeviceState | None:
        """The device as the next snapshot will show it."""
        self.sync()
        return self.table.devices.get((node, device))

    def sync(self) -> None:
        """Fold everything pending into the devices, and hand it to the sink (snapshots call this)."""
        table, pods = self.table, self.pods
        table.fold_allocations()
        devices = table.devices
        for pod, seen in pods.confirmations(pods.confirmed):
            for key, (health, message) in pod.values.items():
                current = devices.get(key)
                if (
                    current is not None
                    and current.observed_at < seen
                    and current.health == health
                    and current.message == message
                ):
                    table.put(key, observed(current, seen))
                    # The first put may copy the dict a snapshot holds: read the copy from
                    # then on, or a shared device's later confirmation reads a stale time.
                    devices = table.devices
        pods.confirmed.clear()
        self.directory.sync_sink()

    def sync_sink(self) -> None:
        """Hand pending confirmations and pod versions to the sink without rebuilding devices."""
        self.directory.sync_sink()

    @property
    def devices_tracked(self) -> int:
        return len(self.table.devices)

    # ----- events ------------------------------------------------------------------

    def apply_event(self, resource: str, event_type: str, obj: Any) -> None:
        """Apply one watch event (ADDED, MODIFIED, DELETED) of one of RESOURCES.

        Sharded, an object of another shard's node is dropped here, before it is parsed or kept.
        """
        if self._shard.sharded and not in_shard(self._owns, resource, obj):
            return
        if resource == PODS:
            self.pods.apply_pod(event_type, obj)
        elif resource == CLAIMS:
            self.slices.apply_claim(event_type, obj)
        elif resource == SLICES:
            self.slices.apply_slice(event_type, obj)
        elif resource == LEASES:
            self.nodes.apply_lease(event_type, obj)
        elif resource == NODES:
            self.nodes.apply_node(event_type, obj)
        elif resource.startswith(PRODUCER_PREFIX):
            self.producers.apply_producer(resource[len(PRODUCER_PREFIX) :], event_type, obj)
        else:
            raise ValueError(f"unknown resource {resource!r}")

    def relist(self, resource: str, items: Iterable[Any]) -> None:
        """Replace everything known of `resource` with a full list (after a relist)."""
        seen: set[Any] = set()
        self.relist_page(resource, items, seen)
        self.relist_end(resource, seen)

    def relist_page(self, resource: str, items: Iterable[Any], seen: set[Any]) -> None:
        """Apply one page of a list in progress, adding to `seen` the keys it names.

        Sharded, another shard's objects are skipped and left out of `seen`, so whatever of
        theirs the store held (restored from the directory before the shard count changed) goes
        at `relist_end`."""
        sharded = self._shard.sharded
        for obj in items:
            if sharded and not in_shard(self._owns, resource, obj):
                continue
            if resource == PODS:
                self.pods.apply_pod("ADDED", obj, listed=True)
            else:
                self.apply_event(resource, "ADDED", obj)
            seen.add(_list_key(resource, obj))

    def relist_end(self, resource: str, seen: set[Any]) -> None:
        """End a list whose pages named `seen`: what they did not name is gone."""
        if resource == PODS:
            for uid in [u for u in self.pods.pods if u not in seen]:
                self.pods.remove(uid)
        elif resource == CLAIMS:
            self.slices.relist_claims_end(seen)
        elif resource == SLICES:
            self.slices.relist_slices_end(seen)
        elif resource == LEASES:
            for node in [n for n in self.nodes.leases if n not in seen]:
                self.node_gone(node)
        elif resource == NODES:
            self.nodes.relist_nodes_end(seen)
        elif resource.startswith(PRODUCER_PREFIX):
            self.producers.relist_end(resource[len(PRODUCER_PREFIX) :], seen)

    def apply_pod(self, event_type: str, obj: Any, *, listed: bool = False) -> None:
        """Apply one pod event (`PodReports.apply_pod`)."""
        self.pods.apply_pod(event_type, obj, listed=listed)

    def apply_claim(self, event_type: str, obj: Any) -> None:
        self.slices.apply_claim(event_type, obj)

    def apply_slice(self, event_type: str, obj: Any) -> None:
        self.slices.apply_slice(event_type, obj)

    def apply_lease(self, event_type: str, obj: Any) -> None:
        self.nodes.apply_lease(event_type, obj)

    def apply_node(self, event_type: str, obj: Any) -> None:
        """One Node event: its device-plugin GPU counts (`NodeEvidence.apply_node`)."""
        self.nodes.apply_node(event_type, obj)

    def apply_producer(self, driver: str, event_type: str, obj: Any) -> None:
        """One event of a pod of `driver`'s health producer (`HealthProducers.apply_producer`)."""
        self.producers.apply_producer(driver, event_type, obj)

    def apply_nvml(self, readings: Iterable[DeviceReading], xids: Iterable[XidEvent]) -> None:
        """Node mode: take the latest NVML poll (`NvmlEvidence.apply_nvml`)."""
        self.nvml.apply_nvml(readings, xids)

    def apply_pod_resources(self, allocatable: Allocatable | None) -> None:
        """Node mode: the kubelet's allocatable devices (`NvmlEvidence.apply_pod_resources`)."""
        self.nvml.apply_pod_resources(allocatable)

    def apply_assignments(self, assignments: Assignments | None) -> None:
        """Node mode: the kubelet's `List` (`ListedAssignments.apply_assignments`)."""
        self.listed.apply_assignments(assignments)

    # ----- restart -----------------------------------------------------------------

    def restore(
        self,
        devices: Iterable[DeviceState],
        *,
        removed_versions: Mapping[DeviceKey, int] = MappingProxyType({}),
        pods: Iterable[PodVersion] = (),
        leases: Mapping[str, float | None] = MappingProxyType({}),
    ) -> None:
        """Start from what the directory persisted (`DirectorySync.restore`)."""
        self.directory.restore(devices, removed_versions=removed_versions, pods=pods, leases=leases)

    # ----- joins between sources ---------------------------------------------------

    def handed_back(self, key: DeviceKey) -> None:
        """Nobody holds the device any more: its ResourceSlice, else NVML, else (a device-plugin
        GPU whose node has every registered device allocatable) its node speaks for it from now on."""
        device = self.table.devices[key]
        sliced = self.slices.speaking_slice(device)
        if sliced is not None:
            self.slices.from_slice(key, sliced, self._clock.now())
            return
        reading = self.nvml.reading(key, device)
        if reading is not None:
            self.nvml.from_nvml(key, reading, self._clock.now())
            return
        node = self.nodes.counts.get(key[0])
        if node is not None:
            self.nodes.from_node(key, *node)

    def superseded(self, device: DeviceState) -> bool:
        """Whether a device's identity was provisional and another now stands for it."""
        if device.device.startswith(UNRESOLVED_PREFIX):
            return True
        if device.device in self.nvml.mig_parent:
            return True  # a partition held before NVML named its card: the card holds it now
        return self.slices.superseded(device)

    def node_gone(self, node: str) -> None:
        """The node's Lease was deleted (the node was): what only it could report on goes."""
        self.producers.node_gone(node)
        self.nodes.lease_gone(node)
        table = self.table
        for key in [k for k in table.devices if k[0] == node and not table.contrib.get(k)]:
            table.delete(key)


def object_node(resource: str, obj: Any) -> str | None:
    """The node an object of `resource` belongs to; None when it names none it can be read from.

    Pods (device holders and health producers) and ResourceSlices by `spec.nodeName`, Leases and
    Nodes by their name (a kubelet Lease is named after its node). Claims name no node."""
    if resource == PODS and obj.__class__ is Pod:
        spec = obj.spec
        return (spec.node_name or None) if spec is not None else None
    if not isinstance(obj, dict):
        return None
    if resource in (LEASES, NODES):
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
    elif resource in (PODS, SLICES) or resource.startswith(PRODUCER_PREFIX):
        spec = obj.get("spec")
        name = spec.get("nodeName") if isinstance(spec, dict) else None
    else:
        return None
    return name if isinstance(name, str) and name else None


def in_shard(owns: Callable[[str], bool], resource: str, obj: Any) -> bool:
    """Whether a sharded store keeps `obj` (an object of `resource`); `owns`: whether the store's
    shard owns a node (`Shard.owns`, or its memo `OwnedNodes`).

    An object of a node is kept by that node's shard only. What names no node:
    - a pod not yet bound to a node (Pending, no `spec.nodeName`) holds no device yet: no shard
      keeps it; its first event on a node reaches the node's shard as new. A health producer
      pod likewise (it says nothing about a node until it is on one);
    - ResourceClaims (namespaced, no node) and ResourceSlices of no single node (network-attached
      devices): every shard keeps them, since a pod of any node may hold what they name;
    - an object too malformed to name its node (a Lease or Node without a name, a pod whose spec
      is not an object): every shard passes it on, and the store counts it as a parse error.
    """
    node = object_node(resource, obj)
    if node is not None:
        return owns(node)
    if resource == PODS or resource.startswith(PRODUCER_PREFIX):
        spec = obj.spec if obj.__class__ is Pod else obj.get("spec") if isinstance(obj, dict) else None
        if obj.__class__ is Pod or isinstance(spec, dict):
            return False
    return True


def _list_key(resource: str, obj: Any) -> Any:
    """The identity a relist compares by (matching what the apply methods store)."""
    if obj.__class__ is Pod:  # a pod decoded from its list page (`exporter.decode.decode_pod_page`)
        smeta = obj.metadata
        return None if smeta is None else (smeta.uid or f"{smeta.namespace}/{smeta.name}")
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None
    if resource == PODS:
        uid = meta.get("uid")
        return uid if isinstance(uid, str) and uid else f"{meta.get('namespace')}/{meta.get('name')}"
    # A name that is not a string was rejected (and counted) by the apply method: it keys
    # nothing, and must not reach the set of seen keys (a dict or list there is unhashable).
    name = meta.get("name")
    if resource.startswith(PRODUCER_PREFIX):
        namespace = meta.get("namespace")
        return f"{namespace}/{name}" if isinstance(namespace, str) and isinstance(name, str) else None
    if resource == CLAIMS:
        namespace = meta.get("namespace")
        return (namespace, name) if isinstance(namespace, str) and isinstance(name, str) else None
    return name if isinstance(name, str) else None
