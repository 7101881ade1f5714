"""The kubelet's pod-resources API (node mode): its answers decoded by hand.

The kubelet serves `v1.PodResourcesLister` over gRPC on the node's
`/var/lib/kubelet/pod-resources/kubelet.sock`. Two of its methods are read, both with an empty
request message. `GetAllocatableResources` answers `AllocatableResourcesResponse`:

    message AllocatableResourcesResponse {
        repeated ContainerDevices devices = 1;
        repeated int64 cpu_ids = 2;
        repeated ContainerMemory memory = 3;
    }
    message ContainerDevices {
        string resource_name = 1;
        repeated string device_ids = 2;
        TopologyInfo topology = 3;
    }

The kubelet lists only the device-plugin devices it considers healthy (unhealthy ones are left
out since Kubernetes 1.23), so for the NVIDIA device plugin, whose device IDs are GPU UUIDs
(`<uuid>::<n>` per time-slicing replica), it says which GPUs are allocatable right now: the
evidence of an idle device-plugin GPU that NVML's reachability alone cannot give. DRA devices
are not in this answer (their evidence is the ResourceSlice).

`List` answers `ListPodResourcesResponse`, the devices each running pod's containers were given:

    message ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    message PodResources {
        string name = 1;
        string namespace = 2;
        repeated ContainerResources containers = 3;
    }
    message ContainerResources {
        string name = 1;
        repeated ContainerDevices devices = 2;
        repeated int64 cpu_ids = 3;
        repeated ContainerMemory memory = 4;
        repeated DynamicResource dynamic_resources = 5;
    }

Only the device-plugin devices are taken (`devices`): a DRA device's pod is known from its claim
already. Before Kubernetes 1.36 (or with `ResourceHealthStatus` off) the kubelet writes no
`allocatedResourcesStatus`, and this answer is the only place that says which GPU a device-plugin
pod got (`docs/quarantine.md`, "Kubernetes before 1.36").

The messages are small and the schemas a few fields deep, so it is decoded here over the wire
format's fields (`gpuhealth.protowire`; unknown fields skipped) instead of a generated module.
Pure: bytes in, plain data out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from gpuhealth.plugin_resources import GPU_RESOURCE
from gpuhealth.protowire import LEN, Field, WireError, fields


class PodResourcesError(ValueError):
    """The bytes are not the answer asked for (or not a gRPC message frame)."""


@dataclass(frozen=True, slots=True)
class Allocatable:
    """Device IDs the kubelet lists as allocatable, by resource name."""

    devices: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def lists(self, uuid: str, resource: str = GPU_RESOURCE) -> bool:
        """Whether the kubelet lists the GPU `uuid` (itself, or any time-slicing replica of it)."""
        ids = self.devices.get(resource, frozenset())
        if uuid in ids:
            return True
        prefix = f"{uuid}::"
        return any(i.startswith(prefix) for i in ids)

    def lists_every(self, ids: Iterable[str]) -> bool:
        """Whether the kubelet lists every one of these device IDs, under any resource: a MIG
        card's partitions, which the plugin advertises as `nvidia.com/gpu` or as
        `nvidia.com/mig-<profile>` by its strategy (`docs/quarantine.md`, "MIG: the card is the device")."""
        listed = frozenset().union(*self.devices.values())
        return all(i in listed for i in ids)


class Assigned(NamedTuple):
    """One device the kubelet gave one container, as `List` names it."""

    container: str
    resource: str
    device_id: str


@dataclass(frozen=True, slots=True)
class Assignments:
    """The device-plugin devices of the node's running pods, by (namespace, pod name).

    A pod the kubelet lists with no device-plugin device is left out: it holds none."""

    pods: Mapping[tuple[str, str], tuple[Assigned, ...]] = field(default_factory=dict)


class PodResourcesSource(Protocol):
    """The kubelet's pod-resources answers, read synchronously from a worker thread."""

    def allocatable(self) -> Allocatable | None:
        """The current answer, or None when it could not be read (no evidence either way)."""
        ...

    def assignments(self) -> Assignments | None:
        """The pods' devices now (`List`), or None when they could not be read."""
        ...

    def close(self) -> None: ...


def _fields(data: bytes) -> list[Field]:
    try:
        return fields(data)
    except WireError as exc:
        raise PodResourcesError(str(exc)) from None


def _text(value: int | bytes, what: str) -> str:
    if not isinstance(value, bytes):
        raise PodResourcesError(f"{what} is not length-delimited")
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise PodResourcesError(f"{what} is not UTF-8: {exc}") from None


def decode_allocatable(data: bytes) -> Allocatable:
    """An `AllocatableResourcesResponse` message as `Allocatable`; PodResourcesError if malformed.

    Fields this schema does not use (CPU ids, memory, topology, anything newer) are skipped, as
    protobuf readers do; a resource named twice has its device IDs merged."""
    devices: dict[str, set[str]] = {}
    for number, wire, value in _fields(data):
        if number == 1:
            name, ids = _container_devices(_message(wire, value, "devices (field 1)"))
            devices.setdefault(name, set()).update(ids)
    return Allocatable({name: frozenset(ids) for name, ids in devices.items()})


def _message(wire: int, value: int | bytes, what: str) -> bytes:
    if wire != LEN or not isinstance(value, bytes):
        raise PodResourcesError(f"{what} is not a message")
    return value


def decode_assignments(data: bytes) -> Assignments:
    """A `ListPodResourcesResponse` message as `Assignments`; PodResourcesError if malformed.

    CPU ids, memory, topology, DRA resources and anything newer are skipped. A pod named twice
    (which a kubelet does not do) has its devices merged, each device once, in the answer's order."""
    pods: dict[tuple[str, str], dict[Assigned, None]] = {}
    for number, wire, value in _fields(data):
        if number != 1:
            continue
        name, namespace, held = "", "", []
        for inner, inner_wire, item in _fields(_message(wire, value, "pod_resources (field 1)")):
            if inner == 1:
                name = _text(item, "PodResources.name")
            elif inner == 2:
                namespace = _text(item, "PodResources.namespace")
            elif inner == 3:
                held.extend(_container(_message(inner_wire, item, "PodResources.containers (field 3)")))
        if not name:
            raise PodResourcesError("a PodResources entry without name")
        if held:
            pods.setdefault((namespace, name), {}).update(dict.fromkeys(held))
    return Assignments({key: tuple(held) for key, held in pods.items()})


def _container(data: bytes) -> list[Assigned]:
    """One `ContainerResources`: its device-plugin devices."""
    name, devices = "", []
    for number, wire, value in _fields(data):
        if number == 1:
            name = _text(value, "ContainerResources.name")
        elif number == 2:
            devices.append(_message(wire, value, "ContainerResources.devices (field 2)"))
    held: list[Assigned] = []
    for entry in devices:
        resource, ids = _container_devices(entry)
        held.extend(Assigned(name, resource, i) for i in ids)
    return held


def _container_devices(data: bytes) -> tuple[str, list[str]]:
    """One `ContainerDevices`: its resource name and device IDs (the topology skipped)."""
    resource, ids = "", []
    for number, _, value in _fields(data):
        if number == 1:
            resource = _text(value, "resource_name")
        elif number == 2:
            ids.append(_text(value, "device_ids"))
    if not resource:
        raise PodResourcesError("a ContainerDevices entry without resource_name")
    return resource, ids


def unframe(data: bytes) -> bytes:
    """The message of one gRPC length-prefixed frame (flag 0: uncompressed, 4-byte length)."""
    if len(data) < 5:
        raise PodResourcesError(f"a gRPC frame needs 5 bytes of prefix, got {len(data)}")
    if data[0] != 0:
        raise PodResourcesError(f"compressed gRPC frame (flag {data[0]}): not asked for")
    size = int.from_bytes(data[1:5], "big")
    if size != len(data) - 5:
        raise PodResourcesError(f"gRPC frame announces {size} bytes, holds {len(data) - 5}")
    return data[5:]
