"""MIG partitions of the simulated GPUs: their identities as NVML and the device plugin give them.

Pure functions, no state: a partition is (its card, its number on the card), everything else
is derived from the card's UUID and the node group's `MigLayout`, so the device plugin, the
pod-resources view, NVML and the pod runner name the same partition the same way.

The shapes follow the real stack (`docs/quarantine.md`, "MIG: the card is the device"):
- NVML lists a MIG-enabled card once, with its MIG devices under it; each MIG device has its
  own UUID (`MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` since driver R470, no parent in it), a GPU
  instance id and a compute instance id; the parent is found only through NVML
  (`nvmlDeviceGetDeviceHandleFromMigDeviceHandle`).
- The NVIDIA device plugin uses the MIG UUID as the device ID, under `nvidia.com/gpu` (strategy
  `single`) or `nvidia.com/mig-<profile>` (strategy `mixed`). A whole-card XID (no GPU instance
  in the event), a lost GPU or a failed ECC check marks every MIG device of the card Unhealthy.
- The container runtime takes MIG UUIDs in `NVIDIA_VISIBLE_DEVICES`.
"""

from __future__ import annotations

import hashlib

from gpuhealth.nvml import MigDevice
from simulator.model import MigLayout

MIG_PREFIX = "MIG-"


def partition_uuid(card_uuid: str, partition: int) -> str:
    """The MIG UUID of partition `partition` of the card `card_uuid` (stable, unrelated-looking)."""
    h = hashlib.sha1(f"{card_uuid}/mig/{partition}".encode()).hexdigest()
    return f"{MIG_PREFIX}{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def partition_uuids(card_uuid: str, layout: MigLayout | None) -> tuple[str, ...]:
    """The MIG UUIDs of the card's partitions in order (no layout: none, a whole GPU)."""
    if layout is None:
        return ()
    return tuple(partition_uuid(card_uuid, p) for p in range(layout.partitions))


def gpu_instance_id(layout: MigLayout, partition: int) -> int:
    """The GPU instance id NVML gives partition `partition`: instances are placed side by side,
    one per slice of the profile's size, and numbered from 1 as `nvidia-smi mig -lgi` lists them."""
    return 1 + partition * slices(layout)


def slices(layout: MigLayout) -> int:
    """Compute slices of one instance of the layout's profile (`3g.40gb`: 3)."""
    head = layout.profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 1


def partitions(card_uuid: str, layout: MigLayout) -> tuple[MigDevice, ...]:
    """The card's MIG devices, as NVML lists them under it."""
    return tuple(
        MigDevice(
            uuid=partition_uuid(card_uuid, p),
            gpu_instance_id=gpu_instance_id(layout, p),
            compute_instance_id=0,
            profile=layout.profile,
        )
        for p in range(layout.partitions)
    )


def card_of(visible: str, cards: dict[str, tuple[str, ...]]) -> str | None:
    """The card a `NVIDIA_VISIBLE_DEVICES` entry reaches: the card's own UUID, or one of its MIG
    devices' (`cards`: card UUID -> its MIG UUIDs); None when it names no card of the node."""
    if visible in cards:
        return visible
    for card, migs in cards.items():
        if visible in migs:
            return card
    return None
