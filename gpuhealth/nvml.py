"""The narrow NVML interface, as plain data.

The exporter reads GPUs only through `NvmlSource`. Two implementations sit behind it:
`exporter.nvml_pynvml` over the real `pynvml` module, and the simulated cluster's fake
(`simulator.nvml`), which a remote reader can also reach over HTTP. Nothing here imports
`pynvml`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID critical error reported by the driver for a device."""

    uuid: str
    xid: int
    timestamp: float
    """Wall-clock seconds when the event was read."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (partition) of a MIG-enabled card, as NVML lists it under its parent."""

    uuid: str
    """Its own UUID (`MIG-...`): the device ID the device plugin advertises, not the card's."""
    gpu_instance_id: int
    compute_instance_id: int
    profile: str = ""
    """The GPU instance profile (`1g.10gb`), where known."""


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """One device's NVML readings at one moment; `None` means not supported or not readable."""

    uuid: str
    index: int
    reachable: bool
    """False when NVML answers GPU_IS_LOST (or any error that makes the device unreadable)."""
    error: str | None = None
    """The NVML error that made the device unreachable, for logs and the directory."""
    name: str | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    """The card's MIG devices while MIG mode is on (empty: none, or MIG off). A partition has no
    health of its own here: the card's readings are its readings (`docs/quarantine.md`, "MIG: the
    card is the device")."""


class NvmlSource(Protocol):
    """What the exporter needs from NVML on one node."""

    def start(self) -> bool:
        """Initialise; False (and one log line) when no driver or library is present."""
        ...

    def read(self) -> list[DeviceReading]:
        """Current readings of every device; a failing device yields reachable=False, never raises."""
        ...

    def drain_xid_events(self) -> list[XidEvent]:
        """XID events seen since the previous call, oldest first."""
        ...

    def close(self) -> None: ...
