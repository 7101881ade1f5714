"""The immutable view a scrape renders.

The observer builds a new `Snapshot` (or swaps parts of it) whenever state changes; a
scrape only reads the snapshot it finds, so it never calls the API or NVML. Fields are
plain data so the renderer, the `devices` command and tests share one shape.

`DeviceState`'s fields are also the table that per-field code derives from: their
metadata says how each is stored and what moves it, and `compiled_function` compiles the
hot-path functions (copies, rows) that the state and the directory write from them.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from typing import Any

from gpuhealth.kube.slices import DriverTaint
from gpuhealth.nvml import DeviceReading

HEALTH_VALUES = ("Healthy", "Unhealthy", "Unknown")
SOURCE_POD, SOURCE_SLICE, SOURCE_NVML, SOURCE_NODE = "pod", "resourceslice", "nvml", "node"
STATUS_SOURCES = (SOURCE_POD, SOURCE_SLICE, SOURCE_NVML, SOURCE_NODE)
"""Where a device's current status comes from (`DeviceState.source`)."""


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


# Per-field metadata of `DeviceState`, the one table the rest derives from: the state's
# positional copies, the directory's `devices` columns, its row functions and UPDATEs.
SQL = "sql"
"""The column declaration in the directory's `devices` table (column name = field name)."""
MOVES = "moves"
"""What moves the field after the device is created, which picks the directory's UPDATE
that writes it: STATUS (a status change), IDENTITY (a pod or slice names the device
anew), ALLOCATIONS (pods come and go); absent: set once, at creation (or the key)."""
ITEMS = "items"
"""For a tuple of frozen dataclasses: their class (stored as a JSON list of field-value lists)."""
STATUS, IDENTITY, ALLOCATIONS = "status", "identity", "allocations"


@dataclass(frozen=True, slots=True)
class DeviceState:
    """The current state of one device, as kept by the directory.

    Adding a field: give it `metadata` (SQL, MOVES, ITEMS as fits), then a migration step
    in `exporter.directory.MIGRATIONS` that adds its column to existing files; the state's
    copies, the directory's schema, rows and UPDATEs follow from the fields. The rendered
    metrics and the `devices` columns name the fields they show."""

    node: str = field(metadata={SQL: "TEXT NOT NULL"})
    device: str = field(metadata={SQL: "TEXT NOT NULL"})
    """Canonical identity: the GPU UUID where known, else `<driver>/<pool>/<device>`."""
    health: str = field(metadata={SQL: "TEXT NOT NULL", MOVES: STATUS})
    """Reported value, one of HEALTH_VALUES; never rewritten by the exporter."""
    message: str = field(metadata={SQL: "TEXT NOT NULL", MOVES: STATUS})
    status_version: int = field(metadata={SQL: "INTEGER NOT NULL", MOVES: STATUS})
    """Increases by one on every change of (health, message); survives restarts."""
    first_seen: float = field(metadata={SQL: "REAL NOT NULL"})
    """Wall seconds when the device was first observed."""
    changed_at: float = field(metadata={SQL: "REAL NOT NULL", MOVES: STATUS})
    """Wall seconds when the current (health, message) was first observed."""
    observed_at: float = field(metadata={SQL: "REAL NOT NULL", MOVES: STATUS})
    """Wall seconds of the latest pod status observation that reported this status
    (heartbeats move it too, through their own UPDATE)."""
    unknown_since: float | None = field(default=None, metadata={SQL: "REAL", MOVES: STATUS})
    """Wall seconds since the device has been continuously reported Unknown; None otherwise.

    A message change while Unknown moves `changed_at` but not this (survives restarts)."""
    uuid: str = field(default="", metadata={SQL: "TEXT NOT NULL", MOVES: IDENTITY})
    driver: str = field(default="", metadata={SQL: "TEXT NOT NULL", MOVES: IDENTITY})
    pool: str = field(default="", metadata={SQL: "TEXT NOT NULL", MOVES: IDENTITY})
    device_name: str = field(default="", metadata={SQL: "TEXT NOT NULL", MOVES: IDENTITY})
    resource: str = field(default="", metadata={SQL: "TEXT NOT NULL", MOVES: IDENTITY})
    allocations: tuple[Allocation, ...] = field(
        default=(), metadata={SQL: "TEXT NOT NULL", MOVES: ALLOCATIONS, ITEMS: Allocation}
    )
    driver_taints: tuple[DriverTaint, ...] = field(
        default=(), metadata={SQL: "TEXT NOT NULL", MOVES: IDENTITY, ITEMS: DriverTaint}
    )
    source: str = field(default="pod", metadata={SQL: "TEXT NOT NULL DEFAULT 'pod'", MOVES: ALLOCATIONS})
    """Who vouches for the current health: one of STATUS_SOURCES. `pod` (the kubelet's
    allocatedResourcesStatus) is the authority while a pod holds the device; a device no pod
    holds takes its ResourceSlice's driver taints (`resourceslice`) or, in node mode, NVML's
    reachability (`nvml`), so an idle device keeps evidence of its health; an idle device-plugin
    device neither speaks for is vouched Healthy by its node's allocatable counts (`node`,
    `exporter.nodealloc`) once every registered device is allocatable again. It moves when the
    holders do (ALLOCATIONS): a hand-back whose health agrees changes only this, not the
    status (no new version, no log row: the pod-replacement hot path stays as cheap)."""


DEVICE_FIELDS: tuple[Field[Any], ...] = fields(DeviceState)
"""In declaration order, which is the positional order of the constructor."""


def compiled_function(
    name: str, params: str, result: str, body: Sequence[str] = (), /, **env: object
) -> Callable[..., Any]:
    """`def name(params): body; return result`, compiled from source once, at import.

    For per-field code on hot paths (a positional `DeviceState(...)` over every field costs
    under half of `dataclasses.replace`, measured 1.2 us against 2.7 us): the callers write
    the source from `DEVICE_FIELDS`, so a new field needs no hand-written copy. `body` is
    statements run first, one a line; `env` names what they and `result` use besides
    `DeviceState`. The source is registered with `linecache`, so tracebacks and profilers
    show it.
    """
    filename = f"<generated {name}>"
    lines = "".join(f"    {line}\n" for line in body)
    source = f"def {name}({params}):\n{lines}    return {result}\n"
    namespace: dict[str, Any] = {"DeviceState": DeviceState, **env}
    exec(compile(source, filename, "exec"), namespace)
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    function: Callable[..., Any] = namespace[name]
    return function


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


@dataclass(frozen=True, slots=True)
class ProducerState:
    """One node's health producer of one DRA driver (its kubelet plugin pods, `HealthProducer`)."""

    node: str
    driver: str
    ready: bool
    """Some producer pod on the node is Ready."""
    down_since: float | None = None
    """Wall seconds since when none has been Ready (the Ready condition's lastTransitionTime,
    else when the exporter saw it go); None while ready."""


def status_confirmed_at(
    device: DeviceState,
    node: NodeState | None,
    nvml: NvmlView | None,
    producer_down_since: float | None = None,
) -> float:
    """When the reported status was last confirmed fresh.

    A pod status observation confirms it. After that it stays fresh only while every source
    that maintains it is alive: the node's kubelet Lease keeps being renewed and, in node
    mode, NVML keeps answering for the device. The oldest source bounds freshness; a source
    that stops makes the age grow even though the reported value stays the same.

    `producer_down_since`: when the device's DRA health producer on its node stopped being
    Ready. Nothing confirms a report after that, not even a new pod status write: the kubelet
    expires a DRA report lazily and keeps writing the Healthy it last heard.
    """
    lease = node.lease_renewed_at if node is not None else None
    sources = [lease if lease is not None else device.observed_at]
    if nvml is not None and device.uuid:
        sources.append(nvml.read_at.get(device.uuid, device.observed_at))
    confirmed = max(device.observed_at, min(sources))
    if producer_down_since is not None:
        return min(confirmed, producer_down_since)
    return confirmed


def status_age(
    device: DeviceState,
    node: NodeState | None,
    nvml: NvmlView | None,
    now: float,
    producer_down_since: float | None = None,
) -> float:
    """Seconds since the reported status was last confirmed fresh (never negative)."""
    return max(0.0, now - status_confirmed_at(device, node, nvml, producer_down_since))


def producer_down_since(snapshot: Snapshot, device: DeviceState) -> float | None:
    """When the health producer of `device`'s driver on its node stopped being Ready; None if it is
    (or the device has no DRA driver, or no producer of its driver was ever seen on the node)."""
    if not snapshot.producers or not device.driver:
        return None
    producer = snapshot.producers.get((device.node, device.driver))
    return producer.down_since if producer is not None else None


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
    producers: Mapping[tuple[str, str], ProducerState] = field(default_factory=dict)
    """By (node, driver): the DRA health producers seen (a node whose producer was never seen
    has none, so nodes without a DRA driver are never flagged)."""
