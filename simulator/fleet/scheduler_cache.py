"""What the scheduler knows of the cluster: its informers' cache, kept from store events.

`SchedulerCache` holds the nodes as `NodeInfo`s with what their bound pods request, an index
of nodes by free `nvidia.com/gpu` (so a GPU pod looks at the nodes that can hold it, not all
10,000), the ResourceSlices' devices by node, the claims and the devices they hold, the
DeviceClasses and DeviceTaintRules. Each `on_*` method takes one watch event (type and
object) and returns whether it could make an unschedulable pod fit (the scheduler's
queueing hint). No store, no clock: the scheduler feeds it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpuhealth.plugin_resources import GPU_RESOURCE
from simulator.fleet.dra_allocator import DeviceId, MatchCache, SliceDevice, claim_devices, slice_devices
from simulator.fleet.scheduler_filters import NodeInfo, QuantityError, node_info, pod_requests

_TERMINAL = ("Succeeded", "Failed")


class SchedulerCache:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeInfo] = {}
        self._order: list[str] = []
        self._positions: dict[str, int] = {}
        self._next_start = 0
        self._by_free_gpu: dict[int, dict[str, None]] = {}
        self._gpu_bucket: dict[str, int] = {}
        self.usage: dict[str, tuple[str, dict[str, int]]] = {}
        """Bound, unfinished pod (namespace/name) -> (node, requests)."""
        self._on_node: dict[str, set[str]] = {}
        self._slices: dict[str, tuple[str, list[SliceDevice]]] = {}
        self._node_slices: dict[str, dict[str, None]] = {}
        self.devices: dict[str, list[SliceDevice]] = {}
        """Node -> the devices of its ResourceSlices."""
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.in_use: dict[DeviceId, tuple[str, str]] = {}
        """Device -> the claim (namespace, name) allocated it."""
        self.classes: dict[str, dict[str, Any]] = {}
        self.rules: dict[str, dict[str, Any]] = {}
        self.matches: MatchCache = {}
        """Which devices of a node a request's selectors match; cleared when slices or classes change."""
        self._device_node: dict[DeviceId, str] = {}
        self._used_on: dict[str, int] = {}

    def free_devices(self, node: str) -> int:
        """Devices in the node's slices that no claim holds: fewer than a pod needs, no need to look."""
        return len(self.devices.get(node, ())) - self._used_on.get(node, 0)

    # ------------------------------------------------------------------ nodes

    def on_node(self, etype: str, obj: dict[str, Any]) -> bool:
        name = (obj.get("metadata") or {}).get("name", "")
        if etype == "DELETED":
            info = self.nodes.pop(name, None)
            if info is not None:
                self._unindex(name)
                pos = self._positions.pop(name)
                self._order[pos] = ""  # positions stay stable; holes are skipped
            return False
        new = node_info(obj)
        old = self.nodes.get(name)
        if old is None:
            self._positions[name] = len(self._order)
            self._order.append(name)
            for key in self._on_node.get(name, ()):
                self._add_requests(new, self.usage[key][1])
        else:
            new.requested, new.pods = old.requested, old.pods
        self.nodes[name] = new
        self._reindex(new)
        return old is None or old.signature() != new.signature()

    def _reindex(self, info: NodeInfo) -> None:
        free = max(0, info.free(GPU_RESOURCE) // 1000)
        before = self._gpu_bucket.get(info.name)
        if before == free:
            return
        if before is not None:
            self._by_free_gpu[before].pop(info.name, None)
        self._by_free_gpu.setdefault(free, {})[info.name] = None
        self._gpu_bucket[info.name] = free

    def _unindex(self, name: str) -> None:
        before = self._gpu_bucket.pop(name, None)
        if before is not None:
            self._by_free_gpu[before].pop(name, None)

    def gpu_candidates(self, gpus: int) -> Iterator[str]:
        """Nodes with at least `gpus` free `nvidia.com/gpu`, the freest first."""
        for free in sorted((f for f in self._by_free_gpu if f >= gpus), reverse=True):
            yield from list(self._by_free_gpu[free])

    def all_candidates(self) -> Iterator[str]:
        """Every node once, starting where the previous pod's search ended (as kube-scheduler
        rotates its start, so pods that fit anywhere spread over the fleet)."""
        order = self._order
        if not order:
            return
        start = self._next_start % len(order)
        for i in range(len(order)):
            name = order[(start + i) % len(order)]
            if name:
                self._next_start = start + i + 1
                yield name

    # ------------------------------------------------------------------ pods

    @staticmethod
    def _add_requests(info: NodeInfo, requests: dict[str, int], sign: int = 1) -> None:
        for resource, amount in requests.items():
            info.requested[resource] = info.requested.get(resource, 0) + sign * amount
        info.pods += sign

    def assume(self, key: str, node: str, requests: dict[str, int]) -> None:
        """A pod is bound to `node` (by us, or seen in the store)."""
        current = self.usage.get(key)
        if current is not None:
            if current[0] == node:
                return
            self.forget(key)
        self.usage[key] = (node, requests)
        self._on_node.setdefault(node, set()).add(key)
        info = self.nodes.get(node)
        if info is not None:
            self._add_requests(info, requests)
            self._reindex(info)

    def forget(self, key: str) -> bool:
        """A pod left its node (deleted or finished); True when it held anything."""
        current = self.usage.pop(key, None)
        if current is None:
            return False
        node, requests = current
        self._on_node.get(node, set()).discard(key)
        info = self.nodes.get(node)
        if info is not None:
            self._add_requests(info, requests, -1)
            self._reindex(info)
        return True

    def on_pod(self, etype: str, key: str, fields: dict[str, str], load: Any) -> bool:
        """A pod event, read from its indexed fields; `load()` parses the object when needed."""
        node = fields.get("spec.nodeName", "")
        if etype == "DELETED" or not node or fields.get("status.phase") in _TERMINAL:
            return self.forget(key)
        current = self.usage.get(key)
        if current is not None and current[0] == node:
            return False
        try:
            requests = pod_requests(load().get("spec") or {})
        except QuantityError:
            requests = {}
        self.assume(key, node, requests)
        return False

    # ------------------------------------------------------------------ DRA

    def on_slice(self, etype: str, obj: dict[str, Any]) -> bool:
        name = (obj.get("metadata") or {}).get("name", "")
        old = self._slices.pop(name, None)
        touched = set()
        if old is not None:
            self._node_slices.get(old[0], {}).pop(name, None)
            touched.add(old[0])
        if etype != "DELETED":
            node = str((obj.get("spec") or {}).get("nodeName") or "")
            self._slices[name] = (node, slice_devices(obj))
            self._node_slices.setdefault(node, {})[name] = None
            touched.add(node)
        if old is not None:
            for device in old[1]:
                self._device_node.pop(device.id, None)
        for node in touched:
            devices = [d for s in self._node_slices.get(node, {}) for d in self._slices[s][1]]
            self.devices[node] = devices
            for device in devices:
                self._device_node[device.id] = node
            self._used_on[node] = sum(1 for d in devices if d.id in self.in_use)
        self.matches.clear()
        return True

    def on_claim(self, etype: str, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        old = self.claims.pop(key, None)
        held_before = claim_devices(old) if old else []
        for device in held_before:
            if self.in_use.get(device) == key:
                del self.in_use[device]
                self._count(device, -1)
        held_now: list[DeviceId] = []
        if etype != "DELETED":
            self.claims[key] = obj
            held_now = claim_devices(obj)
            for device in held_now:
                if device not in self.in_use:
                    self._count(device, 1)
                self.in_use[device] = key
        # Devices given back can help a pending pod; a new claim may be the one a pod waits for.
        return old is None or bool(set(held_before) - set(held_now))

    def _count(self, device: DeviceId, delta: int) -> None:
        node = self._device_node.get(device)
        if node is not None:
            self._used_on[node] = self._used_on.get(node, 0) + delta

    def on_class(self, etype: str, obj: dict[str, Any]) -> bool:
        self.matches.clear()
        name = (obj.get("metadata") or {}).get("name", "")
        if etype == "DELETED":
            self.classes.pop(name, None)
        else:
            self.classes[name] = obj
        return True

    def on_rule(self, etype: str, obj: dict[str, Any]) -> bool:
        name = (obj.get("metadata") or {}).get("name", "")
        if etype == "DELETED":
            self.rules.pop(name, None)
        else:
            self.rules[name] = obj
        return True
