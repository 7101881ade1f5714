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

`NvidiaDraDriver` is the driver as it is (`kubernetes-sigs/dra-driver-nvidia-gpu` with its
`NVMLDeviceHealthCheck` gate, a fleet's `draDriver: nvidia`): its slices publish the attributes
its kubelet plugin publishes, it streams nothing to the kubelet (KEP-4680 is not implemented, so
the kubelet reports every allocated device Unknown), and its NVML health monitor taints devices
itself: `gpu.nvidia.com/xid=<xid>` (NoSchedule for a fatal XID, None for one it ignores),
`gpu.nvidia.com/gpu-lost` (NoSchedule, every device of the node: NVML says so of the event set,
not of one GPU), never NoExecute, and it never lifts one: only a restart of its kubelet plugin
(`restart_plugin`) publishes the slice afresh, re-tainting what is still lost.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet import mig, objects
from simulator.fleet.health import UNHEALTHY, UNKNOWN, Gpu, dra_health, record_report
from simulator.fleet.node_api import NodeApi
from simulator.fleet.state import PARTITIONED, SimNode, SimPod
from simulator.fleet.writes import create_ignore_exists
from simulator.model import APPLICATION_XIDS, MigLayout, Settings, Slot

_SLICES = "resourceslices.resource.k8s.io"
UNHEALTHY_TAINT = "gpu.nvidia.com/unhealthy"
"""The taint of a device the driver reports Unhealthy (no XID, no lost GPU: its health monitor's
verdict alone); a device no pod holds keeps its failure visible through it."""
XID_TAINT = "gpu.nvidia.com/xid"
GPU_LOST_TAINT = "gpu.nvidia.com/gpu-lost"
NO_SCHEDULE, NO_EFFECT = "NoSchedule", "None"


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

    def resource_id(self, node: SimNode, pod: SimPod, gpu: Gpu, slot: Slot) -> str:
        assert pod.claim_uid is not None
        return objects.cdi_id(pod.claim_uid, mig.dra_device(node.group.mig, slot))

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
        self._set_taint(gpu, key, value, NO_SCHEDULE)
        self._republish(node)

    def xid(self, node: SimNode, gpu: Gpu, xid: int, fatal: bool, message: str) -> None:
        """An XID event reached the driver's health monitor; `fatal`: the card is broken by it."""
        if fatal:
            # Tainted first: the report then finds the XID's taint and adds no other.
            self.taint(node, gpu, XID_TAINT, str(xid))
            self.report(node, gpu, UNHEALTHY, message)

    def _set_taint(self, gpu: Gpu, key: str, value: str, effect: str) -> None:
        taint = {"key": key, "effect": effect, "timeAdded": format_timestamp(self._wall())}
        if value:
            taint["value"] = value
        gpu.taints = [t for t in gpu.taints if t["key"] != key]
        gpu.taints.append(taint)

    def reset(self, node: SimNode, gpu: Gpu) -> None:
        had_taints = bool(gpu.taints)
        gpu.taints = []
        if had_taints:
            self._republish(node)

    def reconnect(self, node: SimNode) -> None:
        if node.slice_dirty:
            self._republish(node)

    def restart_plugin(self, node: SimNode) -> None:
        """Its kubelet plugin on `node` started again: it publishes the slice as its state says
        (this driver keeps nothing in memory that a restart would lose)."""
        self._republish(node)

    def _slice(self, node: SimNode) -> dict[str, Any]:
        assert node.slice_name is not None
        return self._resource_slice(node)

    @staticmethod
    def _resource_slice(node: SimNode) -> dict[str, Any]:
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


class NvidiaDraDriver(DraDriver):
    """The NVIDIA DRA driver as its kubelet plugin behaves (`draDriver: nvidia`): one instance
    serves every DRA node of a fleet that runs it.

    Owns the same slices and taints as `DraDriver`, with the plugin's attributes and its taints'
    keys, values and effects; the kubelet hears nothing from it (`health` is the kubelet's
    default for a driver that never reported: Unknown, no message). What the hardware reports
    (`Gpu.reported`) is still recorded: programs running on a failing card fail by it.
    """

    def install(self, extended_resource: bool = False) -> None:
        """As `DraDriver.install`, and the DeviceClass of its MIG devices (`mig.nvidia.com`)."""
        super().install(extended_resource)
        create_ignore_exists(self._api, "deviceclasses.resource.k8s.io", objects.mig_device_class())

    def health(self, node: SimNode, gpu: Gpu, now: float) -> tuple[str, str | None]:
        return UNKNOWN, None

    def report(self, node: SimNode, gpu: Gpu, health: str, message: str | None) -> None:
        # The card's own state only: no stream carries it to the kubelet, and the health monitor
        # watches NVML events (XIDs, a lost GPU), not this verdict, so no taint follows from it.
        record_report(gpu, health, message, keeps_message=True)

    def xid(self, node: SimNode, gpu: Gpu, xid: int, fatal: bool, message: str) -> None:
        # The monitor's own classification: the XIDs it ignores by default taint with effect None.
        effect = NO_SCHEDULE if xid not in APPLICATION_XIDS else NO_EFFECT
        current = next((t for t in gpu.taints if t["key"] == XID_TAINT), None)
        if not (effect == NO_EFFECT and current is not None and current["effect"] == NO_SCHEDULE):
            # One taint per key, the latest XID's, except that a later event never weakens it.
            self._set_taint(gpu, XID_TAINT, str(xid), effect)
            self._republish(node)
        if fatal:
            self.report(node, gpu, UNHEALTHY, message)

    def taint(self, node: SimNode, gpu: Gpu, key: str, value: str) -> None:
        if key != GPU_LOST_TAINT:
            super().taint(node, gpu, key, value)
            return
        # NVML answers GPU_IS_LOST to the monitor's event wait, which names no GPU: the monitor
        # taints every device it watches on the node. The taint carries no value.
        for each in node.gpus:
            self._set_taint(each, GPU_LOST_TAINT, "", NO_SCHEDULE)
        self._republish(node)

    def reset(self, node: SimNode, gpu: Gpu) -> None:
        """Nothing: the driver never lifts a taint it set, whatever the card does now."""

    def restart_plugin(self, node: SimNode) -> None:
        """Its kubelet plugin started again: the health monitor begins with no events, so the slice
        is published without taints, except the lost GPUs it finds lost again. The plugin pod's
        own restart (seconds not Ready) is not played: its pod stays as it was."""
        for gpu in node.gpus:
            gpu.taints = []
        if any(g.lost for g in node.gpus):
            self.taint(node, node.gpus[0], GPU_LOST_TAINT, "")
            return
        self._republish(node)

    @staticmethod
    def _resource_slice(node: SimNode) -> dict[str, Any]:
        obj = DraDriver._resource_slice(node)
        layout = node.group.mig
        if layout is not None:
            # MIG on: the slice lists the card's MIG devices instead of the card, each with the
            # card's taints (the health check's events of a card are events of all its devices).
            obj["spec"]["devices"] = [
                mig_device(node, gpu, layout, p) for gpu in node.gpus for p in range(layout.partitions)
            ]
            return obj
        for device, gpu in zip(obj["spec"]["devices"], node.gpus, strict=True):
            device["attributes"] = nvidia_attributes(node, gpu)
        return obj


def mig_device(node: SimNode, gpu: Gpu, layout: MigLayout, partition: int) -> dict[str, Any]:
    """Partition `partition` of `gpu` as the NVIDIA DRA driver publishes a MIG device: named for
    its card's minor, profile and placement, typed `mig`, its own UUID and its card's
    (`parentUUID`), the profile and the card's product and versions; no `memory` of the card."""
    card = nvidia_attributes(node, gpu)
    attributes = {
        "type": {"string": "mig"},
        "uuid": {"string": mig.partition_uuid(gpu.uuid, partition)},
        "parentUUID": {"string": gpu.uuid},
        "profile": {"string": layout.profile},
        **{k: card[k] for k in _MIG_INHERITED},
    }
    memory_gb = layout.profile.split(".", 1)[1].removesuffix("gb")
    device: dict[str, Any] = {
        "name": mig.dra_device_name(gpu.index, layout, partition),
        "attributes": attributes,
        "capacity": {"memory": {"value": f"{memory_gb}Gi"}},
    }
    if gpu.taints:
        device["taints"] = [dict(t) for t in gpu.taints]
    return device


_MIG_INHERITED = (
    "productName",
    "brand",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "cudaDriverVersion",
    "resource.kubernetes.io/pciBusID",
    "resource.kubernetes.io/pcieRoot",
)
"""The card's attributes a MIG device carries too."""


_ARCHITECTURES = (
    ("B300", "Blackwell", "10.3.0"),
    ("B200", "Blackwell", "10.0.0"),
    ("H200", "Hopper", "9.0.0"),
    ("H100", "Hopper", "9.0.0"),
    ("A100", "Ampere", "8.0.0"),
)
"""(product marker, NVML architecture, CUDA compute capability); others read as Hopper."""


def nvidia_attributes(node: SimNode, gpu: Gpu) -> dict[str, Any]:
    """A whole GPU's attributes as the NVIDIA DRA driver's kubelet plugin publishes them: strings,
    NVML's versions as semantic versions, the PCI address under the standard attribute domain.
    No `index` or `minor`: the device name (`gpu-<minor>`) carries the minor."""
    product = node.group.product
    architecture, compute = next(
        ((arch, cc) for marker, arch, cc in _ARCHITECTURES if marker in product), ("Hopper", "9.0.0")
    )
    bus = f"{(0x18 + 0x10 * gpu.index) & 0xFF:02x}"
    return {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid},
        "productName": {"string": product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": architecture},
        "cudaComputeCapability": {"version": compute},
        "driverVersion": {"version": "580.95.5"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{bus}:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{int(bus, 16) - 1:02x}"},
    }
