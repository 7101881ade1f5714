"""Nodes: kubelet Leases (whether a node's kubelet still speaks) and Node allocatable counts.

A Lease's renewal bounds how late a pod's repeated report confirms a device; a deleted Lease
means a deleted node. A Node's device-plugin GPU counts speak for its idle device-plugin GPUs
that neither a ResourceSlice nor NVML names (`exporter.nodealloc`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exporter import parse
from exporter.nodealloc import NodeCounts, NodeCountsError, gpu_counts, speaks_healthy, unvouched
from exporter.snapshot import SOURCE_NODE, NodeState
from exporter.state_model import DeviceKey
from exporter.state_table import DeviceTable
from gpuhealth.clock import Clock
from gpuhealth.kube.meta import NODE_LEASE_NAMESPACE, parse_rfc3339

if TYPE_CHECKING:
    from exporter.state import DeviceStateStore


class NodeEvidence:
    """Each node's Lease renewal and device-plugin GPU counts."""

    def __init__(self, store: DeviceStateStore, table: DeviceTable, clock: Clock) -> None:
        self._store = store
        self._table = table
        self._clock = clock
        self.leases: dict[str, NodeState] = {}
        """By node: its kubelet Lease's latest renewal."""
        self.counts: dict[str, tuple[NodeCounts, float]] = {}
        """By node: its device-plugin GPU counts (`exporter.nodealloc`), and since when they are
        what they are (an update that changes no count keeps the time)."""

    def apply_lease(self, event_type: str, obj: Any) -> None:
        table = self._table
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            table.stats.parse_errors[parse.MALFORMED_LEASE] += 1
            return
        if meta.get("namespace", NODE_LEASE_NAMESPACE) != NODE_LEASE_NAMESPACE:  # type: ignore[union-attr]
            return
        if event_type == "DELETED":
            self._store.node_gone(name)
            return
        spec = obj.get("spec")
        renewed = parse_rfc3339(spec.get("renewTime")) if isinstance(spec, dict) else None
        if renewed is None and isinstance(spec, dict) and spec.get("renewTime") is not None:
            table.stats.parse_errors[parse.MALFORMED_LEASE] += 1
        previous = self.leases.get(name)
        if previous is not None and previous.lease_renewed_at == renewed:
            return
        self.leases[name] = NodeState(node=name, lease_renewed_at=renewed)
        table.snapshot = None
        if table.sink is not None:
            table.sink.record_lease(name, renewed)

    def lease_gone(self, node: str) -> None:
        """The node's Lease was deleted (the node was): its renewal is forgotten, here and on disk."""
        table = self._table
        if self.leases.pop(node, None) is not None:
            table.snapshot = None
            if table.sink is not None:
                table.sink.record_lease(node, None)

    def apply_node(self, event_type: str, obj: Any) -> None:
        """One Node event: its device-plugin GPU counts, which speak for its idle device-plugin GPUs.

        Only a change of the counts is looked at further (the kubelet rewrites its node's status
        for conditions, images and addresses far more often than a device's health moves). When
        every registered device is allocatable again, each idle device-plugin GPU of the node no
        other source speaks for and that is not Healthy turns Healthy (`exporter.nodealloc`); a
        count below capacity names no device: it makes none Unhealthy, and takes back only the
        Healthy the counts alone gave (`unvouched`: Unknown, unless a known failure explains it)."""
        table = self._table
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            table.stats.parse_errors[parse.MALFORMED_NODE] += 1
            return
        if event_type == "DELETED":
            self.counts.pop(name, None)
            return
        try:
            counts = gpu_counts(obj)
        except NodeCountsError:
            # The last counts stand: a status that cannot be read says nothing new.
            table.stats.parse_errors[parse.MALFORMED_NODE] += 1
            return
        previous = self.counts.get(name)
        if previous is not None and previous[0] == counts:
            return
        now = self._clock.now()
        self.counts[name] = (counts, now)
        keys = sorted(table.node_keys.get(name, ()))
        if counts.all_allocatable:
            for key in keys:
                self.from_node(key, counts, now)
            return
        held = {k: table.held(k) for k in keys}
        for device in unvouched(counts, ((table.devices[k], held[k]) for k in keys)):
            key = (device.node, device.device)
            table.idle_status(key, "Unknown", counts.short_message(), SOURCE_NODE, now, None, device.uuid)

    def from_node(self, key: DeviceKey, counts: NodeCounts, since: float) -> None:
        """An idle device-plugin GPU takes its node's word (`speaks_healthy`), where neither a
        ResourceSlice nor NVML speaks for it (they name the device; a count does not)."""
        table, store = self._table, self._store
        device = table.devices.get(key)
        if device is None or store.slices.speaking_slice(device) is not None:
            return
        if store.nvml.reads(key, device):
            return
        if speaks_healthy(counts, since, device, held=table.held(key)):
            now = self._clock.now()
            table.idle_status(key, "Healthy", counts.message(), SOURCE_NODE, now, None, device.uuid)

    def relist_nodes_end(self, seen: set[Any]) -> None:
        for node in [n for n in self.counts if n not in seen]:
            del self.counts[node]
