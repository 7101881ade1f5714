"""How the demo's observer names a device in what it sees: the fleet's card uuids. Pure.

The API and the alerts name a device in many ways: a node and a GPU index (`gpu-<i>`), a DRA slice
device of a node's pool (`gpu-<minor>`, a MIG device `gpu-<minor>-mig-...`), a device plugin's
resource ID (the uuid, a time-sliced replica `<uuid>::<n>`, a MIG partition's UUID), an alert's
labels, a container's `NVIDIA_VISIBLE_DEVICES`. The journal keys every entry by the card's
uuid (`demo.journal.Device`), so `DeviceNames` turns each of them into that.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from demo.journal import Journal

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
"""The NVIDIA container runtime's variable: the GPUs a container without an allocation reaches."""
DELETED = "DELETED"
"""A watch event's type for an object gone."""


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's metadata (empty when it has none)."""
    found = obj.get("metadata")
    return found if isinstance(found, Mapping) else {}


class DeviceNames:
    """The journal's fleet of cards, and the card each way of naming a device means."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._uuid_at = {(d.node, f"gpu-{d.index}"): d.uuid for d in journal.devices.values()}
        self._card_of = {p: d.uuid for d in journal.devices.values() for p in d.partitions}
        """MIG UUID -> its card's uuid: a MIG card is named by its partitions on the device-plugin path."""

    def on_node(self, node: str, device: str) -> str:
        """The uuid of the node's GPU named `device` (`gpu-<index>`); '' for none of the fleet's."""
        return self._uuid_at.get((node, device), "")

    def of_labels(self, labels: Mapping[str, str]) -> str:
        """The uuid an alert's labels name (the `uuid` label, a device-plugin device, or pool/device)."""
        if labels.get("uuid"):
            return labels["uuid"]
        device = labels.get("device", "")
        if device in self.journal.devices:
            return device
        parts = device.split("/")
        if len(parts) == 3:
            return self._uuid_at.get((parts[1], parts[2]), device)
        return device

    def card(self, device: str) -> str:
        """The card a device ID names: a MIG partition's card, else the ID itself."""
        return self._card_of.get(device, device)

    def slice_card(self, pool: str, device: str) -> str:
        """The card (uuid) of a DRA slice device of `pool` (its node); '' for none of the fleet's."""
        # A MIG device of the NVIDIA DRA driver (`gpu-<minor>-mig-...`) is of its card `gpu-<minor>`.
        return self._uuid_at.get((pool, device)) or self._uuid_at.get((pool, device.split("-mig-")[0]), "")

    def resource_card(self, resource_id: str) -> str:
        """The card (uuid) a device plugin's resource ID names: the card's own uuid, a time-sliced
        replica of it (`<uuid>::<n>`) or a MIG partition of it; '' for none of the fleet's (a DRA
        CDI device name: its claim's allocation names the device)."""
        card = self.card(resource_id.split("::", 1)[0])
        return card if card in self.journal.devices else ""

    def visible(self, obj: Mapping[str, Any], node: str) -> tuple[str, ...]:
        """uuids of the node's GPUs the pod's `NVIDIA_VISIBLE_DEVICES` names (uuids or indexes)."""
        found: list[str] = []
        spec = obj.get("spec") or {}
        # Init containers too: the probe's diagnostic, the one that uses the card, is one.
        for container in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
            for var in (container.get("env") or ()) if isinstance(container, Mapping) else ():
                if not isinstance(var, Mapping) or var.get("name") != VISIBLE_DEVICES:
                    continue
                for entry in str(var.get("value") or "").split(","):
                    entry = entry.strip()
                    uuid = self.on_node(node, f"gpu-{entry}") if entry.isdigit() else self.card(entry)
                    known = self.journal.devices.get(uuid)
                    if known is not None and known.node == node and uuid not in found:
                        found.append(uuid)
        return tuple(found)
