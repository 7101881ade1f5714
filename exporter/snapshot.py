"""The immutable view a scrape renders.

The observer builds a new `Snapshot` (or swaps parts of it) whenever state changes; a
scrape only reads the snapshot it finds, so it never calls the API or NVML. Fields are
plain data so the renderer, the `devices` command and tests share one shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuhealth.nvml import DeviceReading

HEALTH_VALUES = ("Healthy", "Unhealthy", "Unknown")


@dataclass(frozen=True, slots=True)
class Allocation:
    """One container's use of a device (a device shared by several is one device, many allocations)."""

    namespace: str
    pod: str
    container: str
    resource: str
    """The allocatedResourcesStatus `name`: `nvidia.com/gpu` or `claim:<podClaimName>[/<request>]`."""
    claim: str = ""
    """The generated ResourceClaim name for DRA allocations, empty for device plugins."""


@dataclass(frozen=True, slots=True)
class DriverTaint:
    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True, slots=True)
class DeviceState:
    """The current state of one device, as kept by the directory."""

    node: str
    device: str
    """Canonical identity: the GPU UUID where known, else `<driver>/<pool>/<device>`."""
    health: str
    """Reported value, one of HEALTH_VALUES; never rewritten by the exporter."""
    message: str
    status_version: int
    """Increases by one on every change of (health, message); survives restarts."""
    first_seen: float
    """Wall seconds when the device was first observed."""
    changed_at: float
    """Wall seconds when the current (health, message) was first observed."""
    observed_at: float
    """Wall seconds of the latest pod status observation that reported this status."""
    uuid: str = ""
    driver: str = ""
    pool: str = ""
    device_name: str = ""
    resource: str = ""
    allocations: tuple[Allocation, ...] = ()
    driver_taints: tuple[DriverTaint, ...] = ()
    unknown_since: float | None = None
    """Wall seconds since the device has been continuously reported Unknown; None otherwise.

    A message change while Unknown moves `changed_at` but not this (survives restarts)."""


@dataclass(frozen=True, slots=True)
class NodeState:
    node: str
    lease_renewed_at: float | None = None
    """Wall seconds of the kubelet Lease's renewTime; None when no Lease was seen."""


@dataclass(frozen=True, slots=True)
class NvmlView:
    """Node mode only: the latest NVML readings and cumulative XID counts."""

    readings: Mapping[str, DeviceReading] = field(default_factory=dict)
    """By GPU UUID."""
    read_at: Mapping[str, float] = field(default_factory=dict)
    """By GPU UUID: wall seconds of the latest successful (reachable) reading."""
    xid_counts: Mapping[tuple[str, int], int] = field(default_factory=dict)
    """By (uuid, xid): events counted since the exporter started."""


def status_confirmed_at(device: DeviceState, node: NodeState | None, nvml: NvmlView | None) -> float:
    """When the reported status was last confirmed fresh.

    A pod status observation confirms it. After that it stays fresh only while every source
    that maintains it is alive: the node's kubelet Lease keeps being renewed and, in node
    mode, NVML keeps answering for the device. The oldest source bounds freshness; a source
    that stops makes the age grow even though the reported value stays the same.
    """
    lease = node.lease_renewed_at if node is not None else None
    sources = [lease if lease is not None else device.observed_at]
    if nvml is not None and device.uuid:
        sources.append(nvml.read_at.get(device.uuid, device.observed_at))
    return max(device.observed_at, min(sources))


def status_age(device: DeviceState, node: NodeState | None, nvml: NvmlView | None, now: float) -> float:
    """Seconds since the reported status was last confirmed fresh (never negative)."""
    return max(0.0, now - status_confirmed_at(device, node, nvml))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a scrape renders, swapped in whole by the observer (never mutated)."""

    devices: Mapping[tuple[str, str], DeviceState] = field(default_factory=dict)
    """By (node, device)."""
    nodes: Mapping[str, NodeState] = field(default_factory=dict)
    """By node name."""
    nvml: NvmlView | None = None
    """Node mode only; None in cluster mode (no NVML series are rendered then)."""
    node_name: str | None = None
    """The node this exporter serves in node mode; None in cluster mode."""
