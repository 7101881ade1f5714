"""How a pod's entries become devices: identities resolved, allocations held, values reported.

A pod's entries are grouped by device identity (a device-plugin ID, a MIG partition held on its
card, a DRA claim's result resolved through its ResourceSlice, or a provisional
`unresolved/...` identity until the claim is known); the pod's allocations are recorded on each
device, a device seen for the first time is created with its first reported value, and a new
value is a status change unless the device already has it.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING

from exporter import parse
from exporter.identity import ClaimInfo
from exporter.parse import ExtendedAllocation, PodObservation, ResourceEntry
from exporter.snapshot import Allocation, DeviceState, DriverTaint
from exporter.state_copies import changed, held
from exporter.state_model import (
    MIG_PREFIX,
    UNRESOLVED_PREFIX,
    DeviceKey,
    DeviceMeta,
    ObservationRecord,
    TrackedPod,
    allocation_order,
    device_uuid,
    merge,
    severity,
)
from exporter.state_table import DeviceTable

if TYPE_CHECKING:
    from exporter.state import DeviceStateStore


class PodLayout:
    """Resolves a pod's entries and holds its devices on the store's table."""

    def __init__(self, store: DeviceStateStore, table: DeviceTable) -> None:
        self._store = store
        self._table = table
        self._stats = table.stats

    def resolve(
        self, observation: PodObservation
    ) -> tuple[
        dict[DeviceKey, list[ResourceEntry]],
        dict[DeviceKey, DeviceMeta],
        set[tuple[str, ...]],
        list[DeviceKey] | None,
    ]:
        """Group the pod's entries by device identity, noting what the resolution used.

        Also returns each entry's key in order (None when the pod has no node yet)."""
        grouped: dict[DeviceKey, list[ResourceEntry]] = {}
        metas: dict[DeviceKey, DeviceMeta] = {}
        uses: set[tuple[str, ...]] = set()
        entry_keys: list[DeviceKey] = []
        node = observation.node
        if not node:
            return grouped, metas, uses, None
        namespace = observation.namespace
        store = self._store
        identity = store.identity
        mig_parent = store.nvml.mig_parent
        slice_drivers = self._table.slice_drivers
        claims: dict[str, ClaimInfo | None] = {}
        """This pod's claims by name, looked up once (its entries usually share one)."""
        for entry in observation.entries:
            if not entry.pod_claim:
                device = entry.device
                if device.startswith(MIG_PREFIX):
                    # A MIG partition: held on its card once NVML says which (node mode).
                    uses.add(("mig", device))
                    device = mig_parent.get(device, device)
                key = (node, device)
                group = grouped.get(key)
                if group is None:
                    # Positional: keyword NamedTuple construction costs over twice as much.
                    grouped[key] = [entry]
                    metas[key] = DeviceMeta(device_uuid(device), "", "", "", entry.resource)
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
                self._stats.parse_errors[parse.CLAIM_UNRESOLVED] += 1
                claim = entry.claim or entry.pod_claim
                key = (node, f"{UNRESOLVED_PREFIX}{namespace}/{claim}/{entry.resource_id}")
                meta = DeviceMeta(resource=entry.resource)
            else:
                driver, pool, device_name, uuid = resolved
                uses.add(("ref", driver, pool, device_name))
                key = (node, uuid or f"{driver}/{pool}/{device_name}")
                meta = DeviceMeta(uuid, driver, pool, device_name, entry.resource)
                if driver in slice_drivers:
                    entry = store.slices.slice_entry(entry, (driver, pool, device_name))
            grouped.setdefault(key, []).append(entry)
            metas.setdefault(key, meta)
            entry_keys.append(key)
        return grouped, metas, uses, entry_keys

    def apply_layout(self, pod: TrackedPod, observation: PodObservation, now: float) -> None:
        """Resolve identities and allocations afresh, then take the reported values."""
        store, table = self._store, self._table
        if observation.terminal:
            grouped: dict[DeviceKey, list[ResourceEntry]] = {}
            metas: dict[DeviceKey, DeviceMeta] = {}
            uses: set[tuple[str, ...]] = set()
            entry_keys: list[DeviceKey] | None = None
            silent: dict[DeviceKey, tuple[Allocation, ...]] = {}
        else:
            grouped, metas, uses, entry_keys = self.resolve(observation)
            silent = (
                self.resolve_silent(observation, uses, grouped)
                if observation.extended or observation.claimed
                else {}
            )
        pod.entry_keys = entry_keys
        store.pods.set_uses(pod, uses)
        listed = store.listed
        if listed.pods and not observation.terminal and observation.node == store.node_name:
            silent = listed.with_listed(pod, silent, grouped)
        if silent or pod.silent:
            table.set_silent(pod, silent)
        for key in [k for k in pod.allocations if k not in grouped]:
            store.pods.release(pod, key)
        namespace, name = observation.namespace, observation.name
        # A pod's devices usually come from one container and one resource: they share one
        # allocations tuple (built once, and serialised once per directory batch).
        shared: dict[tuple[str, str, str], tuple[Allocation, ...]] = {}
        devices, contrib, dirty = table.devices, table.contrib, table.dirty_allocations
        held_by_pod, values, uid = pod.allocations, pod.values, pod.uid
        taints_of = store.identity.taints
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
                        key=allocation_order,
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
                # GPUs, the usual case): what `_hold` and `take_value` do, minus the identity
                # work. Its slice reference is registered already (same driver, pool, name).
                contributions = contrib.get(key)
                if contributions is None:
                    contributions = contrib[key] = {}
                contributions[uid] = allocations
                held_by_pod[key] = allocations
                dirty.add(key)
                worst = group[0] if len(group) == 1 else max(group, key=severity)
                value = (worst.health, worst.message)
                if values.get(key) != value:
                    values[key] = value
                    if device.health != value[0] or device.message != value[1]:
                        self._report(key, value, now, pod, worst)
                continue
            self._hold(pod, key, allocations, meta, group, now)
            self.take_value(pod, key, group, now)
        if grouped:
            table.snapshot = None

    def resolve_silent(
        self,
        observation: PodObservation,
        uses: set[tuple[str, ...]],
        reported: Container[DeviceKey] = (),
    ) -> dict[DeviceKey, tuple[Allocation, ...]]:
        """The devices a pod holds through a claim with no report on them: its DRA-backed extended
        resources (KEP-5004), each mapping's request in the special claim's allocation results;
        and its own DRA claims where its kubelet writes no `allocatedResourcesStatus` (the
        `ResourceHealthStatus` gate off, before 1.36), only while the claim's `reservedFor` names
        the pod. A container's claim the kubelet reports on (an entry of that container and name),
        or a device the pod reports on (`reported`), is the report's: never held twice.

        Only devices this exporter already tracks (from their slice, or NVML) are held: with no
        report, the pod says nothing that could make a device. Notes the claim and slice devices
        used, so a change of either (a reservation too) resolves the pod again."""
        node = observation.node
        if not node:
            return {}
        found: dict[DeviceKey, set[Allocation]] = {}
        for holding in observation.extended:
            self._hold_claim(observation, holding, False, reported, uses, found)
        if observation.claimed:
            said = {(e.container, e.resource) for e in observation.entries if e.pod_claim}
            for holding in observation.claimed:
                if (holding.container, holding.resource) not in said:
                    self._hold_claim(observation, holding, True, reported, uses, found)
        return {key: tuple(sorted(a, key=allocation_order)) for key, a in found.items()}

    def _hold_claim(
        self,
        observation: PodObservation,
        holding: ExtendedAllocation,
        reserved: bool,
        reported: Container[DeviceKey],
        uses: set[tuple[str, ...]],
        found: dict[DeviceKey, set[Allocation]],
    ) -> None:
        """Add the tracked devices of `holding`'s request in its claim's results to `found`
        (`reserved`: only while the claim is reserved for the pod)."""
        namespace = observation.namespace
        identity, devices = self._store.identity, self._table.devices
        uses.add(("claim", namespace, holding.claim))
        claim = identity.claims.get((namespace, holding.claim))
        if claim is None or (reserved and observation.uid not in claim.reserved):
            return
        for result in claim.results:
            if holding.request and result.request.partition("/")[0] != holding.request:
                continue
            uses.add(("ref", *result.ref))
            sliced = identity.devices.get(result.ref)
            uuid = sliced.uuid if sliced is not None else ""
            key = (observation.node, uuid or f"{result.driver}/{result.pool}/{result.device}")
            if key not in devices or key in reported:
                continue
            allocation = Allocation(
                namespace, observation.name, holding.container, holding.resource, holding.claim
            )
            found.setdefault(key, set()).add(allocation)

    def take_value(self, pod: TrackedPod, key: DeviceKey, group: list[ResourceEntry], now: float) -> None:
        worst = group[0] if len(group) == 1 else max(group, key=severity)
        value = (worst.health, worst.message)
        if pod.values.get(key) != value:
            pod.values[key] = value
            self._report(key, value, now, pod, worst)

    def _report(
        self, key: DeviceKey, value: tuple[str, str], now: float, pod: TrackedPod, entry: ResourceEntry
    ) -> None:
        """A pod reported a new value for a device: a status change unless it already holds."""
        table = self._table
        device = table.devices.get(key)
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
        updated = changed(device, health, message, now, unknown_since, table.held_source(device.driver))
        table.put(key, updated)
        self._stats.status_changes += 1
        if table.sink is not None:
            table.sink.record_change(updated, _evidence(updated, pod, entry))

    def _hold(
        self,
        pod: TrackedPod,
        key: DeviceKey,
        allocations: tuple[Allocation, ...],
        meta: DeviceMeta,
        group: list[ResourceEntry],
        now: float,
    ) -> None:
        """Record the pod's allocations of a device; a device seen for the first time is created
        directly with its first reported value (one construction, one log row)."""
        table = self._table
        device = table.devices.get(key)
        contributions = table.contrib.setdefault(key, {})
        contributions[pod.uid] = allocations
        pod.allocations[key] = allocations
        if meta.driver:
            table.ref_keys.setdefault((meta.driver, meta.pool, meta.device_name), set()).add(key)
        ref = (meta.driver, meta.pool, meta.device_name)
        taints = self._store.identity.taints(ref) if meta.driver else ()
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
            table.dirty_allocations.add(key)
            table.snapshot = None
            return
        table.dirty_allocations.discard(key)
        updated = held(device, merge(contributions), meta, taints if meta.driver else device.driver_taints)
        table.put(key, updated)
        if table.sink is not None:
            table.sink.record_device(updated)

    def _create(
        self,
        pod: TrackedPod,
        key: DeviceKey,
        allocations: tuple[Allocation, ...],
        meta: DeviceMeta,
        taints: tuple[DriverTaint, ...],
        group: list[ResourceEntry],
        now: float,
    ) -> None:
        """A device seen for the first time: built once, with its first reported value."""
        table = self._table
        worst = group[0] if len(group) == 1 else max(group, key=severity)
        health, message = worst.health, worst.message
        device = DeviceState(
            node=key[0],
            device=key[1],
            health=health,
            message=message,
            status_version=table.version_floor.pop(key, 0) + 1,
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
            source=table.held_source(meta.driver),
        )
        pod.values[key] = (health, message)
        table.put(key, device)
        self._stats.status_changes += 1
        if table.sink is not None:
            table.sink.record_change(device, _evidence(device, pod, worst))


def _evidence(device: DeviceState, pod: TrackedPod, entry: ResourceEntry) -> ObservationRecord:
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
