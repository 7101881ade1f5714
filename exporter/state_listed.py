"""Node mode: the kubelet's pod-resources `List`, which says which pod holds which device-plugin GPU.

Before Kubernetes 1.36 (or with `ResourceHealthStatus` off) no pod's status names its
device-plugin devices; `List` does. Such devices are held with no report by the pods whose status
names none of them, so `gpu_device_allocation_info` says which pod has which GPU there too; they
never speak for a device's health.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import TYPE_CHECKING

from exporter.podresources import Assigned, Assignments
from exporter.snapshot import Allocation
from exporter.state_model import MIG_PREFIX, DeviceKey, TrackedPod, allocation_order, device_uuid
from exporter.state_table import DeviceTable

if TYPE_CHECKING:
    from exporter.state import DeviceStateStore


class ListedAssignments:
    """The devices the kubelet's `List` last named, by pod, and holding them on the table."""

    def __init__(self, store: DeviceStateStore, table: DeviceTable, node_name: str | None) -> None:
        self._store = store
        self._table = table
        self._node_name = node_name
        self.pods: Mapping[tuple[str, str], tuple[Assigned, ...]] = {}
        """Node mode: the device-plugin devices the kubelet's `List` last named, by (namespace, pod).
        Held with no report by a pod whose status names none of them (before Kubernetes 1.36)."""
        self.waiting = False
        """A listed device was not tracked yet (NVML had not read it): the next poll holds it."""

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
            self._table.stats.pod_resources_failures += 1
            return
        previous, listed = self.pods, assignments.pods
        if listed == previous and not self.waiting:
            return
        self.pods = listed
        named = previous.keys() | listed.keys()
        if not self.waiting:
            named = {n for n in named if previous.get(n) != listed.get(n)}
        self.relist_silent(named)

    def with_listed(
        self,
        pod: TrackedPod,
        extended: dict[DeviceKey, tuple[Allocation, ...]],
        reported: Container[DeviceKey],
    ) -> dict[DeviceKey, tuple[Allocation, ...]]:
        """The pod's report-less allocations: its DRA-backed extended resources' (`extended`) and
        the device-plugin devices the kubelet's `List` names for it, except those its status
        reports (`reported`: a report is the pod's word, never overridden). A MIG partition is
        held on its card, a time-slicing replica on its GPU, as for a report (`PodLayout.resolve`).
        Only devices already tracked (from NVML) are held: with no report, the pod makes no device."""
        listed = self.pods.get((pod.namespace, pod.name))
        if not listed:
            return extended
        node = self._node_name
        assert node is not None  # `pods` is filled in node mode only
        mig_parent, devices = self._store.nvml.mig_parent, self._table.devices
        found = {key: set(held) for key, held in extended.items()}
        for container, resource, device_id in listed:
            device = device_uuid(device_id.partition("::")[0])
            if not device:
                continue  # not a GPU's ID (another plugin's device): nothing gpuhealth tracks
            if device.startswith(MIG_PREFIX):
                device = mig_parent.get(device, device)
            key = (node, device)
            if key in reported:
                continue
            if key not in devices:
                self.waiting = True
                continue
            allocation = Allocation(pod.namespace, pod.name, container, resource, "")
            found.setdefault(key, set()).add(allocation)
        return {key: tuple(sorted(held, key=allocation_order)) for key, held in found.items()}

    def relist_silent(self, names: Container[tuple[str, str]]) -> None:
        """Hold afresh what `List` names for these pods (by namespace and name) on this node."""
        self.waiting = False
        store = self._store
        for pod in list(store.pods.pods.values()):
            observation = pod.observation
            if (
                observation is None
                or observation.terminal
                or observation.node != self._node_name
                or (pod.namespace, pod.name) not in names
            ):
                continue
            extended = (
                store.layout.resolve_silent(observation, set(), pod.allocations)
                if observation.extended or observation.claimed
                else {}
            )
            silent = self.with_listed(pod, extended, pod.allocations)
            if silent or pod.silent:
                self._table.set_silent(pod, silent)
