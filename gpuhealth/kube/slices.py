"""ResourceSlice fields that more than one service reads. Pure: no I/O."""

from __future__ import annotations

from typing import Any


def uuid_attribute(attributes: Any) -> str:
    """A slice device's `uuid` attribute (plain or domain-qualified, e.g. `gpu.nvidia.com/uuid`):
    the GPU UUID the NVIDIA DRA driver publishes; empty when there is none."""
    if not isinstance(attributes, dict):
        return ""
    for key, value in attributes.items():
        if (key == "uuid" or key.endswith("/uuid")) and isinstance(value, dict):
            uuid = value.get("string")
            if isinstance(uuid, str) and uuid:
                return uuid
    return ""


def parent_uuid_attribute(attributes: Any) -> str:
    """A MIG device's `parentUUID` attribute (plain or domain-qualified): the UUID of the card the
    NVIDIA DRA driver carved it from; empty for a whole GPU (or a driver that publishes none)."""
    if not isinstance(attributes, dict):
        return ""
    for key, value in attributes.items():
        if (key == "parentUUID" or key.endswith("/parentUUID")) and isinstance(value, dict):
            parent = value.get("string")
            if isinstance(parent, str) and parent:
                return parent
    return ""
