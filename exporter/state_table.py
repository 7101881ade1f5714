"""The devices every source writes to, and who holds each: the store's one table.

Owns the device dict and its copy-on-write against handed-out snapshots, status versions (a
device that comes back continues its numbering), the holders of each device (pods that report
on it, pods that hold it with no report) and the folding of their allocations into the immutable
devices, and a device no pod holds taking the word of an idle source (`idle_status`). Every
write reaches the `DirectorySink` here, so the directory sees what memory sees.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from exporter.identity import DeviceRef, GovernedDevice
from exporter.snapshot import SOURCE_POD, SOURCE_SLICE, Allocation, DeviceState
from exporter.state_copies import changed, sourced, with_holders
from exporter.state_model import DeviceKey, DirectorySink, ObservationRecord, StateStats, TrackedPod, merge

if TYPE_CHECKING:
    from exporter.snapshot import Snapshot


@dataclasses.dataclass(eq=False, slots=True)
class DeviceTable:
    """Devices by (node, device), their holders and what is pending a fold."""

    sink: DirectorySink | None
    stats: StateStats
    slice_drivers: frozenset[str]
    """Drivers that stream no health to the kubelet: their slice speaks for held devices too."""
    devices: dict[DeviceKey, DeviceState] = dataclasses.field(default_factory=dict)
    shared: bool = False
    """True while the current `devices` dict is referenced by a handed-out snapshot."""
    snapshot: Snapshot | None = None
    """The snapshot handed out last; None once anything it shows changed."""
    dirty_allocations: set[DeviceKey] = dataclasses.field(default_factory=set)
    """Devices whose allocations moved since the last sync."""
    contrib: dict[DeviceKey, dict[str, tuple[Allocation, ...]]] = dataclasses.field(default_factory=dict)
    """Per device, by pod uid: the allocations of the pods that report on it."""
    silent: dict[DeviceKey, dict[str, tuple[Allocation, ...]]] = dataclasses.field(default_factory=dict)
    """Per device, by pod uid: allocations held with no report, through a DRA-backed extended
    resource's claim (KEP-5004) or as the kubelet's `List` names them (`apply_assignments`).
    Published with the others, never a health source: such pods report nothing on the device,
    so its slice (or NVML) keeps speaking for it."""
    version_floor: dict[DeviceKey, int] = dataclasses.field(default_factory=dict)
    """The last status version of each removed device, so one that comes back continues it."""
    idle_sources: dict[DeviceKey, str] = dataclasses.field(default_factory=dict)
    """Devices handed back to a source that agrees with their health, until the next fold."""
    ref_keys: dict[DeviceRef, set[DeviceKey]] = dataclasses.field(default_factory=dict)
    """By slice device: the keys of the devices it names."""
    node_keys: dict[str, set[DeviceKey]] = dataclasses.field(default_factory=dict)
    """By node: its devices' keys, so a count change looks at its node's devices only (the
    first list of 10,000 Nodes must not scan 80,000 devices for each)."""

    def put(self, key: DeviceKey, device: DeviceState) -> None:
        if self.shared:
            self.devices = dict(self.devices)
            self.shared = False
        if key not in self.devices:
            self.node_keys.setdefault(key[0], set()).add(key)
        self.devices[key] = device
        self.snapshot = None

    def delete(self, key: DeviceKey) -> None:
        device = self.devices.get(key)
        if device is None:
            return
        if self.shared:
            self.devices = dict(self.devices)
            self.shared = False
        del self.devices[key]
        on_node = self.node_keys.get(key[0])
        if on_node is not None:
            on_node.discard(key)
            if not on_node:
                del self.node_keys[key[0]]
        self.dirty_allocations.discard(key)
        self.contrib.pop(key, None)
        self.version_floor[key] = device.status_version
        if device.driver:
            keys = self.ref_keys.get((device.driver, device.pool, device.device_name))
            if keys is not None:
                keys.discard(key)
        self.snapshot = None
        if self.sink is not None:
            self.sink.record_removed(*key)

    def held(self, key: DeviceKey) -> bool:
        """Whether any pod holds the device, reporting on it or not."""
        return bool(self.contrib.get(key)) or bool(self.silent.get(key))

    def held_source(self, driver: str) -> str:
        """Who vouches for a device a pod holds: the kubelet, unless its driver streams nothing."""
        return SOURCE_SLICE if driver in self.slice_drivers else SOURCE_POD

    def fold_allocations(self) -> None:
        if not self.dirty_allocations:
            return
        devices, contrib, idle_sources = self.devices, self.contrib, self.idle_sources
        record = self.sink.record_allocations if self.sink is not None else None
        for key in self.dirty_allocations:
            current = devices.get(key)
            if current is None:
                continue
            contributions = contrib.get(key)
            if not contributions:
                merged: tuple[Allocation, ...] = ()
            elif len(contributions) == 1:
                (merged,) = contributions.values()
            else:
                merged = merge(contributions)
            reporting = bool(merged)
            silent = self.silent.get(key)
            if silent:
                merged = merge({**(contributions or {}), **silent})
            # Who vouches follows who holds: a pod while any reporting one does (its driver's
            # slice for a slice-health driver), else the idle source that took the device back
            # (`idle_status`), else what it was.
            if reporting:
                source = self.held_source(current.driver)
                if idle_sources:
                    idle_sources.pop(key, None)
            elif idle_sources:
                source = idle_sources.pop(key, current.source)
            else:
                source = current.source
            if (
                merged is not current.allocations and merged != current.allocations
            ) or source != current.source:
                updated = with_holders(current, merged, source)
                if self.shared:
                    self.put(key, updated)  # copies the dict a snapshot holds, once
                    devices = self.devices
                else:
                    devices[key] = updated
                    self.snapshot = None
                if record is not None:
                    record(updated)
        self.dirty_allocations.clear()
        idle_sources.clear()  # only keys of dirty devices are ever pending

    def set_silent(self, pod: TrackedPod, silent: dict[DeviceKey, tuple[Allocation, ...]]) -> None:
        """Replace the pod's report-less allocations; the devices whose holders moved are folded."""
        for key, allocations in pod.silent.items():
            if silent.get(key) == allocations:
                continue
            holders = self.silent.get(key)
            if holders is not None:
                holders.pop(pod.uid, None)
                if not holders:
                    del self.silent[key]
            self.dirty_allocations.add(key)
        for key, allocations in silent.items():
            if pod.silent.get(key) == allocations:
                continue
            self.silent.setdefault(key, {})[pod.uid] = allocations
            self.dirty_allocations.add(key)
        pod.silent = silent
        self.snapshot = None

    def idle_status(
        self,
        key: DeviceKey,
        health: str,
        message: str,
        source: str,
        now: float,
        sliced: GovernedDevice | None,
        uuid: str = "",
    ) -> None:
        """A device no pod holds takes (health, message) from `source`: created, changed, or
        (same health) only vouched for by it (no status change, no new version).

        On every hand-back of a pod's devices: positional arguments, no keyword dict."""
        device = self.devices.get(key)
        if device is None:
            if sliced is not None:
                self.ref_keys.setdefault(sliced.ref, set()).add(key)
            device = DeviceState(
                node=key[0],
                device=key[1],
                health=health,
                message=message,
                status_version=self.version_floor.pop(key, 0) + 1,
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
                if key in self.dirty_allocations:
                    # A hand-back: the fold rebuilds the device for its allocations anyway.
                    self.idle_sources[key] = source
                else:
                    self.resourced(key, device, source)
            return
        else:
            if health == "Unknown":
                unknown_since = device.unknown_since if device.health == "Unknown" else now
            else:
                unknown_since = None
            moved = device.source != source
            device = changed(device, health, message, now, unknown_since, source)
            if moved and self.sink is not None:
                # The status UPDATE does not write the source (it moves with the holders).
                self.sink.record_allocations(device)
        self.put(key, device)
        self.stats.status_changes += 1
        if self.sink is not None:
            self.sink.record_change(
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

    def resourced(self, key: DeviceKey, device: DeviceState, source: str) -> None:
        """Only the source moves (persisted with the allocations, which move with it)."""
        updated = sourced(device, source)
        self.put(key, updated)
        if self.sink is not None:
            self.sink.record_allocations(updated)
