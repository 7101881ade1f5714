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
