"""ResourceClaims and ResourceSlices: DRA identities, and a slice's word on the devices it publishes.

Owns the identity index (claims, slices and their devices' taints), what a claim or slice change
means for the pods that resolved through it and the devices it names, and a tracked slice device
speaking for a device no pod holds (and, for a slice-health driver, for a held one too).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from exporter.identity import DeviceRef, GovernedDevice, IdentityIndex, parse_claim, parse_slice
from exporter.parse import ResourceEntry
from exporter.snapshot import SOURCE_SLICE, DeviceState
from exporter.state_model import DeviceKey, TrackedPod
from exporter.state_table import DeviceTable
from gpuhealth.clock import Clock

if TYPE_CHECKING:
    from exporter.state import DeviceStateStore


class SliceEvidence:
    """Claims and slices as the store knows them, and what their changes do to devices."""

    def __init__(
        self, store: DeviceStateStore, table: DeviceTable, clock: Clock, node_name: str | None
    ) -> None:
        self._store = store
        self._table = table
        self._clock = clock
        self._node_name = node_name
        self.identity = IdentityIndex()

    def apply_claim(self, event_type: str, obj: Any) -> None:
        claim = parse_claim(obj)
        if isinstance(claim, str):
            self._table.stats.parse_errors[claim] += 1
            return
        if event_type == "DELETED":
            self.claim_gone(claim.namespace, claim.name)
        elif self.identity.put_claim(claim):
            self._store.pods.reapply(("claim", claim.namespace, claim.name))

    def apply_slice(self, event_type: str, obj: Any) -> None:
        parsed = parse_slice(obj)
        if isinstance(parsed, str):
            self._table.stats.parse_errors[parsed] += 1
            return
        name, devices = parsed
        if event_type == "DELETED":
            self.slice_changed(self.identity.drop_slice(name))
        else:
            self.slice_changed(self.identity.put_slice(name, devices))

    def claim_gone(self, namespace: str, name: str) -> None:
        if self.identity.drop_claim(namespace, name):
            self._store.pods.reapply(("claim", namespace, name))

    def slice_changed(self, refs: set[DeviceRef]) -> None:
        table = self._table
        now = self._clock.now()
        for ref in refs:
            self._store.pods.reapply(("ref", *ref))
            taints = self.identity.taints(ref)
            sliced = self.identity.devices.get(ref)
            for key in list(table.ref_keys.get(ref, ())):
                device = table.devices.get(key)
                if device is None:
                    continue
                if sliced is None and not table.contrib.get(key):
                    table.delete(key)
                elif device.driver_taints != taints:
                    updated = dataclasses.replace(device, driver_taints=taints)
                    table.put(key, updated)
                    if table.sink is not None:
                        table.sink.record_device(updated)
            if sliced is not None and self.tracks(sliced):
                key = slice_key(sliced)
                made = key not in table.devices
                self.from_slice(key, sliced, now)
                if made and key in table.devices and self._store.pods.users.get(("ref", *ref)):
                    # A pod that holds it with no report waited for it: with no report it makes
                    # no device, so it resolves again now that the slice made one.
                    self._store.pods.reapply(("ref", *ref))

    def tracks(self, sliced: GovernedDevice) -> bool:
        """Whether a slice device is this exporter's: every node's in cluster mode, its own in node mode."""
        return bool(sliced.node) and (self._node_name is None or sliced.node == self._node_name)

    def from_slice(self, key: DeviceKey, sliced: GovernedDevice, now: float) -> None:
        """A slice device no pod holds: tracked with its driver taints as its health evidence.

        A device a pod holds keeps the kubelet's report (the authority while it runs there);
        only its taints follow the slice (`slice_changed`)."""
        if self._table.contrib.get(key):
            return
        health, message = sliced.health
        self._table.idle_status(key, health, message, SOURCE_SLICE, now, sliced)

    def speaking_slice(self, device: DeviceState) -> GovernedDevice | None:
        """The tracked ResourceSlice device that speaks for `device` when no pod holds it."""
        if not device.driver:
            return None
        sliced = self.identity.devices.get((device.driver, device.pool, device.device_name))
        if sliced is None or not self.tracks(sliced) or slice_key(sliced) != (device.node, device.device):
            return None
        return sliced

    def slice_entry(self, entry: ResourceEntry, ref: DeviceRef) -> ResourceEntry:
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

    def holds_slice_health(self, pod: TrackedPod) -> bool:
        """Whether any device of the pod belongs to a slice-health driver (its entries are
        rewritten by `PodLayout.resolve`, so a repeat cannot take the fast path of raw entries)."""
        drivers = self._table.slice_drivers
        return any(used[0] == "ref" and used[1] in drivers for used in pod.uses)

    def superseded(self, device: DeviceState) -> bool:
        """Whether a `<driver>/<pool>/<device>` identity gave way to the uuid its slice now names."""
        if device.driver and not device.uuid:
            sliced = self.identity.devices.get((device.driver, device.pool, device.device_name))
            return sliced is not None and bool(sliced.uuid)
        return False

    def relist_claims_end(self, seen: set[Any]) -> None:
        for key in [k for k in self.identity.claims if k not in seen]:
            self.claim_gone(*key)

    def relist_slices_end(self, seen: set[Any]) -> None:
        for name in [n for n in self.identity.slices if n not in seen]:
            self.slice_changed(self.identity.drop_slice(name))


def slice_key(sliced: GovernedDevice) -> DeviceKey:
    """The key a pod's entry on this slice device resolves to (`identity.Resolved.device`)."""
    return (sliced.node, sliced.uuid or f"{sliced.driver}/{sliced.pool}/{sliced.device}")
