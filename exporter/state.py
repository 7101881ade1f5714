"""In-memory device state: applies watched objects and NVML readings, produces Snapshots.

Owns the rules of the state model:

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

import collections
import dataclasses
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from exporter import parse
from exporter.decode import Pod, pod_from_dict
from exporter.identity import (
    ClaimInfo,
    DeviceRef,
    IdentityIndex,
    parse_claim,
    parse_slice,
)
from exporter.identity import (
    GovernedDevice as SliceDevice,
)
from exporter.nodealloc import NodeCounts, NodeCountsError, gpu_counts, speaks_healthy, unvouched
from exporter.parse import (
    PodObservation,
    ResourceEntry,
    kept_signature,
    parse_pod_struct,
    pod_signature,
    pod_struct_signature,
)
from exporter.podresources import Allocatable, Assigned, Assignments
from exporter.sharding import UNSHARDED, OwnedNodes, Shard
from exporter.snapshot import (
    DEVICE_FIELDS,
    SOURCE_NODE,
    SOURCE_NVML,
    SOURCE_POD,
    SOURCE_SLICE,
    Allocation,
    DeviceState,
    DriverTaint,
    NodeState,
    NvmlView,
    ProducerState,
    Snapshot,
    compiled_function,
)
from gpuhealth.clock import Clock
from gpuhealth.kube.meta import NODE_LEASE_NAMESPACE, is_newer, parse_rfc3339
from gpuhealth.nvml import DeviceReading, XidEvent

DeviceKey = tuple[str, str]
"""(node, device)."""

PODS, CLAIMS, SLICES, LEASES, NODES = "pods", "resourceclaims", "resourceslices", "leases", "nodes"
RESOURCES = (PODS, CLAIMS, SLICES, LEASES, NODES)
PRODUCER_PREFIX = "health-producer/"
"""`health-producer/<driver>`: the pods of one DRA driver's health producer (`producer_resource`)."""


def producer_resource(driver: str) -> str:
    """The state's name for the pods of `driver`'s health producer (one watch per driver)."""
    return PRODUCER_PREFIX + driver


UNRESOLVED_PREFIX = "unresolved/"
_SEVERITY = {"Healthy": 0, "Unknown": 1, "Unhealthy": 2}

# Reasons an event was not applied (`gpuhealth_exporter_events_ignored_total{reason}`).
DUPLICATE = "duplicate"
OUT_OF_ORDER = "out_of_order"


class ObservationRecord(NamedTuple):
    """One row of the directory's append-only log: a device status change and its evidence.

    A NamedTuple: it is written as a row as is (the field order is the log's column order)."""

    node: str
    device: str
    status_version: int
    observed_at: float
    health: str
    message: str
    namespace: str = ""
    pod: str = ""
    container: str = ""
    resource: str = ""
    claim: str = ""
    pod_resource_version: str = ""


@dataclass(frozen=True, slots=True)
class PodVersion:
    """The latest processed resourceVersion of one pod (restored after a restart)."""

    uid: str
    namespace: str
    name: str
    resource_version: str


class DirectorySink(Protocol):
    """Where state changes are persisted; the SQLite directory batches and writes them."""

    def record_change(self, device: DeviceState, observation: ObservationRecord) -> None: ...

    def record_device(self, device: DeviceState) -> None:
        """Allocations or identity attributes changed, the status did not."""
        ...

    def record_allocations(self, device: DeviceState) -> None:
        """Only allocations changed (a pod came or went), the status and identity did not."""
        ...

    def record_heartbeats(self, keys: Iterable[DeviceKey], observed_at: float) -> None:
        """These devices' statuses were confirmed at `observed_at` (later ones win)."""
        ...

    def record_removed(self, node: str, device: str) -> None: ...

    def record_pod(self, pod: PodVersion) -> None: ...

    def forget_pod(self, uid: str) -> None: ...

    def record_lease(self, node: str, renewed_at: float | None) -> None: ...


@dataclass(slots=True)
class _Pod:
    uid: str
    namespace: str
    name: str
    resource_version: str
    rv_number: int | None = None
    signature: object = None
    """`parse.pod_struct_signature` or `parse.pod_signature` of the last applied version."""
    observation: PodObservation | None = None
    """None for a pod restored from the directory and not seen since."""
    values: dict[DeviceKey, tuple[str, str]] = field(default_factory=dict)
    """Per device: the (health, message) this pod reported last."""
    allocations: dict[DeviceKey, tuple[Allocation, ...]] = field(default_factory=dict)
    uses: set[tuple[str, ...]] = field(default_factory=set)
    """Claims ("claim", ns, name) and slice devices ("ref", driver, pool, device) it depends on."""
    layout: tuple[Any, ...] | None = None
    """(node, terminal, [(container, resource, resourceID, claim)]) of the last full apply."""
    entry_keys: list[DeviceKey] | None = None
    """The device key of each entry of the last full apply, in order."""
    silent: dict[DeviceKey, tuple[Allocation, ...]] = field(default_factory=dict)
    """Devices it holds with no report on them: through `status.extendedResourceClaimStatus`, or
    as the kubelet's `List` names them (node mode, before Kubernetes 1.36)."""


class _Meta(NamedTuple):
    """Identity attributes of a device as one pod's entries establish them."""

    uuid: str = ""
    driver: str = ""
    pool: str = ""
    device_name: str = ""
    resource: str = ""


@dataclass(slots=True)
class StateStats:
    """Plain counters the self-metrics collector reads (the state never touches Prometheus)."""

    parse_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    events_ignored: collections.Counter[str] = field(default_factory=collections.Counter)
    status_changes: int = 0
    pod_resources_failures: int = 0
    """Pod-resources reads that gave no answer (node mode): the evidence stayed as it was."""


MIG_PREFIX = "MIG-"
"""A MIG device's UUID begins so (driver R470 and later); the card's begins `GPU-`."""


def _device_uuid(device_id: str) -> str:
    """A device-plugin ID is the GPU UUID for NVIDIA (GPU-... or MIG-...); other plugins: none."""
    return device_id if device_id.startswith(("GPU-", "MIG-")) else ""


class DeviceStateStore:
    """The exporter's state; single-threaded (the observer applies everything in one task)."""

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
        self._now = clock.now
        self._sink = sink
        self._node_name = node_name
        self.stats = StateStats()
        self.identity = IdentityIndex()
        self._devices: dict[DeviceKey, DeviceState] = {}
        self._shared = False
        """True while the current `_devices` dict is referenced by a handed-out snapshot."""
        self._confirmed: dict[str, float] = {}
        """Pods (uid) whose reports were confirmed since the last sync, and when."""
        self._unpersisted: dict[str, float] = {}
        """The same confirmations, until handed to the sink (which may happen before a snapshot)."""
        self._dirty_pods: set[str] = set()
        """Pods whose resourceVersion moved since the last sync."""
        self._dirty_allocations: set[DeviceKey] = set()
        """Devices whose allocations moved since the last sync."""
        self._contrib: dict[DeviceKey, dict[str, tuple[Allocation, ...]]] = {}
        self._silent: dict[DeviceKey, dict[str, tuple[Allocation, ...]]] = {}
        """Per device, by pod uid: allocations held with no report, through a DRA-backed extended
        resource's claim (KEP-5004) or as the kubelet's `List` names them (`apply_assignments`).
        Published with the others, never a health source: such pods report nothing on the device,
        so its slice (or NVML) keeps speaking for it."""
        self._version_floor: dict[DeviceKey, int] = {}
        self._idle_sources: dict[DeviceKey, str] = {}
        """Devices handed back to a source that agrees with their health, until the next fold."""
        self._pods: dict[str, _Pod] = {}
        self._users: dict[tuple[str, ...], set[str]] = {}
        self._ref_keys: dict[DeviceRef, set[DeviceKey]] = {}
        self._nodes: dict[str, NodeState] = {}
        self._nvml: NvmlView | None = NvmlView() if nvml else None
        self._mig_parent: dict[str, str] = {}
        """Node mode: each MIG device's card (MIG UUID -> card UUID), from NVML. A partition's pods
        are held on its card: the card is the device gpuhealth governs."""
        self._allocatable: Allocatable | None = None
        """Node mode: the kubelet's allocatable device-plugin devices, as last read (None: never)."""
        self._listed: Mapping[tuple[str, str], tuple[Assigned, ...]] = {}
        """Node mode: the device-plugin devices the kubelet's `List` last named, by (namespace, pod).
        Held with no report by a pod whose status names none of them (before Kubernetes 1.36)."""
        self._listed_waiting = False
        """A listed device was not tracked yet (NVML had not read it): the next poll holds it."""
        self._node_counts: dict[str, tuple[NodeCounts, float]] = {}
        """By node: its device-plugin GPU counts (`exporter.nodealloc`), and since when they are
        what they are (an update that changes no count keeps the time)."""
        self._node_keys: dict[str, set[DeviceKey]] = {}
        """By node: its devices' keys, so a count change looks at its node's devices only (the
        first list of 10,000 Nodes must not scan 80,000 devices for each)."""
        self._producer_pods: dict[tuple[str, str], _ProducerPod] = {}
        """By (driver, namespace/name): the health producer pods seen on a node."""
        self._producers: dict[tuple[str, str], ProducerState] = {}
        """By (node, driver): each node's health producer, kept after its last pod is gone."""
        self._snapshot: Snapshot | None = None
        self._slice_drivers = frozenset(slice_health_drivers)
        """Drivers that stream no health to the kubelet: their slice speaks for held devices too."""

    # ----- reading -----------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The current state as an immutable Snapshot (cached until the next change)."""
        if self._confirmed or self._dirty_pods or self._dirty_allocations:
            self.sync()
        if self._snapshot is None:
            self._shared = True
            self._snapshot = Snapshot(
                devices=MappingProxyType(self._devices),
                nodes=MappingProxyType(dict(self._nodes)),
                nvml=self._nvml,
                node_name=self._node_name,
                producers=MappingProxyType(dict(self._producers)),
            )
        return self._snapshot

    def device(self, node: str, device: str) -> DeviceState | None:
        """The device as the next snapshot will show it."""
        self.sync()
        return self._devices.get((node, device))

    def sync(self) -> None:
        """Fold everything pending into the devices, and hand it to the sink (snapshots call this)."""
        self._fold_allocations()
        devices = self._devices
        for pod, seen in self._confirmations(self._confirmed):
            for key, (health, message) in pod.values.items():
                current = devices.get(key)
                if (
                    current is not None
                    and current.observed_at < seen
                    and current.health == health
                    and current.message == message
                ):
                    self._put(key, _observed(current, seen))
                    # The first _put may copy the dict a snapshot holds: read the copy from
                    # then on, or a shared device's later confirmation reads a stale time.
                    devices = self._devices
        self._confirmed.clear()
        self.sync_sink()

    def sync_sink(self) -> None:
        """Hand pending confirmations and pod versions to the sink without rebuilding devices.

        The directory needs only the times; rebuilding 80,000 immutable devices is left to
        the next snapshot, which a scrape asks for far less often than the directory writes.
        """
        self._fold_allocations()
        sink = self._sink
        if sink is not None:
            devices = self._devices
            for pod, seen in self._confirmations(self._unpersisted):
                confirmed = []
                for key, (health, message) in pod.values.items():
                    current = devices.get(key)
                    if current is not None and current.health == health and current.message == message:
                        confirmed.append(key)
                if confirmed:
                    sink.record_heartbeats(confirmed, seen)
            for uid in self._dirty_pods:
                dirty = self._pods.get(uid)
                if dirty is not None:
                    sink.record_pod(PodVersion(uid, dirty.namespace, dirty.name, dirty.resource_version))
        self._unpersisted.clear()
        self._dirty_pods.clear()

    def _confirmations(self, pending: dict[str, float]) -> Iterator[tuple[_Pod, float]]:
        """(pod, time it confirmed its reports up to) for each pending confirmation."""
        pods, nodes = self._pods, self._nodes
        for uid, seen in pending.items():
            pod = pods.get(uid)
            if pod is None:
                continue
            node = pod.observation.node if pod.observation is not None else ""
            lease = nodes.get(node)
            if lease is not None and lease.lease_renewed_at is not None and lease.lease_renewed_at < seen:
                # A repeat is evidence of the value, not of a live kubelet: other writers (the
                # node lifecycle controller marking pods not ready) update the pods of a node
                # whose kubelet stopped. It confirms up to the node's latest Lease renewal.
                seen = lease.lease_renewed_at
            yield pod, seen

    def _fold_allocations(self) -> None:
        if not self._dirty_allocations:
            return
        devices, contrib, idle_sources = self._devices, self._contrib, self._idle_sources
        record = self._sink.record_allocations if self._sink is not None else None
        for key in self._dirty_allocations:
            current = devices.get(key)
            if current is None:
                continue
            contributions = contrib.get(key)
            if not contributions:
                merged: tuple[Allocation, ...] = ()
            elif len(contributions) == 1:
                (merged,) = contributions.values()
            else:
                merged = _merge(contributions)
            reporting = bool(merged)
            silent = self._silent.get(key)
            if silent:
                merged = _merge({**(contributions or {}), **silent})
            # Who vouches follows who holds: a pod while any reporting one does (its driver's
            # slice for a slice-health driver), else the idle source that took the device back
            # (`_idle_status`), else what it was.
            if reporting:
                source = self._held_source(current.driver)
                if idle_sources:
                    idle_sources.pop(key, None)
            elif idle_sources:
                source = idle_sources.pop(key, current.source)
            else:
                source = current.source
            if (
                merged is not current.allocations and merged != current.allocations
            ) or source != current.source:
                updated = _with_holders(current, merged, source)
                if self._shared:
                    self._put(key, updated)  # copies the dict a snapshot holds, once
                    devices = self._devices
                else:
                    devices[key] = updated
                    self._snapshot = None
                if record is not None:
                    record(updated)
        self._dirty_allocations.clear()
        idle_sources.clear()  # only keys of dirty devices are ever pending

    @property
    def devices_tracked(self) -> int:
        return len(self._devices)

    # ----- events ------------------------------------------------------------------

    def apply_event(self, resource: str, event_type: str, obj: Any) -> None:
        """Apply one watch event (ADDED, MODIFIED, DELETED) of one of RESOURCES.

        Sharded, an object of another shard's node is dropped here, before it is parsed or kept.
        """
        if self._shard.sharded and not in_shard(self._owns, resource, obj):
            return
        if resource == PODS:
            self.apply_pod(event_type, obj)
        elif resource == CLAIMS:
            self.apply_claim(event_type, obj)
        elif resource == SLICES:
            self.apply_slice(event_type, obj)
        elif resource == LEASES:
            self.apply_lease(event_type, obj)
        elif resource == NODES:
            self.apply_node(event_type, obj)
        elif resource.startswith(PRODUCER_PREFIX):
            self.apply_producer(resource[len(PRODUCER_PREFIX) :], event_type, obj)
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
                self.apply_pod("ADDED", obj, listed=True)
            else:
                self.apply_event(resource, "ADDED", obj)
            seen.add(_list_key(resource, obj))

    def relist_end(self, resource: str, seen: set[Any]) -> None:
        """End a list whose pages named `seen`: what they did not name is gone."""
        if resource == PODS:
            for uid in [u for u in self._pods if u not in seen]:
                self._remove_pod(uid)
        elif resource == CLAIMS:
            for key in [k for k in self.identity.claims if k not in seen]:
                self._claim_gone(*key)
        elif resource == SLICES:
            for name in [n for n in self.identity.slices if n not in seen]:
                self._slice_changed(self.identity.drop_slice(name))
        elif resource == LEASES:
            for node in [n for n in self._nodes if n not in seen]:
                self._node_gone(node)
        elif resource == NODES:
            for node in [n for n in self._node_counts if n not in seen]:
                del self._node_counts[node]
        elif resource.startswith(PRODUCER_PREFIX):
            driver = resource[len(PRODUCER_PREFIX) :]
            for key in [k for k in self._producer_pods if k[0] == driver and k[1] not in seen]:
                self._producer_pod_gone(key)

    def apply_pod(self, event_type: str, obj: Any, *, listed: bool = False) -> None:
        """Apply one pod event; `listed`: it comes from a relist, where the same version is no duplicate.

        `obj` is a decoded `exporter.decode.Pod` (the watch's fast path) or a dict; a dict
        whose types fit is converted to one, so a listed pod and its watched updates share
        one signature; a dict that does not fit takes the tolerant dict path.
        """
        if obj.__class__ is not Pod:
            obj = pod_from_dict(obj) or obj
        struct: Pod | None = obj if obj.__class__ is Pod else None
        if struct is not None:
            smeta = struct.metadata
            if smeta is None:
                self.stats.parse_errors[parse.MALFORMED_POD] += 1
                return
            uid = smeta.uid or f"{smeta.namespace}/{smeta.name}"
            if event_type == "DELETED":
                self._remove_pod(uid)
                return
            rv = smeta.resource_version or ""
            signature: object = pod_struct_signature(struct)
        else:
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            if not isinstance(meta, dict):
                self.stats.parse_errors[parse.MALFORMED_POD] += 1
                return
            muid = meta.get("uid")
            uid = muid if isinstance(muid, str) and muid else f"{meta.get('namespace')}/{meta.get('name')}"
            if event_type == "DELETED":
                self._remove_pod(uid)
                return
            mrv = meta.get("resourceVersion")
            rv = mrv if isinstance(mrv, str) else ""
            signature = pod_signature(obj)
        rv_int = int(rv) if rv.isdigit() else None
        pod = self._pods.get(uid)
        if pod is not None and pod.observation is not None:
            if rv == pod.resource_version:
                if not listed:
                    self.stats.events_ignored[DUPLICATE] += 1
                return
            if rv_int is not None and pod.rv_number is not None and rv_int < pod.rv_number:
                self.stats.events_ignored[OUT_OF_ORDER] += 1
                return
            if signature is not None and signature == pod.signature:
                # Nothing device-related moved: the pod confirms what it reported (the hot path).
                pod.resource_version, pod.rv_number = rv, rv_int
                self._confirmed[uid] = self._unpersisted[uid] = self._now()
                self._dirty_pods.add(uid)
                self._snapshot = None
                return
        elif pod is not None and rv and not is_newer(rv, pod.resource_version):
            # Restored from the directory: only what is newer than the persisted version counts.
            if not listed or rv != pod.resource_version:
                self.stats.events_ignored[DUPLICATE if rv == pod.resource_version else OUT_OF_ORDER] += 1
            return
        # Past the hot path (an equal signature implies an unchanged phase): is it terminal?
        if struct is not None:
            status = struct.status
            terminal = status is not None and status.phase in parse.TERMINAL_PHASES
        else:
            terminal = parse.is_terminal_status(obj.get("status"))
        if pod is not None and pod.observation is not None and terminal:
            # Succeeded or Failed: the devices are released whatever the entries say (no parse).
            pod.resource_version, pod.rv_number = rv, rv_int
            pod.signature = kept_signature(signature)
            self._terminate(pod)
            self._dirty_pods.add(uid)
            return
        observation = parse.parse_pod(obj) if struct is None else parse_pod_struct(struct)
        if observation is None:
            self.stats.parse_errors[parse.MALFORMED_POD] += 1
            return
        for reason in observation.errors:
            self.stats.parse_errors[reason] += 1
        if pod is None:
            pod = _Pod(uid, observation.namespace, observation.name, rv)
            self._pods[uid] = pod
        pod.resource_version, pod.rv_number = rv, rv_int
        pod.signature = kept_signature(signature)
        self._apply_observation(pod, observation, self._clock.now())
        self._dirty_pods.add(uid)

    def apply_claim(self, event_type: str, obj: Any) -> None:
        claim = parse_claim(obj)
        if isinstance(claim, str):
            self.stats.parse_errors[claim] += 1
            return
        if event_type == "DELETED":
            self._claim_gone(claim.namespace, claim.name)
        elif self.identity.put_claim(claim):
            self._reapply(("claim", claim.namespace, claim.name))

    def apply_slice(self, event_type: str, obj: Any) -> None:
        parsed = parse_slice(obj)
        if isinstance(parsed, str):
            self.stats.parse_errors[parsed] += 1
            return
        name, devices = parsed
        if event_type == "DELETED":
            self._slice_changed(self.identity.drop_slice(name))
        else:
            self._slice_changed(self.identity.put_slice(name, devices))

    def apply_lease(self, event_type: str, obj: Any) -> None:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            self.stats.parse_errors[parse.MALFORMED_LEASE] += 1
            return
        if meta.get("namespace", NODE_LEASE_NAMESPACE) != NODE_LEASE_NAMESPACE:  # type: ignore[union-attr]
            return
        if event_type == "DELETED":
            self._node_gone(name)
            return
        spec = obj.get("spec")
        renewed = parse_rfc3339(spec.get("renewTime")) if isinstance(spec, dict) else None
        if renewed is None and isinstance(spec, dict) and spec.get("renewTime") is not None:
            self.stats.parse_errors[parse.MALFORMED_LEASE] += 1
        previous = self._nodes.get(name)
        if previous is not None and previous.lease_renewed_at == renewed:
            return
        self._nodes[name] = NodeState(node=name, lease_renewed_at=renewed)
        self._snapshot = None
        if self._sink is not None:
            self._sink.record_lease(name, renewed)

    def apply_node(self, event_type: str, obj: Any) -> None:
        """One Node event: its device-plugin GPU counts, which speak for its idle device-plugin GPUs.

        Only a change of the counts is looked at further (the kubelet rewrites its node's status
        for conditions, images and addresses far more often than a device's health moves). When
        every registered device is allocatable again, each idle device-plugin GPU of the node no
        other source speaks for and that is not Healthy turns Healthy (`exporter.nodealloc`); a
        count below capacity names no device: it makes none Unhealthy, and takes back only the
        Healthy the counts alone gave (`unvouched`: Unknown, unless a known failure explains it)."""
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            self.stats.parse_errors[parse.MALFORMED_NODE] += 1
            return
        if event_type == "DELETED":
            self._node_counts.pop(name, None)
            return
        try:
            counts = gpu_counts(obj)
        except NodeCountsError:
            # The last counts stand: a status that cannot be read says nothing new.
            self.stats.parse_errors[parse.MALFORMED_NODE] += 1
            return
        previous = self._node_counts.get(name)
        if previous is not None and previous[0] == counts:
            return
        now = self._clock.now()
        self._node_counts[name] = (counts, now)
        keys = sorted(self._node_keys.get(name, ()))
        if counts.all_allocatable:
            for key in keys:
                self._from_node(key, counts, now)
            return
        held = {k: bool(self._contrib.get(k)) or bool(self._silent.get(k)) for k in keys}
        for device in unvouched(counts, ((self._devices[k], held[k]) for k in keys)):
            key = (device.node, device.device)
            self._idle_status(key, "Unknown", counts.short_message(), SOURCE_NODE, now, None, device.uuid)

    def _from_node(self, key: DeviceKey, counts: NodeCounts, since: float) -> None:
        """An idle device-plugin GPU takes its node's word (`speaks_healthy`), where neither a
        ResourceSlice nor NVML speaks for it (they name the device; a count does not)."""
        device = self._devices.get(key)
        if device is None or self._speaking_slice(device) is not None:
            return
        if self._nvml is not None and key[0] == self._node_name and device.uuid in self._nvml.readings:
            return
        held = bool(self._contrib.get(key)) or bool(self._silent.get(key))
        if speaks_healthy(counts, since, device, held=held):
            now = self._clock.now()
            self._idle_status(key, "Healthy", counts.message(), SOURCE_NODE, now, None, device.uuid)

    def apply_producer(self, driver: str, event_type: str, obj: Any) -> None:
        """One event of a pod of `driver`'s health producer (`HealthProducer`): its node and readiness.

        Ready is the pod's Ready condition; its lastTransitionTime, when it turned False, is when
        the producer stopped confirming. A pod not yet on a node says nothing about one.
        """
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        namespace = meta.get("namespace") if isinstance(meta, dict) else None
        if not (isinstance(name, str) and name and isinstance(namespace, str)):
            self.stats.parse_errors[parse.MALFORMED_PRODUCER] += 1
            return
        key = (driver, f"{namespace}/{name}")
        if event_type == "DELETED":
            self._producer_pod_gone(key)
            return
        spec = obj.get("spec")
        node = spec.get("nodeName") if isinstance(spec, dict) else None
        if not isinstance(node, str) or not node:
            return
        ready, since = _pod_ready(obj.get("status"))
        previous = self._producer_pods.get(key)
        self._producer_pods[key] = _ProducerPod(node, ready, since)
        if previous is not None and previous.node != node:
            self._producer_changed(previous.node, driver)
        self._producer_changed(node, driver)

    def _producer_pod_gone(self, key: tuple[str, str]) -> None:
        pod = self._producer_pods.pop(key, None)
        if pod is not None:
            self._producer_changed(pod.node, key[0], gone_at=self._now())

    def _producer_changed(self, node: str, driver: str, *, gone_at: float | None = None) -> None:
        """Fold the node's producer pods of `driver` into its ProducerState.

        Ready while any pod is. Down since: kept while it stays down (a replacement pod that is
        not Ready yet does not restart the count); on going down, the latest moment a pod left
        Ready (its condition's transition, or the deletion the exporter saw).
        """
        pods = [p for (d, _), p in self._producer_pods.items() if d == driver and p.node == node]
        previous = self._producers.get((node, driver))
        if any(p.ready for p in pods):
            state = ProducerState(node, driver, True)
        elif previous is not None and previous.down_since is not None:
            state = previous
        else:
            moments = [p.since if p.since is not None else self._now() for p in pods]
            if gone_at is not None:
                moments.append(gone_at)
            state = ProducerState(node, driver, False, max(moments) if moments else self._now())
        if state != previous:
            self._producers[(node, driver)] = state
            self._snapshot = None

    def apply_nvml(self, readings: Iterable[DeviceReading], xids: Iterable[XidEvent]) -> None:
        """Node mode: take the latest NVML poll (readings by UUID) and count new XID events."""
        if self._nvml is None:
            return
        now = self._clock.now()
        by_uuid = {r.uuid: r for r in readings}
        read_at = dict(self._nvml.read_at)
        for uuid, reading in by_uuid.items():
            if reading.reachable:
                read_at[uuid] = now
        counts = dict(self._nvml.xid_counts)
        for event in xids:
            counts[(event.uuid, event.xid)] = counts.get((event.uuid, event.xid), 0) + 1
        self._nvml = NvmlView(readings=by_uuid, read_at=read_at, xid_counts=counts)
        self._snapshot = None
        mig_parent = {m.uuid: uuid for uuid, r in by_uuid.items() for m in r.mig_devices}
        if mig_parent != self._mig_parent:
            # A card repartitioned (or first read): the pods on its partitions resolve afresh.
            moved = {
                m
                for m in mig_parent.keys() | self._mig_parent.keys()
                if mig_parent.get(m) != self._mig_parent.get(m)
            }
            self._mig_parent = mig_parent
            for mig_uuid in sorted(moved):
                self._reapply(("mig", mig_uuid))
            if self._listed:
                self._relist_silent(self._listed)
        if self._node_name is not None:
            # Every GPU NVML lists is tracked, held or not: an idle one keeps evidence.
            for uuid, reading in by_uuid.items():
                self._from_nvml((self._node_name, uuid), reading, now)
            if self._listed_waiting:
                self._relist_silent(self._listed)  # the devices `List` named are tracked now

    def apply_pod_resources(self, allocatable: Allocatable | None) -> None:
        """Node mode: the kubelet's allocatable devices as just read (None: the read failed).

        It speaks for a device-plugin GPU no pod holds, with NVML: a GPU NVML reaches that the
        kubelet does not list is one its device plugin reports Unhealthy. A failed read changes
        no evidence (the last answer stands) and is counted."""
        if self._nvml is None or self._node_name is None:
            return
        if allocatable is None:
            self.stats.pod_resources_failures += 1
            return
        if allocatable == self._allocatable:
            return
        self._allocatable = allocatable
        now = self._clock.now()
        for uuid, reading in self._nvml.readings.items():
            self._from_nvml((self._node_name, uuid), reading, now)

    def apply_assignments(self, assignments: Assignments | None) -> None:
        """Node mode: the kubelet's `List` as just read (None: the read failed).

        Its device-plugin devices are held, with no report, by the pods whose status names none
        of them (before Kubernetes 1.36, or with `ResourceHealthStatus` off, no pod's does), so
        `gpu_device_allocation_info` says which pod has which GPU there too; they never speak for
        a device's health. A failed read keeps what the last answer held and is counted; an
        answer equal to the last changes nothing (one dict comparison per poll)."""
        if self._node_name is None:
            return
        if assignments is None:
            self.stats.pod_resources_failures += 1
            return
        previous, listed = self._listed, assignments.pods
        if listed == previous and not self._listed_waiting:
            return
        self._listed = listed
        named = previous.keys() | listed.keys()
        if not self._listed_waiting:
            named = {n for n in named if previous.get(n) != listed.get(n)}
        self._relist_silent(named)

    # ----- restart -----------------------------------------------------------------

    def restore(
        self,
        devices: Iterable[DeviceState],
        *,
        removed_versions: Mapping[DeviceKey, int] = MappingProxyType({}),
        pods: Iterable[PodVersion] = (),
        leases: Mapping[str, float | None] = MappingProxyType({}),
    ) -> None:
        """Start from what the directory persisted (before any event is applied).

        Status versions, first-seen, transition and Unknown-since times come back as they
        were. Pods come back as stubs holding their allocations and resourceVersion: events
        no newer than that are ignored, and a relist removes those that are gone.
        Sharded, devices and Leases of nodes outside the shard are not restored (the shard count
        changed since they were written): the shard that owns them now lists them afresh.
        """
        if self._shard.sharded:
            devices = [d for d in devices if self._owns(d.node)]
            leases = {node: renewed for node, renewed in leases.items() if self._owns(node)}
        by_name = {(p.namespace, p.name): p for p in pods}
        for pod_version in by_name.values():
            rv = pod_version.resource_version
            self._pods[pod_version.uid] = _Pod(
                pod_version.uid,
                pod_version.namespace,
                pod_version.name,
                rv,
                int(rv) if rv.isdigit() else None,
            )
        for device in devices:
            key = (device.node, device.device)
            self._put(key, device)
            if device.driver:
                self._ref_keys.setdefault((device.driver, device.pool, device.device_name), set()).add(key)
            for allocation in device.allocations:
                found = by_name.get((allocation.namespace, allocation.pod))
                uid = found.uid if found is not None else f"{allocation.namespace}/{allocation.pod}"
                pod = self._pods.get(uid)
                if pod is None:
                    pod = self._pods[uid] = _Pod(uid, allocation.namespace, allocation.pod, "")
                if device.source != SOURCE_POD:
                    # Held with no report (a DRA-backed extended resource, or from `List`): the fold makes any
                    # device a reporting pod holds `pod`-sourced, so another source means silent.
                    pod.silent[key] = (*pod.silent.get(key, ()), allocation)
                    self._silent.setdefault(key, {})[uid] = pod.silent[key]
                    continue
                pod.allocations[key] = (*pod.allocations.get(key, ()), allocation)
                pod.values[key] = (device.health, device.message)
                self._contrib.setdefault(key, {})[uid] = pod.allocations[key]
        self._version_floor.update(removed_versions)
        for node, renewed in leases.items():
            self._nodes[node] = NodeState(node=node, lease_renewed_at=renewed)
        self._snapshot = None

    # ----- internals ---------------------------------------------------------------

    def _put(self, key: DeviceKey, device: DeviceState) -> None:
        if self._shared:
            self._devices = dict(self._devices)
            self._shared = False
        if key not in self._devices:
            self._node_keys.setdefault(key[0], set()).add(key)
        self._devices[key] = device
        self._snapshot = None

    def _delete(self, key: DeviceKey) -> None:
        device = self._devices.get(key)
        if device is None:
            return
        if self._shared:
            self._devices = dict(self._devices)
            self._shared = False
        del self._devices[key]
        on_node = self._node_keys.get(key[0])
        if on_node is not None:
            on_node.discard(key)
            if not on_node:
                del self._node_keys[key[0]]
        self._dirty_allocations.discard(key)
        self._contrib.pop(key, None)
        self._version_floor[key] = device.status_version
        if device.driver:
            keys = self._ref_keys.get((device.driver, device.pool, device.device_name))
            if keys is not None:
                keys.discard(key)
        self._snapshot = None
        if self._sink is not None:
            self._sink.record_removed(*key)

    def _resolve(
        self, observation: PodObservation
    ) -> tuple[
        dict[DeviceKey, list[ResourceEntry]],
        dict[DeviceKey, _Meta],
        set[tuple[str, ...]],
        list[DeviceKey] | None,
    ]:
        """Group the pod's entries by device identity, noting what the resolution used.

        Also returns each entry's key in order (None when the pod has no node yet)."""
        grouped: dict[DeviceKey, list[ResourceEntry]] = {}
        metas: dict[DeviceKey, _Meta] = {}
        uses: set[tuple[str, ...]] = set()
        entry_keys: list[DeviceKey] = []
        node = observation.node
        if not node:
            return grouped, metas, uses, None
        namespace = observation.namespace
        identity = self.identity
        claims: dict[str, ClaimInfo | None] = {}
        """This pod's claims by name, looked up once (its entries usually share one)."""
        for entry in observation.entries:
            if not entry.pod_claim:
                device = entry.device
                if device.startswith(MIG_PREFIX):
                    # A MIG partition: held on its card once NVML says which (node mode).
                    uses.add(("mig", device))
                    device = self._mig_parent.get(device, device)
                key = (node, device)
                group = grouped.get(key)
                if group is None:
                    # Positional: keyword NamedTuple construction costs over twice as much.
                    grouped[key] = [entry]
                    metas[key] = _Meta(_device_uuid(device), "", "", "", entry.resource)
                else:
                    group.append(entry)
                entry_keys.append(key)
                continue
            resolved = None
            if entry.claim:
                if entry.claim in claims:
                    claim_info = claims[entry.claim]
                else:
                    claim_info = claims[entry.claim] = identity.claims.get((namespace, entry.claim))
                    uses.add(("claim", namespace, entry.claim))
                if claim_info is not None:
                    resolved = identity.resolve_in(claim_info, entry)
            if resolved is None:
                self.stats.parse_errors[parse.CLAIM_UNRESOLVED] += 1
                claim = entry.claim or entry.pod_claim
                key = (node, f"{UNRESOLVED_PREFIX}{namespace}/{claim}/{entry.resource_id}")
                meta = _Meta(resource=entry.resource)
            else:
                driver, pool, device_name, uuid = resolved
                uses.add(("ref", driver, pool, device_name))
                key = (node, uuid or f"{driver}/{pool}/{device_name}")
                meta = _Meta(uuid, driver, pool, device_name, entry.resource)
                if driver in self._slice_drivers:
                    entry = self._slice_entry(entry, (driver, pool, device_name))
            grouped.setdefault(key, []).append(entry)
            metas.setdefault(key, meta)
            entry_keys.append(key)
        return grouped, metas, uses, entry_keys

    def _apply_observation(
        self, pod: _Pod, observation: PodObservation, now: float, *, confirm: bool = True
    ) -> None:
        """Apply what a pod says; `confirm` is False when re-resolving identities (no new report)."""
        pod.observation = observation
        pod.namespace, pod.name = observation.namespace, observation.name
        entries = observation.entries
        if (
            not entries
            and not pod.allocations
            and not pod.uses
            and not pod.values
            and not observation.extended
            and not pod.silent
            and (observation.namespace, observation.name) not in self._listed
        ):
            # Nothing reported and nothing held (a pod before it runs): no devices to touch.
            pod.layout = (observation.node, observation.terminal, [])
            pod.entry_keys = None if observation.terminal or not observation.node else []
            return
        layout = (
            observation.node,
            observation.terminal,
            [(e.container, e.resource, e.resource_id, e.claim) for e in entries],
            observation.extended,
        )
        if (
            confirm
            and pod.layout == layout
            and pod.entry_keys is not None
            and not (self._slice_drivers and self._holds_slice_health(pod))
        ):
            # Same devices, same allocations as last time: only reported values can have moved.
            grouped: dict[DeviceKey, list[ResourceEntry]] = {}
            for key, entry in zip(pod.entry_keys, entries, strict=True):
                grouped.setdefault(key, []).append(entry)
            for key, group in grouped.items():
                self._take_value(pod, key, group, now)
        else:
            self._apply_layout(pod, observation, now)
            pod.layout = layout
        if confirm and pod.values:
            # Values this pod repeats (and new ones that already held) are confirmed now.
            self._confirmed[pod.uid] = self._unpersisted[pod.uid] = now
            self._snapshot = None

    def _terminate(self, pod: _Pod) -> None:
        """The pod reached Succeeded or Failed: every allocation is released, nothing is reported.

        What `_apply_observation` does with a terminal observation without entries, minus
        the generic layout work (every pod replacement goes through here).
        """
        previous = pod.observation
        assert previous is not None
        pod.observation = PodObservation(
            previous.uid,
            previous.namespace,
            previous.name,
            previous.node,
            previous.resource_version,
            True,
            (),
            previous.errors,
        )
        pod.layout = (previous.node, True, [])
        pod.entry_keys = None
        if pod.silent:
            self._set_silent(pod, {})
        if pod.uses:
            self._set_uses(pod, set())
        # What `_release` does per device, in one loop (every pod replacement comes here).
        contrib, devices, dirty, uid = self._contrib, self._devices, self._dirty_allocations, pod.uid
        values = pod.values
        superseded, idle = [], []
        for key in pod.allocations:
            values.pop(key, None)
            contributions = contrib.get(key)
            if contributions is not None:
                contributions.pop(uid, None)
            device = devices.get(key)
            if device is None:
                continue
            if not contributions and self._superseded(device):
                superseded.append(key)
            else:
                dirty.add(key)
                if not contributions and (device.driver or self._nvml is not None):
                    idle.append(key)
        if pod.allocations:
            pod.allocations.clear()
            self._snapshot = None
        for key in superseded:
            self._delete(key)
        for key in idle:
            self._handed_back(key)

    def _apply_layout(self, pod: _Pod, observation: PodObservation, now: float) -> None:
        """Resolve identities and allocations afresh, then take the reported values."""
        if observation.terminal:
            grouped: dict[DeviceKey, list[ResourceEntry]] = {}
            metas: dict[DeviceKey, _Meta] = {}
            uses: set[tuple[str, ...]] = set()
            entry_keys: list[DeviceKey] | None = None
            silent: dict[DeviceKey, tuple[Allocation, ...]] = {}
        else:
            grouped, metas, uses, entry_keys = self._resolve(observation)
            silent = self._resolve_extended(observation, uses) if observation.extended else {}
        pod.entry_keys = entry_keys
        self._set_uses(pod, uses)
        if self._listed and not observation.terminal and observation.node == self._node_name:
            silent = self._with_listed(pod, silent, grouped)
        if silent or pod.silent:
            self._set_silent(pod, silent)
        for key in [k for k in pod.allocations if k not in grouped]:
            self._release(pod, key)
        namespace, name = observation.namespace, observation.name
        # A pod's devices usually come from one container and one resource: they share one
        # allocations tuple (built once, and serialised once per directory batch).
        shared: dict[tuple[str, str, str], tuple[Allocation, ...]] = {}
        devices, contrib, dirty = self._devices, self._contrib, self._dirty_allocations
        held, values, uid = pod.allocations, pod.values, pod.uid
        taints_of = self.identity.taints
        for key, group in grouped.items():
            if len(group) == 1:
                e = group[0]
                same = (e.container, e.resource, e.claim)
                allocations = shared.get(same)
                if allocations is None:
                    allocations = shared[same] = (
                        Allocation(namespace, name, e.container, e.resource, e.claim),
                    )
            else:
                allocations = tuple(
                    sorted(
                        {Allocation(namespace, name, e.container, e.resource, e.claim) for e in group},
                        key=_allocation_order,
                    )
                )
            meta = metas[key]
            device = devices.get(key)
            if (
                device is not None
                and device.uuid == (meta.uuid or device.uuid)
                and device.driver == (meta.driver or device.driver)
                and device.pool == (meta.pool or device.pool)
                and device.device_name == (meta.device_name or device.device_name)
                and device.resource == (meta.resource or device.resource)
                and (
                    not meta.driver
                    or device.driver_taints == taints_of((meta.driver, meta.pool, meta.device_name))
                )
            ):
                # A known device whose identity this pod confirms (a replaced pod on the same
                # GPUs, the usual case): what `_hold` and `_take_value` do, minus the identity
                # work. Its slice reference is registered already (same driver, pool, name).
                contributions = contrib.get(key)
                if contributions is None:
                    contributions = contrib[key] = {}
                contributions[uid] = allocations
                held[key] = allocations
                dirty.add(key)
                worst = group[0] if len(group) == 1 else max(group, key=_severity)
                value = (worst.health, worst.message)
                if values.get(key) != value:
                    values[key] = value
                    if device.health != value[0] or device.message != value[1]:
                        self._report(key, value, now, pod, worst)
                continue
            self._hold(pod, key, allocations, meta, group, now)
            self._take_value(pod, key, group, now)
        if grouped:
            self._snapshot = None

    def _resolve_extended(
        self, observation: PodObservation, uses: set[tuple[str, ...]]
    ) -> dict[DeviceKey, tuple[Allocation, ...]]:
        """The devices a pod holds through its DRA-backed extended resources (KEP-5004): each
        mapping's request in the special claim's allocation results. Only devices this exporter
        already tracks (from their slice, or NVML) are held: with no report, the pod says nothing
        that could make a device. Notes the claim and slice devices used, so a change of either
        resolves the pod again."""
        node, namespace = observation.node, observation.namespace
        if not node:
            return {}
        identity, devices = self.identity, self._devices
        found: dict[DeviceKey, set[Allocation]] = {}
        for held in observation.extended:
            uses.add(("claim", namespace, held.claim))
            claim = identity.claims.get((namespace, held.claim))
            if claim is None:
                continue
            for result in claim.results:
                if result.request.partition("/")[0] != held.request:
                    continue
                uses.add(("ref", *result.ref))
                sliced = identity.devices.get(result.ref)
                uuid = sliced.uuid if sliced is not None else ""
                key = (node, uuid or f"{result.driver}/{result.pool}/{result.device}")
                if key not in devices:
                    continue
                allocation = Allocation(
                    namespace, observation.name, held.container, held.resource, held.claim
                )
                found.setdefault(key, set()).add(allocation)
        return {key: tuple(sorted(a, key=_allocation_order)) for key, a in found.items()}

    def _with_listed(
        self,
        pod: _Pod,
        extended: dict[DeviceKey, tuple[Allocation, ...]],
        reported: Container[DeviceKey],
    ) -> dict[DeviceKey, tuple[Allocation, ...]]:
        """The pod's report-less allocations: its DRA-backed extended resources' (`extended`) and
        the device-plugin devices the kubelet's `List` names for it, except those its status
        reports (`reported`: a report is the pod's word, never overridden). A MIG partition is
        held on its card, a time-slicing replica on its GPU, as for a report (`_resolve`). Only
        devices already tracked (from NVML) are held: with no report, the pod makes no device."""
        listed = self._listed.get((pod.namespace, pod.name))
        if not listed:
            return extended
        node = self._node_name
        assert node is not None  # `_listed` is filled in node mode only
        found = {key: set(held) for key, held in extended.items()}
        for container, resource, device_id in listed:
            device = _device_uuid(device_id.partition("::")[0])
            if not device:
                continue  # not a GPU's ID (another plugin's device): nothing gpuhealth tracks
            if device.startswith(MIG_PREFIX):
                device = self._mig_parent.get(device, device)
            key = (node, device)
            if key in reported:
                continue
            if key not in self._devices:
                self._listed_waiting = True
                continue
            allocation = Allocation(pod.namespace, pod.name, container, resource, "")
            found.setdefault(key, set()).add(allocation)
        return {key: tuple(sorted(held, key=_allocation_order)) for key, held in found.items()}

    def _relist_silent(self, names: Container[tuple[str, str]]) -> None:
        """Hold afresh what `List` names for these pods (by namespace and name) on this node."""
        self._listed_waiting = False
        for pod in list(self._pods.values()):
            observation = pod.observation
            if (
                observation is None
                or observation.terminal
                or observation.node != self._node_name
                or (pod.namespace, pod.name) not in names
            ):
                continue
            extended = self._resolve_extended(observation, set()) if observation.extended else {}
            silent = self._with_listed(pod, extended, pod.allocations)
            if silent or pod.silent:
                self._set_silent(pod, silent)

    def _set_silent(self, pod: _Pod, silent: dict[DeviceKey, tuple[Allocation, ...]]) -> None:
        """Replace the pod's report-less allocations; the devices whose holders moved are folded."""
        for key, allocations in pod.silent.items():
            if silent.get(key) == allocations:
                continue
            holders = self._silent.get(key)
            if holders is not None:
                holders.pop(pod.uid, None)
                if not holders:
                    del self._silent[key]
            self._dirty_allocations.add(key)
        for key, allocations in silent.items():
            if pod.silent.get(key) == allocations:
                continue
            self._silent.setdefault(key, {})[pod.uid] = allocations
            self._dirty_allocations.add(key)
        pod.silent = silent
        self._snapshot = None

    def _take_value(self, pod: _Pod, key: DeviceKey, group: list[ResourceEntry], now: float) -> None:
        worst = group[0] if len(group) == 1 else max(group, key=_severity)
        value = (worst.health, worst.message)
        if pod.values.get(key) != value:
            pod.values[key] = value
            self._report(key, value, now, pod, worst)

    def _report(
        self, key: DeviceKey, value: tuple[str, str], now: float, pod: _Pod, entry: ResourceEntry
    ) -> None:
        """A pod reported a new value for a device: a status change unless it already holds."""
        device = self._devices.get(key)
        health, message = value
        assert device is not None  # _hold created it
        if device.health == health and device.message == message:
            # The kubelet vouches again for what an idle source had: not a status change
            # (its allocations are dirty, and the fold makes the source `pod`).
            return
        if health == "Unknown":
            unknown_since = device.unknown_since if device.health == "Unknown" else now
        else:
            unknown_since = None
        changed = _changed(device, health, message, now, unknown_since, self._held_source(device.driver))
        self._put(key, changed)
        self.stats.status_changes += 1
        if self._sink is not None:
            self._sink.record_change(changed, self._evidence(changed, pod, entry))

    def _hold(
        self,
        pod: _Pod,
        key: DeviceKey,
        allocations: tuple[Allocation, ...],
        meta: _Meta,
        group: list[ResourceEntry],
        now: float,
    ) -> None:
        """Record the pod's allocations of a device; a device seen for the first time is created
        directly with its first reported value (one construction, one log row)."""
        device = self._devices.get(key)
        contributions = self._contrib.setdefault(key, {})
        contributions[pod.uid] = allocations
        pod.allocations[key] = allocations
        if meta.driver:
            self._ref_keys.setdefault((meta.driver, meta.pool, meta.device_name), set()).add(key)
        taints = self.identity.taints((meta.driver, meta.pool, meta.device_name)) if meta.driver else ()
        if device is None:
            self._create(pod, key, allocations, meta, taints, group, now)
            return
        if (
            device.uuid == (meta.uuid or device.uuid)
            and device.driver == (meta.driver or device.driver)
            and device.pool == (meta.pool or device.pool)
            and device.device_name == (meta.device_name or device.device_name)
            and device.resource == (meta.resource or device.resource)
            and (not meta.driver or device.driver_taints == taints)
        ):
            # Only allocations can differ: folded at the next sync, so a pod replaced by
            # another on the same devices costs one rebuild per device, not two.
            self._dirty_allocations.add(key)
            self._snapshot = None
            return
        self._dirty_allocations.discard(key)
        updated = _held(device, _merge(contributions), meta, taints if meta.driver else device.driver_taints)
        self._put(key, updated)
        if self._sink is not None:
            self._sink.record_device(updated)

    def _create(
        self,
        pod: _Pod,
        key: DeviceKey,
        allocations: tuple[Allocation, ...],
        meta: _Meta,
        taints: tuple[DriverTaint, ...],
        group: list[ResourceEntry],
        now: float,
    ) -> None:
        """A device seen for the first time: built once, with its first reported value."""
        worst = group[0] if len(group) == 1 else max(group, key=lambda e: _SEVERITY[e.health])
        health, message = worst.health, worst.message
        device = DeviceState(
            node=key[0],
            device=key[1],
            health=health,
            message=message,
            status_version=self._version_floor.pop(key, 0) + 1,
            first_seen=now,
            changed_at=now,
            observed_at=now,
            uuid=meta.uuid,
            driver=meta.driver,
            pool=meta.pool,
            device_name=meta.device_name,
            resource=meta.resource,
            allocations=allocations,
            driver_taints=taints,
            unknown_since=now if health == "Unknown" else None,
            source=self._held_source(meta.driver),
        )
        pod.values[key] = (health, message)
        self._put(key, device)
        self.stats.status_changes += 1
        if self._sink is not None:
            self._sink.record_change(device, self._evidence(device, pod, worst))

    def _evidence(self, device: DeviceState, pod: _Pod, entry: ResourceEntry) -> ObservationRecord:
        return ObservationRecord(
            device.node,
            device.device,
            device.status_version,
            device.changed_at,
            device.health,
            device.message,
            pod.namespace,
            pod.name,
            entry.container,
            entry.resource,
            entry.claim,
            pod.resource_version,
        )

    def _held_source(self, driver: str) -> str:
        """Who vouches for a device a pod holds: the kubelet, unless its driver streams nothing."""
        return SOURCE_SLICE if driver in self._slice_drivers else SOURCE_POD

    def _slice_entry(self, entry: ResourceEntry, ref: DeviceRef) -> ResourceEntry:
        """A pod's entry on a device of a slice-health driver, with the slice's health in it,
        whatever the kubelet wrote.

        The kubelet's Unknown there says only that the driver streams nothing (the kubelet's
        health cache answers Unknown for a device it never heard of); the driver's verdict is its
        taints. Until the slice is seen the entry stays as the kubelet wrote it."""
        sliced = self.identity.devices.get(ref)
        if sliced is None:
            return entry
        health, message = sliced.health
        return entry._replace(health=health, message=message)

    def _holds_slice_health(self, pod: _Pod) -> bool:
        """Whether any device of the pod belongs to a slice-health driver (its entries are
        rewritten by `_resolve`, so a repeat cannot take the fast path of raw entries)."""
        drivers = self._slice_drivers
        return any(used[0] == "ref" and used[1] in drivers for used in pod.uses)

    def _release(self, pod: _Pod, key: DeviceKey) -> None:
        """The pod no longer holds the device; drop a provisional device nobody holds."""
        pod.allocations.pop(key, None)
        pod.values.pop(key, None)
        contributions = self._contrib.get(key)
        if contributions is not None:
            contributions.pop(pod.uid, None)
        device = self._devices.get(key)
        if device is None:
            return
        if not contributions and self._superseded(device):
            self._delete(key)
            return
        self._dirty_allocations.add(key)
        self._snapshot = None
        if not contributions and (
            device.driver or self._nvml is not None or device.node in self._node_counts
        ):
            self._handed_back(key)

    def _handed_back(self, key: DeviceKey) -> None:
        """Nobody holds the device any more: its ResourceSlice, else NVML, else (a device-plugin
        GPU whose node has every registered device allocatable) its node speaks for it from now on."""
        device = self._devices[key]
        sliced = self._speaking_slice(device)
        if sliced is not None:
            self._from_slice(key, sliced, self._clock.now())
            return
        if self._nvml is not None and device.uuid and key[0] == self._node_name:
            reading = self._nvml.readings.get(device.uuid)
            if reading is not None:
                self._from_nvml(key, reading, self._clock.now())
                return
        node = self._node_counts.get(key[0])
        if node is not None:
            self._from_node(key, *node)

    def _speaking_slice(self, device: DeviceState) -> SliceDevice | None:
        """The tracked ResourceSlice device that speaks for `device` when no pod holds it."""
        if not device.driver:
            return None
        sliced = self.identity.devices.get((device.driver, device.pool, device.device_name))
        if sliced is None or not self._tracks(sliced) or _slice_key(sliced) != (device.node, device.device):
            return None
        return sliced

    def _superseded(self, device: DeviceState) -> bool:
        if device.device.startswith(UNRESOLVED_PREFIX):
            return True
        if device.device in self._mig_parent:
            return True  # a partition held before NVML named its card: the card holds it now
        if device.driver and not device.uuid:
            sliced = self.identity.devices.get((device.driver, device.pool, device.device_name))
            return sliced is not None and bool(sliced.uuid)
        return False

    def _remove_pod(self, uid: str) -> None:
        pod = self._pods.pop(uid, None)
        self._confirmed.pop(uid, None)
        self._unpersisted.pop(uid, None)
        self._dirty_pods.discard(uid)
        if pod is None:
            return
        for key in list(pod.allocations):
            self._release(pod, key)
        if pod.silent:
            self._set_silent(pod, {})
        self._set_uses(pod, set())
        if self._sink is not None:
            self._sink.forget_pod(uid)

    def _set_uses(self, pod: _Pod, uses: set[tuple[str, ...]]) -> None:
        for used in pod.uses - uses:
            users = self._users.get(used)
            if users is not None:
                users.discard(pod.uid)
                if not users:
                    del self._users[used]
        for used in uses - pod.uses:
            self._users.setdefault(used, set()).add(pod.uid)
        pod.uses = uses

    def _reapply(self, used: tuple[str, ...]) -> None:
        """Resolve again every pod whose identities depend on a claim or slice device that changed."""
        now = self._clock.now()
        for uid in list(self._users.get(used, ())):
            pod = self._pods.get(uid)
            if pod is not None and pod.observation is not None:
                self._apply_observation(pod, pod.observation, now, confirm=False)

    def _claim_gone(self, namespace: str, name: str) -> None:
        if self.identity.drop_claim(namespace, name):
            self._reapply(("claim", namespace, name))

    def _slice_changed(self, refs: set[DeviceRef]) -> None:
        now = self._clock.now()
        for ref in refs:
            self._reapply(("ref", *ref))
            taints = self.identity.taints(ref)
            sliced = self.identity.devices.get(ref)
            for key in list(self._ref_keys.get(ref, ())):
                device = self._devices.get(key)
                if device is None:
                    continue
                if sliced is None and not self._contrib.get(key):
                    self._delete(key)
                elif device.driver_taints != taints:
                    updated = dataclasses.replace(device, driver_taints=taints)
                    self._put(key, updated)
                    if self._sink is not None:
                        self._sink.record_device(updated)
            if sliced is not None and self._tracks(sliced):
                self._from_slice(_slice_key(sliced), sliced, now)

    def _resourced(self, key: DeviceKey, device: DeviceState, source: str) -> None:
        """Only the source moves (persisted with the allocations, which move with it)."""
        updated = _sourced(device, source)
        self._put(key, updated)
        if self._sink is not None:
            self._sink.record_allocations(updated)

    def _tracks(self, sliced: SliceDevice) -> bool:
        """Whether a slice device is this exporter's: every node's in cluster mode, its own in node mode."""
        return bool(sliced.node) and (self._node_name is None or sliced.node == self._node_name)

    def _from_slice(self, key: DeviceKey, sliced: SliceDevice, now: float) -> None:
        """A slice device no pod holds: tracked with its driver taints as its health evidence.

        A device a pod holds keeps the kubelet's report (the authority while it runs there);
        only its taints follow the slice (`_slice_changed`)."""
        if self._contrib.get(key):
            return
        health, message = sliced.health
        self._idle_status(key, health, message, SOURCE_SLICE, now, sliced)

    def _from_nvml(self, key: DeviceKey, reading: DeviceReading, now: float) -> None:
        """Node mode: a GPU NVML lists that no pod holds and no slice speaks for."""
        if self._contrib.get(key):
            return
        current = self._devices.get(key)
        if current is not None and (current.source == SOURCE_SLICE or self._speaking_slice(current)):
            # The slice outranks NVML, also between a hand-back and the fold that makes the
            # slice the source: reachability there would clear the driver's failure taint (a
            # fatal XID leaves the GPU reachable) and resolve the Unhealthy alert the moment
            # the last pod left the device.
            return
        health, message = nvml_health(reading)
        if (
            health == "Healthy"
            and self._allocatable is not None
            and not (
                # A MIG card is offered only as its partitions: one the kubelet does not offer
                # is one its plugin reports Unhealthy, and the card is as bad as its worst part.
                self._allocatable.lists_every(m.uuid for m in reading.mig_devices)
                if reading.mig_devices
                else self._allocatable.lists(reading.uuid)
            )
        ):
            # NVML reaches the GPU, but the kubelet does not offer it: its device plugin reports
            # it Unhealthy (reachability is no verdict on a card that fails its health checks).
            health, message = "Unhealthy", POD_RESOURCES_UNLISTED
        self._idle_status(key, health, message, SOURCE_NVML, now, None, reading.uuid)

    def _idle_status(
        self,
        key: DeviceKey,
        health: str,
        message: str,
        source: str,
        now: float,
        sliced: SliceDevice | None,
        uuid: str = "",
    ) -> None:
        """A device no pod holds takes (health, message) from `source`: created, changed, or
        (same health) only vouched for by it (no status change, no new version).

        On every hand-back of a pod's devices: positional arguments, no keyword dict."""
        device = self._devices.get(key)
        if device is None:
            if sliced is not None:
                self._ref_keys.setdefault(sliced.ref, set()).add(key)
            device = DeviceState(
                node=key[0],
                device=key[1],
                health=health,
                message=message,
                status_version=self._version_floor.pop(key, 0) + 1,
                first_seen=now,
                changed_at=now,
                observed_at=now,
                unknown_since=now if health == "Unknown" else None,
                uuid=sliced.uuid if sliced is not None else uuid,
                driver=sliced.driver if sliced is not None else "",
                pool=sliced.pool if sliced is not None else "",
                device_name=sliced.device if sliced is not None else "",
                driver_taints=sliced.taints if sliced is not None else (),
                source=source,
            )
        elif device.health == health and (device.source != source or device.message == message):
            # The source agrees with the health the device has (the usual hand-back after a
            # pod on a healthy GPU): it vouches for it now; the status and its version stay.
            if device.source != source:
                if key in self._dirty_allocations:
                    # A hand-back: the fold rebuilds the device for its allocations anyway.
                    self._idle_sources[key] = source
                else:
                    self._resourced(key, device, source)
            return
        else:
            if health == "Unknown":
                unknown_since = device.unknown_since if device.health == "Unknown" else now
            else:
                unknown_since = None
            moved = device.source != source
            device = _changed(device, health, message, now, unknown_since, source)
            if moved and self._sink is not None:
                # The status UPDATE does not write the source (it moves with the holders).
                self._sink.record_allocations(device)
        self._put(key, device)
        self.stats.status_changes += 1
        if self._sink is not None:
            self._sink.record_change(
                device,
                ObservationRecord(
                    device.node,
                    device.device,
                    device.status_version,
                    device.changed_at,
                    device.health,
                    device.message,
                ),
            )

    def _node_gone(self, node: str) -> None:
        for key in [k for k in self._producers if k[0] == node]:
            del self._producers[key]
            self._snapshot = None
        if self._nodes.pop(node, None) is not None:
            self._snapshot = None
            if self._sink is not None:
                self._sink.record_lease(node, None)
        for key in [k for k in self._devices if k[0] == node and not self._contrib.get(k)]:
            self._delete(key)


NVML_REACHABLE_MESSAGE = "NVML: reachable"
"""The message of an NVML-reported Healthy (never one a kubelet writes)."""


POD_RESOURCES_UNLISTED = (
    "kubelet pod-resources: not allocatable (its device plugin reports the GPU Unhealthy); NVML: reachable"
)
"""The message of an idle device-plugin GPU the kubelet leaves out of its allocatable devices."""


def nvml_health(reading: DeviceReading) -> tuple[str, str]:
    """(health, message) NVML's reachability gives a GPU no pod holds: a lost GPU is Unhealthy,
    any other unreadable one Unknown (an error reading it is no verdict on the card)."""
    if reading.reachable:
        return "Healthy", NVML_REACHABLE_MESSAGE
    error = reading.error or "unreachable"
    return ("Unhealthy" if "LOST" in error.upper() else "Unknown"), f"NVML: {error}"


def _slice_key(sliced: SliceDevice) -> DeviceKey:
    """The key a pod's entry on this slice device resolves to (`identity.Resolved.device`)."""
    return (sliced.node, sliced.uuid or f"{sliced.driver}/{sliced.pool}/{sliced.device}")


def _severity(entry: ResourceEntry) -> int:
    return _SEVERITY[entry.health]


def _allocation_order(allocation: Allocation) -> tuple[str, str, str, str, str]:
    return (allocation.namespace, allocation.pod, allocation.container, allocation.resource, allocation.claim)


def _merge(contributions: Mapping[str, tuple[Allocation, ...]]) -> tuple[Allocation, ...]:
    if len(contributions) == 1:
        return next(iter(contributions.values()))
    return tuple(sorted((a for group in contributions.values() for a in group), key=_allocation_order))


class _ProducerPod(NamedTuple):
    node: str
    ready: bool
    since: float | None
    """When it left Ready (its Ready condition's lastTransitionTime); None while Ready or unknown."""


def _pod_ready(status: Any) -> tuple[bool, float | None]:
    """(Ready, when it turned not Ready) from a pod's status; no Ready condition: not Ready."""
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return True, None
            return False, parse_rfc3339(condition.get("lastTransitionTime"))
    return False, None


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


# Hot-path copies of a DeviceState, compiled from its fields (`exporter.snapshot.
# compiled_function`), so they cost what hand-written ones do and a new field is copied
# without touching them. Each names only the fields it changes. They fill the slots of a
# new instance through the slots' own descriptors instead of calling the frozen dataclass's
# `__init__`, whose `object.__setattr__(self, "name", ...)` per field looks each slot up by
# name: 0.68 us against 1.26 us a copy (a pod replacement folds 8, a scrape after every pod
# confirmed folds all 80,000). What `__init__` would add is nothing: no defaults apply (every
# field is given) and there is no `__post_init__`, which the check below keeps true.

if "__post_init__" in vars(DeviceState):
    raise TypeError("DeviceState has a __post_init__: the compiled copies below would skip it")

_SLOT_SETTERS = {f"_set_{f.name}": getattr(DeviceState, f.name).__set__ for f in DEVICE_FIELDS}


def _copy(name: str, params: str, **changes: str) -> Callable[..., Any]:
    """`name(d, params)`: `d` with `changes` (field name -> expression), every other field kept."""
    unknown = changes.keys() - {f.name for f in DEVICE_FIELDS}
    if unknown:
        raise TypeError(f"{name} changes fields DeviceState does not have: {sorted(unknown)}")
    body = [
        "copy = _new(DeviceState)",
        *(f"_set_{f.name}(copy, {changes.get(f.name, f'd.{f.name}')})" for f in DEVICE_FIELDS),
    ]
    return compiled_function(name, f"d, {params}", "copy", body, _new=object.__new__, **_SLOT_SETTERS)


_observed: Callable[[DeviceState, float], DeviceState] = _copy("_observed", "at", observed_at="at")
"""The device confirmed at `at`."""

_changed: Callable[[DeviceState, str, str, float, float | None, str], DeviceState] = _copy(
    "_changed",
    "health, message, at, unknown_since, source",
    health="health",
    message="message",
    status_version="d.status_version + 1",
    changed_at="at",
    observed_at="at",
    unknown_since="unknown_since",
    source="source",
)
"""The device with a new (health, message) from `source` observed at `at`: the next status version."""

_sourced: Callable[[DeviceState, str], DeviceState] = _copy("_sourced", "source", source="source")
"""The device with another source vouching for the same status."""

_with_holders: Callable[[DeviceState, tuple[Allocation, ...], str], DeviceState] = _copy(
    "_with_holders", "allocations, source", allocations="allocations", source="source"
)
"""The device with new holders and whoever vouches for its status now (one copy for both)."""

_held: Callable[[DeviceState, tuple[Allocation, ...], _Meta, tuple[DriverTaint, ...]], DeviceState] = _copy(
    "_held",
    "allocations, meta, taints",
    allocations="allocations",
    driver_taints="taints",
    **{name: f"meta.{name} or d.{name}" for name in _Meta._fields},
)
"""The device with new allocations and identity attributes (empty ones keep the old)."""
