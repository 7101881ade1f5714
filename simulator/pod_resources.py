"""The simulated kubelets' pod-resources API: each node's allocatable and assigned device-plugin devices.

A real kubelet answers `v1.PodResourcesLister/GetAllocatableResources` on its node's
`/var/lib/kubelet/pod-resources/kubelet.sock` with the device-plugin devices it considers
healthy (those its plugin last reported Healthy over a connected ListAndWatch stream; since
Kubernetes 1.23 unhealthy ones are left out). `allocatable_message(fleet, node)` is that answer
for a simulated node, encoded as the protobuf `AllocatableResourcesResponse` the kubelet sends
(the gRPC message, without its frame); the HTTP route
`GET /simulator/v1/nodes/{node}/pod-resources` serves it, so an exporter in another process reads
a simulated node's view the way it reads its NVML. DRA devices are not in it, as on a kubelet.

`List` answers the devices its device manager gave each running pod's containers, whatever the
`ResourceHealthStatus` feature (it is older than it, and the same before 1.36):
`list_message(fleet, node)` is that `ListPodResourcesResponse`, served at
`GET /simulator/v1/nodes/{node}/pod-resources/list`. Each container is named with the devices it
asked for, split as the kubelet splits them (`simulator.fleet.objects.per_container`). A DRA
pod's devices would be `dynamic_resources`, which the exporter does not read: left out."""

from __future__ import annotations

from gpuhealth.protowire import encode_field
from simulator.fleet import Fleet
from simulator.fleet.health import HEALTHY, device_plugin_health
from simulator.fleet.objects import app_containers, device_id, per_container
from simulator.fleet.state import SimPod
from simulator.model import DEVICE_PLUGIN

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
        device
        for gpu in node.gpus
        if device_plugin_health(gpu, node.stream_ok) == HEALTHY
        # A MIG card: its partitions by their MIG UUIDs (under the strategy's resource).
        for device in (gpu.partitions or [device_id(gpu.uuid, replica) for replica in replicas])
    ]
    return {node.group.resource: ids} if ids else {}


def allocatable_message(fleet: Fleet, node_name: str) -> bytes:
    """The protobuf answer of the node's kubelet (KeyError for an unknown node)."""
    return encode_allocatable(allocatable_ids(fleet, node_name))


Listed = list[tuple[str, str, list[tuple[str, str, list[str]]]]]
"""(namespace, pod, [(container, resource, device IDs)]) per pod, in the kubelet's order."""


def encode_list(pods: Listed) -> bytes:
    """`ListPodResourcesResponse{pod_resources: [PodResources{name, namespace, containers:
    [ContainerResources{name, devices: [ContainerDevices{resource_name, device_ids}]}]}]}`."""
    out = bytearray()
    for namespace, name, containers in pods:
        entry = encode_field(1, name.encode()) + encode_field(2, namespace.encode())
        for container, resource, ids in containers:
            devices = encode_field(1, resource.encode())
            for i in ids:
                devices += encode_field(2, i.encode())
            entry += encode_field(3, encode_field(1, container.encode()) + encode_field(2, devices))
        out += encode_field(1, entry)
    return bytes(out)


def assigned(fleet: Fleet, node_name: str) -> Listed:
    """The device-plugin devices of the node's running pods (KeyError for an unknown node).

    A pod that ended, or whose containers were stopped, holds nothing any more; a DRA pod (a
    claim, or a DRA-backed extended resource) has no device-plugin devices."""
    node = fleet.nodes[node_name]
    if node.group.path != DEVICE_PLUGIN:
        return []
    plugin = fleet.device_plugin
    out: Listed = []
    for pod in fleet.pods.values():
        if pod.node != node_name or pod.terminated or pod.stopped or not pod.slots:
            continue
        if pod.claim_name is not None or pod.extended:
            continue
        resource = pod.resource_name or pod.workload.resource
        ids = [plugin.resource_id(node, pod, node.gpus[slot.gpu], slot) for slot in pod.slots]
        out.append((pod.namespace, pod.name, _per_container(pod, resource, ids)))
    return out


def _per_container(pod: SimPod, resource: str, ids: list[str]) -> list[tuple[str, str, list[str]]]:
    containers = (
        list(pod.containers) if pod.containers is not None else app_containers(pod.workload, len(ids))
    )
    entry = {"name": resource, "resources": [{"resourceID": i} for i in ids]}
    return [
        (container["name"], resource, [r["resourceID"] for e in own for r in e["resources"]])
        for container, own in zip(containers, per_container(containers, [entry]), strict=True)
        if own
    ]


def list_message(fleet: Fleet, node_name: str) -> bytes:
    """The protobuf `List` answer of the node's kubelet (KeyError for an unknown node)."""
    return encode_list(assigned(fleet, node_name))
