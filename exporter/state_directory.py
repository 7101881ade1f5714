"""The store and the device directory: what is handed to the sink, and the replay after a restart.

Confirmations are cheap by design, since most pod events are nothing else: such an event only
notes "pod P confirmed at t". `sync_sink` (before the directory's periodic write) hands the
confirmation times, allocation changes and pods' latest resourceVersions to the sink;
`restore` starts the store from what the directory persisted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from exporter.sharding import OwnedNodes, Shard
from exporter.snapshot import SOURCE_POD, DeviceState, NodeState
from exporter.state_model import DeviceKey, PodVersion, TrackedPod
from exporter.state_table import DeviceTable

if TYPE_CHECKING:
    from exporter.state import DeviceStateStore


class DirectorySync:
    """Hands pending changes to the `DirectorySink`, and replays what it persisted."""

    def __init__(self, store: DeviceStateStore, table: DeviceTable, shard: Shard, owns: OwnedNodes) -> None:
        self._store = store
        self._table = table
        self._shard = shard
        self._owns = owns

    def sync_sink(self) -> None:
        """Hand pending confirmations and pod versions to the sink without rebuilding devices.

        The directory needs only the times; rebuilding 80,000 immutable devices is left to
        the next snapshot, which a scrape asks for far less often than the directory writes.
        """
        table, pods = self._table, self._store.pods
        table.fold_allocations()
        sink = table.sink
        if sink is not None:
            devices = table.devices
            for pod, seen in pods.confirmations(pods.unpersisted):
                confirmed = []
                for key, (health, message) in pod.values.items():
                    current = devices.get(key)
                    if current is not None and current.health == health and current.message == message:
                        confirmed.append(key)
                if confirmed:
                    sink.record_heartbeats(confirmed, seen)
            for uid in pods.dirty_pods:
                dirty = pods.pods.get(uid)
                if dirty is not None:
                    sink.record_pod(PodVersion(uid, dirty.namespace, dirty.name, dirty.resource_version))
        pods.unpersisted.clear()
        pods.dirty_pods.clear()

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
        table, known = self._table, self._store.pods.pods
        if self._shard.sharded:
            devices = [d for d in devices if self._owns(d.node)]
            leases = {node: renewed for node, renewed in leases.items() if self._owns(node)}
        by_name = {(p.namespace, p.name): p for p in pods}
        for pod_version in by_name.values():
            rv = pod_version.resource_version
            known[pod_version.uid] = TrackedPod(
                pod_version.uid,
                pod_version.namespace,
                pod_version.name,
                rv,
                int(rv) if rv.isdigit() else None,
            )
        for device in devices:
            key = (device.node, device.device)
            table.put(key, device)
            if device.driver:
                table.ref_keys.setdefault((device.driver, device.pool, device.device_name), set()).add(key)
            for allocation in device.allocations:
                found = by_name.get((allocation.namespace, allocation.pod))
                uid = found.uid if found is not None else f"{allocation.namespace}/{allocation.pod}"
                pod = known.get(uid)
                if pod is None:
                    pod = known[uid] = TrackedPod(uid, allocation.namespace, allocation.pod, "")
                if device.source != SOURCE_POD:
                    # Held with no report (a DRA-backed extended resource, or from `List`): the fold makes any
                    # device a reporting pod holds `pod`-sourced, so another source means silent.
                    pod.silent[key] = (*pod.silent.get(key, ()), allocation)
                    table.silent.setdefault(key, {})[uid] = pod.silent[key]
                    continue
                pod.allocations[key] = (*pod.allocations.get(key, ()), allocation)
                pod.values[key] = (device.health, device.message)
                table.contrib.setdefault(key, {})[uid] = pod.allocations[key]
        table.version_floor.update(removed_versions)
        for node, renewed in leases.items():
            self._store.nodes.leases[node] = NodeState(node=node, lease_renewed_at=renewed)
        table.snapshot = None
