"""ResourceSlices as every service reads them: one parser, one `SliceDevice`. Pure: no I/O.

A ResourceSlice (resource.k8s.io/v1: attributes and taints on the device; v1beta1: under
`basic`) publishes one driver's devices in one pool, usually of one node. What a service makes of
them is its own: the exporter governs a MIG device as its card and judges the driver's taints
(`exporter.identity`), the responder finds a record's device among them (`responder.enforce.identity`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DeviceRef = tuple[str, str, str]
"""(driver, pool, device) as a DRA allocation result names a device."""


@dataclass(frozen=True, slots=True)
class DriverTaint:
    """A taint the driver put on a device in its ResourceSlice (`key=value:effect`)."""

    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of a ResourceSlice, as the slice publishes it."""

    driver: str
    pool: str
    device: str
    node: str
    """The slice's `nodeName` (empty for a slice of no one node)."""
    uuid: str = ""
    """Its `uuid` attribute: the GPU UUID (a MIG device's own MIG UUID); empty: none published."""
    parent: str = ""
    """A MIG device's card (its `parentUUID` attribute); empty for a whole GPU."""
    taints: tuple[DriverTaint, ...] = ()

    @property
    def ref(self) -> DeviceRef:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    """A ResourceSlice's devices and where they are."""

    name: str
    """`metadata.name`; empty when the object has none."""
    driver: str
    pool: str
    node: str
    devices: tuple[SliceDevice, ...]
    malformed_devices: int = 0
    """Entries of `spec.devices` left out: not an object, or without a name."""


def parse_resource_slice(obj: Any) -> ResourceSlice | None:
    """A ResourceSlice dict; None when it names no driver or pool, or its devices are no list.

    A device entry that is not an object or has no name is left out and counted, so a caller
    decides whether one bad entry spoils the slice."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if not isinstance(spec, dict):
        return None
    meta = obj.get("metadata")
    name = _text(meta.get("name")) if isinstance(meta, dict) else ""
    pool_obj = spec.get("pool")
    driver = _text(spec.get("driver"))
    pool = _text(pool_obj.get("name")) if isinstance(pool_obj, dict) else ""
    node = _text(spec.get("nodeName"))
    raw = spec.get("devices") or []
    if not (driver and pool) or not isinstance(raw, list):
        return None
    devices = []
    for item in raw:
        device = _text(item.get("name")) if isinstance(item, dict) else ""
        if not device:
            continue
        basic_value = item.get("basic")
        basic: dict[str, Any] = basic_value if isinstance(basic_value, dict) else item
        attributes = basic.get("attributes")
        devices.append(
            SliceDevice(
                driver,
                pool,
                device,
                node,
                uuid_attribute(attributes),
                parent_uuid_attribute(attributes),
                _taints(basic.get("taints")),
            )
        )
    return ResourceSlice(name, driver, pool, node, tuple(devices), len(raw) - len(devices))


def uuid_attribute(attributes: Any) -> str:
    """A slice device's `uuid` attribute (plain or domain-qualified, e.g. `gpu.nvidia.com/uuid`):
    the GPU UUID the NVIDIA DRA driver publishes; empty when there is none."""
    return _string_attribute(attributes, "uuid")


def parent_uuid_attribute(attributes: Any) -> str:
    """A MIG device's `parentUUID` attribute (plain or domain-qualified): the UUID of the card the
    NVIDIA DRA driver carved it from; empty for a whole GPU (or a driver that publishes none)."""
    return _string_attribute(attributes, "parentUUID")


def _string_attribute(attributes: Any, name: str) -> str:
    if not isinstance(attributes, dict):
        return ""
    for key, value in attributes.items():
        if (key == name or key.endswith(f"/{name}")) and isinstance(value, dict):
            text = value.get("string")
            if isinstance(text, str) and text:
                return text
    return ""


def _taints(raw: Any) -> tuple[DriverTaint, ...]:
    if not isinstance(raw, list):
        return ()
    taints = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        key, effect = item.get("key"), item.get("effect")
        if isinstance(key, str) and isinstance(effect, str):
            taints.append(DriverTaint(key=key, effect=effect, value=_text(item.get("value"))))
    return tuple(taints)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
