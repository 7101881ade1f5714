"""The device state's shared vocabulary: keys, records, counters and what the directory is told.

Pure data and small decisions every part of the store (`exporter.state`) speaks: a pod as the
store remembers it, a device's identity as a pod's entries establish it, the directory's rows
and its `DirectorySink` protocol, and how several holders' allocations merge.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from exporter.parse import PodObservation, ResourceEntry
from exporter.snapshot import Allocation, DeviceState

DeviceKey = tuple[str, str]
"""(node, device)."""

UNRESOLVED_PREFIX = "unresolved/"
SEVERITY = {"Healthy": 0, "Unknown": 1, "Unhealthy": 2}

# Reasons an event was not applied (`gpuhealth_exporter_events_ignored_total{reason}`).
DUPLICATE = "duplicate"
OUT_OF_ORDER = "out_of_order"

MIG_PREFIX = "MIG-"
"""A MIG device's UUID begins so (driver R470 and later); the card's begins `GPU-`."""


class ObservationRecord(NamedTuple):
    """One row of the directory's append-only log: a device status change and its evidence.

    A NamedTuple: it is written as a row as is (the field order is the log's column order)."""

    node: str
    device: str
    status_version: int
    observed_at: float
    health: str
    message: str
    namespace: str = ""
    pod: str = ""
    container: str = ""
    resource: str = ""
    claim: str = ""
    pod_resource_version: str = ""


@dataclass(frozen=True, slots=True)
class PodVersion:
    """The latest processed resourceVersion of one pod (restored after a restart)."""

    uid: str
    namespace: str
    name: str
    resource_version: str


class DirectorySink(Protocol):
    """Where state changes are persisted; the SQLite directory batches and writes them."""

    def record_change(self, device: DeviceState, observation: ObservationRecord) -> None: ...

    def record_device(self, device: DeviceState) -> None:
        """Allocations or identity attributes changed, the status did not."""
        ...

    def record_allocations(self, device: DeviceState) -> None:
        """Only allocations changed (a pod came or went), the status and identity did not."""
        ...

    def record_heartbeats(self, keys: Iterable[DeviceKey], observed_at: float) -> None:
        """These devices' statuses were confirmed at `observed_at` (later ones win)."""
        ...

    def record_removed(self, node: str, device: str) -> None: ...

    def record_pod(self, pod: PodVersion) -> None: ...

    def forget_pod(self, uid: str) -> None: ...

    def record_lease(self, node: str, renewed_at: float | None) -> None: ...


@dataclass(slots=True)
class TrackedPod:
    """A pod as the store remembers it: what it reported, holds and depends on."""

    uid: str
    namespace: str
    name: str
    resource_version: str
    rv_number: int | None = None
    signature: object = None
    """`parse.pod_struct_signature` or `parse.pod_signature` of the last applied version."""
    observation: PodObservation | None = None
    """None for a pod restored from the directory and not seen since."""
    values: dict[DeviceKey, tuple[str, str]] = field(default_factory=dict)
    """Per device: the (health, message) this pod reported last."""
    allocations: dict[DeviceKey, tuple[Allocation, ...]] = field(default_factory=dict)
    uses: set[tuple[str, ...]] = field(default_factory=set)
    """Claims ("claim", ns, name) and slice devices ("ref", driver, pool, device) it depends on."""
    layout: tuple[Any, ...] | None = None
    """(node, terminal, [(container, resource, resourceID, claim)]) of the last full apply."""
    entry_keys: list[DeviceKey] | None = None
    """The device key of each entry of the last full apply, in order."""
    silent: dict[DeviceKey, tuple[Allocation, ...]] = field(default_factory=dict)
    """Devices it holds with no report on them: through `status.extendedResourceClaimStatus`, or
    as the kubelet's `List` names them (node mode, before Kubernetes 1.36)."""


class DeviceMeta(NamedTuple):
    """Identity attributes of a device as one pod's entries establish them."""

    uuid: str = ""
    driver: str = ""
    pool: str = ""
    device_name: str = ""
    resource: str = ""


@dataclass(slots=True)
class StateStats:
    """Plain counters the self-metrics collector reads (the state never touches Prometheus)."""

    parse_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    events_ignored: collections.Counter[str] = field(default_factory=collections.Counter)
    status_changes: int = 0
    pod_resources_failures: int = 0
    """Pod-resources reads that gave no answer (node mode): the evidence stayed as it was."""


def device_uuid(device_id: str) -> str:
    """A device-plugin ID is the GPU UUID for NVIDIA (GPU-... or MIG-...); other plugins: none."""
    return device_id if device_id.startswith(("GPU-", "MIG-")) else ""


def severity(entry: ResourceEntry) -> int:
    return SEVERITY[entry.health]


def allocation_order(allocation: Allocation) -> tuple[str, str, str, str, str]:
    return (allocation.namespace, allocation.pod, allocation.container, allocation.resource, allocation.claim)


def merge(contributions: Mapping[str, tuple[Allocation, ...]]) -> tuple[Allocation, ...]:
    if len(contributions) == 1:
        return next(iter(contributions.values()))
    return tuple(sorted((a for group in contributions.values() for a in group), key=allocation_order))
