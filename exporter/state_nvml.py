"""Node mode: NVML readings and the kubelet's allocatable devices (pod-resources `GetAllocatableResources`).

Owns the latest NVML view (readings, when each GPU was last reached, XID counts), each MIG
partition's card, and the kubelet's allocatable devices as last read; together they speak for a
GPU no pod holds and no ResourceSlice names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from exporter.podresources import Allocatable
from exporter.snapshot import SOURCE_NVML, SOURCE_SLICE, DeviceState, NvmlView
from exporter.state_model import DeviceKey
from exporter.state_table import DeviceTable
from gpuhealth.clock import Clock
from gpuhealth.nvml import DeviceReading, XidEvent

if TYPE_CHECKING:
    from exporter.state import DeviceStateStore

NVML_REACHABLE_MESSAGE = "NVML: reachable"
"""The message of an NVML-reported Healthy (never one a kubelet writes)."""


POD_RESOURCES_UNLISTED = (
    "kubelet pod-resources: not allocatable (its device plugin reports the GPU Unhealthy); NVML: reachable"
)
"""The message of an idle device-plugin GPU the kubelet leaves out of its allocatable devices."""


class NvmlEvidence:
    """What NVML and the kubelet's allocatable devices say of this node's GPUs."""

    def __init__(
        self, store: DeviceStateStore, table: DeviceTable, clock: Clock, node_name: str | None, *, nvml: bool
    ) -> None:
        self._store = store
        self._table = table
        self._clock = clock
        self._node_name = node_name
        self.view: NvmlView | None = NvmlView() if nvml else None
        self.mig_parent: dict[str, str] = {}
        """Node mode: each MIG device's card (MIG UUID -> card UUID), from NVML. A partition's pods
        are held on its card: the card is the device gpuhealth governs."""
        self._allocatable: Allocatable | None = None
        """Node mode: the kubelet's allocatable device-plugin devices, as last read (None: never)."""

    def apply_nvml(self, readings: Iterable[DeviceReading], xids: Iterable[XidEvent]) -> None:
        """Node mode: take the latest NVML poll (readings by UUID) and count new XID events."""
        if self.view is None:
            return
        now = self._clock.now()
        by_uuid = {r.uuid: r for r in readings}
        read_at = dict(self.view.read_at)
        for uuid, reading in by_uuid.items():
            if reading.reachable:
                read_at[uuid] = now
        counts = dict(self.view.xid_counts)
        for event in xids:
            counts[(event.uuid, event.xid)] = counts.get((event.uuid, event.xid), 0) + 1
        self.view = NvmlView(readings=by_uuid, read_at=read_at, xid_counts=counts)
        self._table.snapshot = None
        listed = self._store.listed
        mig_parent = {m.uuid: uuid for uuid, r in by_uuid.items() for m in r.mig_devices}
        if mig_parent != self.mig_parent:
            # A card repartitioned (or first read): the pods on its partitions resolve afresh.
            moved = {
                m
                for m in mig_parent.keys() | self.mig_parent.keys()
                if mig_parent.get(m) != self.mig_parent.get(m)
            }
            self.mig_parent = mig_parent
            for mig_uuid in sorted(moved):
                self._store.pods.reapply(("mig", mig_uuid))
            if listed.pods:
                listed.relist_silent(listed.pods)
        if self._node_name is not None:
            # Every GPU NVML lists is tracked, held or not: an idle one keeps evidence.
            for uuid, reading in by_uuid.items():
                self.from_nvml((self._node_name, uuid), reading, now)
            if listed.waiting:
                listed.relist_silent(listed.pods)  # the devices `List` named are tracked now

    def apply_pod_resources(self, allocatable: Allocatable | None) -> None:
        """Node mode: the kubelet's allocatable devices as just read (None: the read failed).

        It speaks for a device-plugin GPU no pod holds, with NVML: a GPU NVML reaches that the
        kubelet does not list is one its device plugin reports Unhealthy. A failed read changes
        no evidence (the last answer stands) and is counted."""
        if self.view is None or self._node_name is None:
            return
        if allocatable is None:
            self._table.stats.pod_resources_failures += 1
            return
        if allocatable == self._allocatable:
            return
        self._allocatable = allocatable
        now = self._clock.now()
        for uuid, reading in self.view.readings.items():
            self.from_nvml((self._node_name, uuid), reading, now)

    def reads(self, key: DeviceKey, device: DeviceState) -> bool:
        """Whether NVML speaks for the device: this node's, and in the last poll."""
        return self.view is not None and key[0] == self._node_name and device.uuid in self.view.readings

    def reading(self, key: DeviceKey, device: DeviceState) -> DeviceReading | None:
        """The last poll's reading of a device of this node, if NVML lists it."""
        if self.view is not None and device.uuid and key[0] == self._node_name:
            return self.view.readings.get(device.uuid)
        return None

    def from_nvml(self, key: DeviceKey, reading: DeviceReading, now: float) -> None:
        """Node mode: a GPU NVML lists that no pod holds and no slice speaks for."""
        table = self._table
        if table.contrib.get(key):
            return
        current = table.devices.get(key)
        if current is not None and (
            current.source == SOURCE_SLICE or self._store.slices.speaking_slice(current)
        ):
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
        table.idle_status(key, health, message, SOURCE_NVML, now, None, reading.uuid)


def nvml_health(reading: DeviceReading) -> tuple[str, str]:
    """(health, message) NVML's reachability gives a GPU no pod holds: a lost GPU is Unhealthy,
    any other unreadable one Unknown (an error reading it is no verdict on the card)."""
    if reading.reachable:
        return "Healthy", NVML_REACHABLE_MESSAGE
    error = reading.error or "unreachable"
    return ("Unhealthy" if "LOST" in error.upper() else "Unknown"), f"NVML: {error}"
