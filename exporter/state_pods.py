"""Pods' reports (`status.allocatedResourcesStatus`): the kubelet's word on the devices they hold.

Owns the pods the store knows, their resourceVersions (duplicates and out-of-order deliveries
are counted, not applied), the confirmations pending a sync, and which claims and slice devices
each pod's identities depend on. How a pod's entries become devices and allocations is
`exporter.state_pod_layout`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from exporter import parse
from exporter.decode import Pod, pod_from_dict
from exporter.parse import (
    PodObservation,
    kept_signature,
    parse_pod_struct,
    pod_signature,
    pod_struct_signature,
)
from exporter.state_model import DUPLICATE, OUT_OF_ORDER, DeviceKey, TrackedPod
from exporter.state_table import DeviceTable
from gpuhealth.clock import Clock
from gpuhealth.kube.meta import is_newer

if TYPE_CHECKING:
    from exporter.state import DeviceStateStore


class PodReports:
    """The pods holding devices and what each reported; single-threaded, like the store."""

    def __init__(self, store: DeviceStateStore, table: DeviceTable, clock: Clock) -> None:
        self._store = store
        self._table = table
        self._stats = table.stats
        self._clock = clock
        self._now = clock.now
        self.pods: dict[str, TrackedPod] = {}
        self.confirmed: dict[str, float] = {}
        """Pods (uid) whose reports were confirmed since the last sync, and when."""
        self.unpersisted: dict[str, float] = {}
        """The same confirmations, until handed to the sink (which may happen before a snapshot)."""
        self.dirty_pods: set[str] = set()
        """Pods whose resourceVersion moved since the last sync."""
        self.users: dict[tuple[str, ...], set[str]] = {}
        """By claim or slice device (`TrackedPod.uses`): the pods whose identities depend on it."""

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
                self._stats.parse_errors[parse.MALFORMED_POD] += 1
                return
            uid = smeta.uid or f"{smeta.namespace}/{smeta.name}"
            if event_type == "DELETED":
                self.remove(uid)
                return
            rv = smeta.resource_version or ""
            signature: object = pod_struct_signature(struct)
        else:
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            if not isinstance(meta, dict):
                self._stats.parse_errors[parse.MALFORMED_POD] += 1
                return
            muid = meta.get("uid")
            uid = muid if isinstance(muid, str) and muid else f"{meta.get('namespace')}/{meta.get('name')}"
            if event_type == "DELETED":
                self.remove(uid)
                return
            mrv = meta.get("resourceVersion")
            rv = mrv if isinstance(mrv, str) else ""
            signature = pod_signature(obj)
        rv_int = int(rv) if rv.isdigit() else None
        pod = self.pods.get(uid)
        if pod is not None and pod.observation is not None:
            if rv == pod.resource_version:
                if not listed:
                    self._stats.events_ignored[DUPLICATE] += 1
                return
            if rv_int is not None and pod.rv_number is not None and rv_int < pod.rv_number:
                self._stats.events_ignored[OUT_OF_ORDER] += 1
                return
            if signature is not None and signature == pod.signature:
                # Nothing device-related moved: the pod confirms what it reported (the hot path).
                pod.resource_version, pod.rv_number = rv, rv_int
                self.confirmed[uid] = self.unpersisted[uid] = self._now()
                self.dirty_pods.add(uid)
                self._table.snapshot = None
                return
        elif pod is not None and rv and not is_newer(rv, pod.resource_version):
            # Restored from the directory: only what is newer than the persisted version counts.
            if not listed or rv != pod.resource_version:
                self._stats.events_ignored[DUPLICATE if rv == pod.resource_version else OUT_OF_ORDER] += 1
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
            self.dirty_pods.add(uid)
            return
        observation = parse.parse_pod(obj) if struct is None else parse_pod_struct(struct)
        if observation is None:
            self._stats.parse_errors[parse.MALFORMED_POD] += 1
            return
        for reason in observation.errors:
            self._stats.parse_errors[reason] += 1
        if pod is None:
            pod = TrackedPod(uid, observation.namespace, observation.name, rv)
            self.pods[uid] = pod
        pod.resource_version, pod.rv_number = rv, rv_int
        pod.signature = kept_signature(signature)
        self.apply_observation(pod, observation, self._clock.now())
        self.dirty_pods.add(uid)

    def apply_observation(
        self, pod: TrackedPod, observation: PodObservation, now: float, *, confirm: bool = True
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
            and not observation.claimed
            and not pod.silent
            and (observation.namespace, observation.name) not in self._store.listed.pods
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
            observation.claimed,
        )
        if (
            confirm
            and pod.layout == layout
            and pod.entry_keys is not None
            and not (self._table.slice_drivers and self._store.slices.holds_slice_health(pod))
        ):
            # Same devices, same allocations as last time: only reported values can have moved.
            grouped: dict[DeviceKey, list[parse.ResourceEntry]] = {}
            for key, entry in zip(pod.entry_keys, entries, strict=True):
                grouped.setdefault(key, []).append(entry)
            take_value = self._store.layout.take_value
            for key, group in grouped.items():
                take_value(pod, key, group, now)
        else:
            self._store.layout.apply_layout(pod, observation, now)
            pod.layout = layout
        if confirm and pod.values:
            # Values this pod repeats (and new ones that already held) are confirmed now.
            self.confirmed[pod.uid] = self.unpersisted[pod.uid] = now
            self._table.snapshot = None

    def _terminate(self, pod: TrackedPod) -> None:
        """The pod reached Succeeded or Failed: every allocation is released, nothing is reported.

        What `apply_observation` does with a terminal observation without entries, minus
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
        table = self._table
        if pod.silent:
            table.set_silent(pod, {})
        if pod.uses:
            self.set_uses(pod, set())
        # What `release` does per device, in one loop (every pod replacement comes here).
        contrib, devices, dirty, uid = table.contrib, table.devices, table.dirty_allocations, pod.uid
        store = self._store
        nvml = store.nvml.view
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
            if not contributions and store.superseded(device):
                superseded.append(key)
            else:
                dirty.add(key)
                if not contributions and (device.driver or nvml is not None):
                    idle.append(key)
        if pod.allocations:
            pod.allocations.clear()
            table.snapshot = None
        for key in superseded:
            table.delete(key)
        for key in idle:
            store.handed_back(key)

    def release(self, pod: TrackedPod, key: DeviceKey) -> None:
        """The pod no longer holds the device; drop a provisional device nobody holds."""
        pod.allocations.pop(key, None)
        pod.values.pop(key, None)
        table, store = self._table, self._store
        contributions = table.contrib.get(key)
        if contributions is not None:
            contributions.pop(pod.uid, None)
        device = table.devices.get(key)
        if device is None:
            return
        if not contributions and store.superseded(device):
            table.delete(key)
            return
        table.dirty_allocations.add(key)
        table.snapshot = None
        if not contributions and (
            device.driver or store.nvml.view is not None or device.node in store.nodes.counts
        ):
            store.handed_back(key)

    def remove(self, uid: str) -> None:
        """The pod is gone (deleted, or missing from a relist): it holds nothing any more."""
        pod = self.pods.pop(uid, None)
        self.confirmed.pop(uid, None)
        self.unpersisted.pop(uid, None)
        self.dirty_pods.discard(uid)
        if pod is None:
            return
        for key in list(pod.allocations):
            self.release(pod, key)
        if pod.silent:
            self._table.set_silent(pod, {})
        self.set_uses(pod, set())
        sink = self._table.sink
        if sink is not None:
            sink.forget_pod(uid)

    def set_uses(self, pod: TrackedPod, uses: set[tuple[str, ...]]) -> None:
        for used in pod.uses - uses:
            users = self.users.get(used)
            if users is not None:
                users.discard(pod.uid)
                if not users:
                    del self.users[used]
        for used in uses - pod.uses:
            self.users.setdefault(used, set()).add(pod.uid)
        pod.uses = uses

    def reapply(self, used: tuple[str, ...]) -> None:
        """Resolve again every pod whose identities depend on a claim or slice device that changed."""
        now = self._clock.now()
        for uid in list(self.users.get(used, ())):
            pod = self.pods.get(uid)
            if pod is not None and pod.observation is not None:
                self.apply_observation(pod, pod.observation, now, confirm=False)

    def confirmations(self, pending: dict[str, float]) -> Iterator[tuple[TrackedPod, float]]:
        """(pod, time it confirmed its reports up to) for each pending confirmation."""
        pods, nodes = self.pods, self._store.nodes.leases
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
