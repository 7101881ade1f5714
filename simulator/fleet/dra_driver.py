"""The NVIDIA DRA driver on the DRA nodes: ResourceSlices, device taints and the health stream.

It publishes one ResourceSlice per node (driver `gpu.nvidia.com`, devices `gpu-<i>`), taints a
device in that slice after a fatal XID or a lost GPU and for as long as it reports the device
Unhealthy for any other reason (`gpu.nvidia.com/unhealthy=true:NoSchedule`, lifted with the next
Healthy report: the health monitor's device taints, which replaced the driver's older removal
of unhealthy devices from the slice), and streams health with a message to the kubelet. The
kubelet's health cache keeps the last report, turns it Unknown once it is older than
`dra_health_timeout` (evaluated lazily, at a status sync) and Unknown for every device while the
stream is broken. A stream that dies unnoticed (`health-stream-stale`: its kubelet plugin fails
its probes and crash-loops) leaves the cache as it was: pod status keeps the last Healthy, which is
the lazy expiry the design names. The plugin runs as a pod per node (`start_plugin`), whose Ready
condition is what the API says of the stream's producer. Devices appear in pods as CDI ids of
their claim.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet import objects
from simulator.fleet.health import UNHEALTHY, Gpu, dra_health, record_report
from simulator.fleet.node_api import NodeApi
from simulator.fleet.state import PARTITIONED, SimNode, SimPod
from simulator.fleet.writes import create_ignore_exists
from simulator.model import Settings, Slot

_SLICES = "resourceslices.resource.k8s.io"
UNHEALTHY_TAINT = "gpu.nvidia.com/unhealthy"
"""The taint of a device the driver reports Unhealthy (no XID, no lost GPU: its health monitor's
verdict alone); a device no pod holds keeps its failure visible through it."""


class DraDriver:
    """The NVIDIA DRA driver DaemonSet: one instance serves every DRA node.

    Owns each DRA node's ResourceSlice (`SimNode.slice_*`) and its GPUs' device taints and
    reported health; `push(node)` is its health stream reaching that node's kubelet. It writes
    to the API server itself, so a partitioned node owes its slice until it is reachable.
    """

    def __init__(
        self,
        api: NodeApi,
        settings: Settings,
        wall: Callable[[], float],
        rng: random.Random,
        push: Callable[[SimNode], None],
    ) -> None:
        self._api = api
        self._timeout = settings.dra_health_timeout
        self._wall = wall
        self._rng = rng
        self._push = push

    def install(self, extended_resource: bool = False) -> None:
        """The driver's DeviceClass (`gpu.nvidia.com`; with `extended_resource` mapping
        `nvidia.com/gpu`, KEP-5004), namespace and the kubelet plugin's ServiceAccount, as its
        chart installs them."""
        create_ignore_exists(
            self._api, "deviceclasses.resource.k8s.io", objects.device_class(extended_resource)
        )
        create_ignore_exists(self._api, "namespaces", objects.namespace(objects.DRA_PLUGIN_NAMESPACE))
        create_ignore_exists(self._api, "serviceaccounts", objects.dra_plugin_service_account())

    def start_plugin(self, node: SimNode) -> dict[str, Any] | None:
        """The DaemonSet's kubelet plugin pod on `node`, bound to it (its kubelet runs it); the pod
        as created, None if it existed already.

        It is what serves the node's health stream: while it is not Ready the kubelet hears
        nothing from the driver, whatever pod status still says."""
        try:
            return self._api.create("pods", objects.dra_plugin_pod(node.name))
        except ApiError as exc:
            if exc.code != 409:
                raise
            return None

    @staticmethod
    def plugin_key(node: SimNode) -> str:
        """namespace/name of the node's kubelet plugin pod."""
        meta = objects.dra_plugin_pod(node.name)["metadata"]
        return f"{meta['namespace']}/{meta['name']}"

    def publish(self, node: SimNode) -> None:
        """The driver starts on a registered node: its first ResourceSlice."""
        node.slice_name = f"{node.name}-{objects.DRA_DRIVER}-{objects.suffix(self._rng)}"
        self._api.create(_SLICES, self._slice(node))

    def health(self, node: SimNode, gpu: Gpu, now: float) -> tuple[str, str | None]:
        if node.health_frozen is not None:
            # The stream died without the kubelet noticing (lazy expiry): its cache keeps what it
            # last heard, and no later report of the driver reaches it.
            return node.health_frozen[gpu.index]
        return dra_health(gpu, node.stream_ok, now, self._timeout)

    def resource_id(self, pod: SimPod, gpu: Gpu, slot: Slot) -> str:
        assert pod.claim_uid is not None
        return objects.cdi_id(pod.claim_uid, gpu.name)

    def report(self, node: SimNode, gpu: Gpu, health: str, message: str | None) -> None:
        if record_report(gpu, health, message, keeps_message=True):
            self._push(node)
        tainted = any(t["key"] == UNHEALTHY_TAINT for t in gpu.taints)
        if health == UNHEALTHY and not gpu.taints:
            # A device already tainted for its XID or as lost says so more precisely.
            self.taint(node, gpu, UNHEALTHY_TAINT, "true")
        elif health != UNHEALTHY and tainted:
            # Healthy again (the end of a timed failure, a flap's healthy half): the monitor lifts
            # its own verdict; an XID's or a lost GPU's taint waits for the reset (`reset`).
            gpu.taints = [t for t in gpu.taints if t["key"] != UNHEALTHY_TAINT]
            self._republish(node)

    def taint(self, node: SimNode, gpu: Gpu, key: str, value: str) -> None:
        gpu.taints = [t for t in gpu.taints if t["key"] != key]
        gpu.taints.append(
            {"key": key, "value": value, "effect": "NoSchedule", "timeAdded": format_timestamp(self._wall())}
        )
        self._republish(node)

    def reset(self, node: SimNode, gpu: Gpu) -> None:
        had_taints = bool(gpu.taints)
        gpu.taints = []
        if had_taints:
            self._republish(node)

    def reconnect(self, node: SimNode) -> None:
        if node.slice_dirty:
            self._republish(node)

    def _slice(self, node: SimNode) -> dict[str, Any]:
        assert node.slice_name is not None
        return objects.resource_slice(
            node.slice_name,
            node.name,
            node.group,
            [g.uuid for g in node.gpus],
            [list(g.taints) for g in node.gpus],
            node.slice_generation,
        )

    def _republish(self, node: SimNode) -> None:
        if node.slice_name is None:
            return
        if node.kubelet == PARTITIONED:
            node.slice_dirty = True  # the driver cannot reach the API server either
            return
        node.slice_dirty = False
        node.slice_generation += 1
        spec = self._slice(node)["spec"]

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            obj["spec"] = spec
            return obj

        self._api.mutate(_SLICES, node.slice_name, None, fn)
