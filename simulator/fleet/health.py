"""Device state and the kubelet's view of device health: plain data and pure functions.

`Gpu` holds what the hardware and its driver say about one GPU (the reported health, whether
the DRA driver still sends reports, NVML counters, ResourceSlice taints). The functions below
say what a 1.36 kubelet would put in `allocatedResourcesStatus` for it at a given moment:

- device plugin: only Healthy or Unhealthy, never a message; a disconnected plugin (broken
  ListAndWatch stream) makes every device of the resource Unhealthy;
- DRA: the last report's health and message (at most 1024 characters), Unknown once the last
  report is older than the timeout, Unknown for every device while the stream is broken.

When the kubelet evaluates this (prompt push vs periodic sync) is the kubelet module's concern.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
UNKNOWN = "Unknown"

MESSAGE_LIMIT = 1024


@dataclass(slots=True)
class Gpu:
    node: str
    index: int
    uuid: str
    path: str
    """"device-plugin" or "dra"."""
    reported: str = HEALTHY
    """What the device plugin / DRA driver last reported: Healthy or Unhealthy."""
    message: str | None = None
    """The DRA driver's message with the report (device plugins send none)."""
    reporting: bool = True
    """False while the DRA driver sends no reports for this device."""
    silent_since: float = 0.0
    """Simulated time of the last report once `reporting` is False."""
    lost: bool = False
    """NVML answers GPU_IS_LOST."""
    taints: list[dict[str, Any]] = field(default_factory=list)
    """ResourceSlice device taints the DRA driver sets (gpu.nvidia.com/xid, gpu.nvidia.com/gpu-lost,
gpu.nvidia.com/unhealthy)."""
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    rows_correctable: int = 0
    rows_uncorrectable: int = 0
    rows_pending: bool = False
    rows_failure: bool = False
    partitions: tuple[str, ...] = ()
    """The MIG UUIDs of the card's partitions while MIG is on (`simulator.fleet.mig`), in order;
    empty: a whole GPU. A partition has no health of its own: the card's is every partition's."""
    allocated: int = 0
    """Pods (or replica slots) using this GPU; drives simulated power draw."""
    unhealthy_reports: int = 0
    """How often the driver turned the device Unhealthy: a program that ran on the device while
    this grew saw it fail, even if it reports Healthy again by the time the program ends."""
    unhealthy_token: int = 0
    unknown_token: int = 0
    needs_reset: bool = False
    """A fault left the card in a state only a GPU reset clears: a GPU program on it fails."""
    reset_fails: bool = False
    """A reset of the card fails (a hardware fault: it stays as it is)."""
    failed_watches: set[str] = field(default_factory=set)
    """DCGM health watches that fail on this GPU (PCIE, MEM, ...) until it recovers: what DCGM's
    health checks see and neither the driver nor the kubelet reports."""

    @property
    def name(self) -> str:
        """The device name in the ResourceSlice (and in CDI ids)."""
        return f"gpu-{self.index}"


def device_plugin_health(gpu: Gpu, plugin_connected: bool) -> str:
    """What the kubelet reports for a device-plugin device: Healthy or Unhealthy, nothing else."""
    if not plugin_connected:
        return UNHEALTHY
    return UNHEALTHY if gpu.reported == UNHEALTHY else HEALTHY


def dra_health(gpu: Gpu, stream_ok: bool, now: float, timeout: float) -> tuple[str, str | None]:
    """(health, message) the kubelet's DRA health cache yields when evaluated at `now`."""
    if not stream_ok:
        return UNKNOWN, None
    if not gpu.reporting and now - gpu.silent_since >= timeout:
        return UNKNOWN, None
    message = gpu.message[:MESSAGE_LIMIT] if gpu.message is not None else None
    return gpu.reported, message


def record_report(gpu: Gpu, health: str, message: str | None, *, keeps_message: bool) -> bool:
    """Store a report from the device plugin or DRA driver; True when the kubelet should hear of it.

    Only the DRA driver's message is kept (a device plugin sends none), but a report counts as
    news when either its health or its message differs from what is stored.
    """
    changed = gpu.reported != health or gpu.message != message
    if health == UNHEALTHY and gpu.reported != UNHEALTHY:
        gpu.unhealthy_reports += 1
    gpu.reported = health
    gpu.message = message if keeps_message else None
    return changed
