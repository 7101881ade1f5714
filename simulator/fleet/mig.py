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
- The NVIDIA DRA driver (`kubernetes-sigs/dra-driver-nvidia-gpu`, its kubelet plugin's MIG
  devices) publishes each MIG device in the node's ResourceSlice as
  `gpu-<parent minor>-mig-<profile without its dot>-<GPU instance profile id>-<placement start>`
  (`gpu-0-mig-3g40gb-9-4`), with the attributes `type: mig`, `uuid` (the MIG UUID),
  `parentUUID`, `profile` and its card's product and versions. Its health check taints every
  MIG device of a card for an event of the card.
"""

from __future__ import annotations

import hashlib

from gpuhealth.nvml import MigDevice
from simulator.model import MigLayout, Slot

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


_PROFILE_IDS = {1: 19, 2: 14, 3: 9, 4: 5, 7: 0}
"""GPU instance profile id by compute slices, as NVML numbers the A100/H100 profiles of each
size's smallest memory (`nvidia-smi mig -lgip`: 1g.10gb 19, 2g.20gb 14, 3g.40gb 9, 4g.40gb 5,
7g.80gb 0)."""
_PLACEMENT_STEP = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}
"""Memory slices between two placements of a profile of that many compute slices (a 3g instance
starts at slice 0 or 4, as NVML's placements for it)."""


def profile_id(layout: MigLayout) -> int:
    """The GPU instance profile id of the layout's profile."""
    return _PROFILE_IDS.get(slices(layout), 19)


def placement_start(layout: MigLayout, partition: int) -> int:
    """The first memory slice of partition `partition`'s placement."""
    return partition * _PLACEMENT_STEP.get(slices(layout), slices(layout))


def dra_device_name(minor: int, layout: MigLayout, partition: int) -> str:
    """The ResourceSlice device name the NVIDIA DRA driver gives partition `partition` of the GPU
    of minor `minor`."""
    profile = layout.profile.replace(".", "")
    return f"gpu-{minor}-mig-{profile}-{profile_id(layout)}-{placement_start(layout, partition)}"


def dra_device(layout: MigLayout | None, slot: Slot) -> str:
    """The ResourceSlice device a DRA node's slot is: its whole GPU (`gpu-<i>`), or on a
    MIG-partitioned node its partition."""
    if layout is None or slot.replica is None:
        return f"gpu-{slot.gpu}"
    return dra_device_name(slot.gpu, layout, slot.replica)


def dra_slots(layout: MigLayout | None, gpus: int) -> dict[str, Slot]:
    """A DRA node's devices by name, each the slot it is (`dra_device`'s inverse)."""
    if layout is None:
        return {f"gpu-{g}": Slot(g) for g in range(gpus)}
    return {dra_device_name(g, layout, p): Slot(g, p) for g in range(gpus) for p in range(layout.partitions)}


def card_of(visible: str, cards: dict[str, tuple[str, ...]]) -> str | None:
    """The card a `NVIDIA_VISIBLE_DEVICES` entry reaches: the card's own UUID, or one of its MIG
    devices' (`cards`: card UUID -> its MIG UUIDs); None when it names no card of the node."""
    if visible in cards:
        return visible
    for card, migs in cards.items():
        if visible in migs:
            return card
    return None
