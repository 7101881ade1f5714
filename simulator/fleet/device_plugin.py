"""The NVIDIA device plugin on the device-plugin nodes: `nvidia.com/gpu` devices and their health.

It advertises one device per GPU UUID (or `<uuid>::<n>` per time-slicing replica, or on a MIG
card one per partition by its MIG UUID, `simulator.fleet.mig`) and reports each Healthy or
Unhealthy over ListAndWatch (a MIG card's partitions all as the card: its faults are theirs),
never a message and never Unknown; a broken stream makes the kubelet treat every device as
Unhealthy. The kubelet lowers the node's allocatable GPU resource by the devices not Healthy.
An Unhealthy is sticky until the plugin restarts (`restart`), when every device reads Healthy
again. The plugin never talks to the API server itself.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.fleet import objects
from simulator.fleet.health import HEALTHY, UNHEALTHY, Gpu, device_plugin_health, record_report
from simulator.fleet.state import SimNode, SimPod
from simulator.model import Slot


class DevicePlugin:
    """The NVIDIA device plugin DaemonSet: one instance serves every device-plugin node.

    Owns the reported health of its GPUs (`Gpu.reported`); `push(node)` is its ListAndWatch
    stream reaching that node's kubelet.
    """

    def __init__(self, push: Callable[[SimNode], None]) -> None:
        self._push = push

    def health(self, node: SimNode, gpu: Gpu, now: float) -> tuple[str, str | None]:
        return device_plugin_health(gpu, node.stream_ok), None

    def resource_id(self, node: SimNode, pod: SimPod, gpu: Gpu, slot: Slot) -> str:
        if gpu.partitions:  # a MIG card: the partition's own UUID, under either strategy
            return gpu.partitions[slot.replica or 0]
        return objects.device_id(gpu.uuid, slot.replica)

    def report(self, node: SimNode, gpu: Gpu, health: str, message: str | None) -> None:
        if record_report(gpu, health, message, keeps_message=False):
            self._push(node)

    def taint(self, node: SimNode, gpu: Gpu, key: str, value: str) -> None:
        """Nothing: the device plugin API has no taints, only Unhealthy."""

    def xid(self, node: SimNode, gpu: Gpu, xid: int, fatal: bool, message: str) -> None:
        """A fatal XID makes the plugin report the device Unhealthy; it ignores the others."""
        if fatal:
            self.report(node, gpu, UNHEALTHY, message)

    def reset(self, node: SimNode, gpu: Gpu) -> None:
        """Nothing published to clear: the next report says Healthy."""

    def reconnect(self, node: SimNode) -> None:
        """Nothing owed: the plugin writes nothing to the API server."""

    def restart(self, node: SimNode) -> None:
        """The plugin on `node` restarted and registered again (`device-plugin-restart`).

        Its Unhealthy is sticky only while it runs: the new instance lists every device Healthy
        until it sees a new fault, a card still broken in a way only NVML or DCGM sees (lost,
        needing a reset, a failing health watch) included, and the kubelet keeps no device health
        across a re-registration. The kubelet keeps its checkpoint of which device each running
        container got: running pods keep their devices.
        """
        for gpu in node.gpus:
            record_report(gpu, HEALTHY, None, keeps_message=False)
        self._push(node)
