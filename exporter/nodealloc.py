"""A node's device-plugin GPU counts, and what they say of an idle device-plugin GPU. Pure.

The kubelet's device manager (`GetCapacity`) puts every device a device plugin registered into
the node's `status.capacity[<resource>]` and only the healthy ones into
`status.allocatable[<resource>]`. A count has no identity: while allocatable is below capacity
some device of the resource is Unhealthy, and nothing says which. When the two are equal (and
above 0) for every device-plugin GPU resource of the node, the plugin holds every device it
registered healthy. The NVIDIA device plugin marks a GPU Unhealthy on a fatal XID and never
healthy again until it restarts and registers its devices afresh, so the counts meet again only
after that restart: the one API-visible signal that speaks for an idle device-plugin GPU in
cluster mode (no NVML, no pod-resources socket).

A count that falls short again names no device either, but it takes back what the counts
alone vouched for: a device whose Healthy came from them (source `node`, idle since) may be the
one that failed again, unless a device of the node already reads Unhealthy on other evidence
(a pod's report) to explain the shortfall. It reads Unknown then (`unvouched`), which no
release counts as Healthy; the next whole count makes it Healthy again.

`gpu_counts` reads a Node object; `speaks_healthy` and `unvouched` are the decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.snapshot import SOURCE_NODE, DeviceState
from gpuhealth.plugin_resources import gpu_resource


class NodeCountsError(ValueError):
    """A Node object whose GPU capacity or allocatable is not a whole, non-negative count."""


@dataclass(frozen=True, slots=True)
class ResourceCount:
    """One device-plugin resource of a node: devices registered, and how many are healthy."""

    resource: str
    capacity: int
    allocatable: int

    @property
    def full(self) -> bool:
        return self.capacity > 0 and self.allocatable == self.capacity


@dataclass(frozen=True, slots=True)
class NodeCounts:
    """A node's device-plugin GPU resources as its status counts them (sorted by resource)."""

    counts: tuple[ResourceCount, ...] = ()

    @property
    def all_allocatable(self) -> bool:
        """Every device the plugins registered is healthy (and there is at least one)."""
        return bool(self.counts) and all(c.full for c in self.counts)

    def resources(self) -> frozenset[str]:
        return frozenset(c.resource for c in self.counts)

    def short(self) -> frozenset[str]:
        """The resources with a device registered but not allocatable."""
        return frozenset(c.resource for c in self.counts if c.allocatable < c.capacity)

    def short_message(self) -> str:
        """What a short count says: `node allocatable: 7 of 8 nvidia.com/gpu allocatable; which ...`."""
        parts = [f"{c.allocatable} of {c.capacity} {c.resource} allocatable" for c in self.counts]
        return "node allocatable: " + ", ".join(parts) + "; which device is short is not said"

    def message(self) -> str:
        """The evidence as a device's status message: `node allocatable: all 8 nvidia.com/gpu allocatable`."""
        return "node allocatable: " + ", ".join(
            f"all {c.capacity} {c.resource} allocatable" for c in self.counts
        )


def _count(value: Any, where: str) -> int:
    # Device-plugin quantities are plain decimal integers ("8"); a suffix or a fraction here
    # would mean this is no device count, and guessing one could release a broken card.
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise NodeCountsError(f"{where}: {value!r} is not a device count")
    text = str(value)
    if not text.isdecimal():
        raise NodeCountsError(f"{where}: {text!r} is not a whole, non-negative device count")
    return int(text)


def gpu_counts(obj: Mapping[str, Any]) -> NodeCounts:
    """The device-plugin GPU resources of a Node object's status; NodeCountsError if malformed.

    A resource in capacity but not in allocatable counts as 0 allocatable (the kubelet writes
    both together; a missing allocatable promises nothing). A node without any has no counts."""
    status = obj.get("status")
    if status is None:
        return NodeCounts()
    if not isinstance(status, Mapping):
        raise NodeCountsError("status is not an object")
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or {}
    if not isinstance(capacity, Mapping) or not isinstance(allocatable, Mapping):
        raise NodeCountsError("status.capacity or status.allocatable is not an object")
    counts = []
    for resource in sorted(r for r in capacity if isinstance(r, str) and gpu_resource(r)):
        cap = _count(capacity[resource], f"status.capacity[{resource}]")
        alloc = _count(allocatable.get(resource, "0"), f"status.allocatable[{resource}]")
        counts.append(ResourceCount(resource, cap, alloc))
    return NodeCounts(tuple(counts))


def speaks_healthy(counts: NodeCounts, since: float, device: DeviceState, *, held: bool) -> bool:
    """Whether the node's counts, observed unchanged since `since`, make `device` Healthy now.

    Only a device-plugin device (no DRA driver; its resource one of the node's GPU resources)
    that no pod holds (a pod's report is the authority while it runs there) and that is not
    Healthy, and only when every registered device of the node is allocatable. The counts must
    have reached that after the device's status last changed: the kubelet writes the node's
    status on its own period, after the pod's, so counts seen before a failure was reported are
    stale and no word on it."""
    return (
        not held
        and not device.driver
        and device.health != "Healthy"
        and counts.all_allocatable
        and device.resource in counts.resources()
        and since > device.changed_at
    )


def unvouched(counts: NodeCounts, devices: Iterable[tuple[DeviceState, bool]]) -> list[DeviceState]:
    """The devices (with whether a pod holds each) whose Healthy the node's counts alone gave
    and that a short count now leaves without evidence: idle, source `node`, of a short
    resource, while no device-plugin device of that resource reads Unhealthy on other evidence."""
    short = counts.short()
    if not short:
        return []
    devices = list(devices)
    explained = {
        d.resource for d, _ in devices if not d.driver and d.health == "Unhealthy" and d.source != SOURCE_NODE
    }
    return [
        d
        for d, held in devices
        if not held
        and not d.driver
        and d.source == SOURCE_NODE
        and d.health == "Healthy"
        and d.resource in short
        and d.resource not in explained
    ]
