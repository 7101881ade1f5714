"""What the simulated fleet tells its listeners (progress output, the demo's verdict, tests)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simulator.model import Fault


@dataclass(frozen=True, slots=True)
class FaultApplied:
    time: float
    wall: float
    fault: Fault


@dataclass(frozen=True, slots=True)
class DeviceHealthChanged:
    """A device's health as written into pods' allocatedResourcesStatus changed."""

    time: float
    wall: float
    node: str
    device: str
    """The GPU (`gpu-<index>`) on the node."""
    old: str
    new: str
    pods: tuple[str, ...]
    message: str | None = None


@dataclass(frozen=True, slots=True)
class NodeChanged:
    time: float
    wall: float
    node: str
    what: str


@dataclass(frozen=True, slots=True)
class GpuReset:
    """The reset controller (`janitor`) started or finished a GPU reset."""

    time: float
    wall: float
    node: str
    uuids: tuple[str, ...]
    """The cards it names (empty: every GPU of the node)."""
    request: str
    """The request's name (a `GPUReset`)."""
    what: str
    """`started`, `succeeded` or `failed`."""
    reason: str = ""


FleetEvent = FaultApplied | DeviceHealthChanged | NodeChanged | GpuReset

Emit = Callable[[FleetEvent], None]
"""How a component hands an event to the fleet's listeners."""
