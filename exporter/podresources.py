"""The kubelet's allocatable devices (pod-resources API, node mode): the answer decoded by hand.

The kubelet serves `v1.PodResourcesLister` over gRPC on the node's
`/var/lib/kubelet/pod-resources/kubelet.sock`. `GetAllocatableResources` (request: an empty
message) answers `AllocatableResourcesResponse`:

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

The message is small and the schema three fields deep, so it is decoded here over the wire
format's fields (`gpuhealth.protowire`; unknown fields skipped) instead of a generated module.
Pure: bytes in, plain data out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpuhealth.protowire import LEN, Field, WireError, fields

GPU_RESOURCE = "nvidia.com/gpu"
"""The NVIDIA device plugin's resource name."""


class PodResourcesError(ValueError):
    """The bytes are not an `AllocatableResourcesResponse` (or not a gRPC message frame)."""


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


class PodResourcesSource(Protocol):
    """The kubelet's allocatable devices, read synchronously from a worker thread."""

    def allocatable(self) -> Allocatable | None:
        """The current answer, or None when it could not be read (no evidence either way)."""
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
        if number != 1:
            continue
        if wire != LEN or not isinstance(value, bytes):
            raise PodResourcesError("devices (field 1) is not a message")
        name, ids = "", []
        for inner, _, item in _fields(value):
            if inner == 1:
                name = _text(item, "resource_name")
            elif inner == 2:
                ids.append(_text(item, "device_ids"))
        if not name:
            raise PodResourcesError("a ContainerDevices entry without resource_name")
        devices.setdefault(name, set()).update(ids)
    return Allocatable({name: frozenset(ids) for name, ids in devices.items()})


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
