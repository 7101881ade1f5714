"""The simulated kubelets' pod-resources API: each node's allocatable device-plugin devices.

A real kubelet answers `v1.PodResourcesLister/GetAllocatableResources` on its node's
`/var/lib/kubelet/pod-resources/kubelet.sock` with the device-plugin devices it considers
healthy (those its plugin last reported Healthy over a connected ListAndWatch stream; since
Kubernetes 1.23 unhealthy ones are left out). `allocatable_message(fleet, node)` is that answer
for a simulated node, encoded as the protobuf `AllocatableResourcesResponse` the kubelet sends
(the gRPC message, without its frame); the HTTP route
`GET /simulator/v1/nodes/{node}/pod-resources` serves it, so an exporter in another process reads
a simulated node's view the way it reads its NVML. DRA devices are not in it, as on a kubelet.
"""

from __future__ import annotations

from gpuhealth.protowire import encode_field
from simulator.fleet import Fleet
from simulator.fleet.health import HEALTHY, device_plugin_health
from simulator.fleet.objects import device_id
from simulator.model import DEVICE_PLUGIN

GPU_RESOURCE = "nvidia.com/gpu"
CONTENT_TYPE = "application/x-protobuf"


def encode_allocatable(devices: dict[str, list[str]]) -> bytes:
    """`AllocatableResourcesResponse{devices: [ContainerDevices{resource_name, device_ids}]}`."""
    out = bytearray()
    for resource, ids in devices.items():
        entry = encode_field(1, resource.encode())
        for i in ids:
            entry += encode_field(2, i.encode())
        out += encode_field(1, entry)
    return bytes(out)


def allocatable_ids(fleet: Fleet, node_name: str) -> dict[str, list[str]]:
    """The node's allocatable device-plugin devices by resource (KeyError for an unknown node)."""
    node = fleet.nodes[node_name]
    if node.group.path != DEVICE_PLUGIN:
        return {}
    replicas: list[int | None] = (
        list(range(node.group.shared_replicas)) if node.group.shared_replicas else [None]
    )
    ids = [
        device_id(gpu.uuid, replica)
        for gpu in node.gpus
        if device_plugin_health(gpu, node.stream_ok) == HEALTHY
        for replica in replicas
    ]
    return {GPU_RESOURCE: ids} if ids else {}


def allocatable_message(fleet: Fleet, node_name: str) -> bytes:
    """The protobuf answer of the node's kubelet (KeyError for an unknown node)."""
    return encode_allocatable(allocatable_ids(fleet, node_name))
