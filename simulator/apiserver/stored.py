"""How the store keeps one object version: `Entry` (its JSON bytes and a small index), the
index a write computes (labels, selectable fields), how a field selector matches it, and the
timestamp format the server stamps on what it stores.

Pure: plain data and functions, no store state; `store.py` and `watch.py` share them.
"""

from __future__ import annotations

from typing import Any

import orjson

from gpuhealth.kube.meta import rfc3339_seconds
from simulator.apiserver.resources import ResourceInfo
from simulator.apiserver.selectors import FieldSelector, extract_fields


class Entry:
    """One stored object version: its bytes and the index fields selectors need. Immutable by use."""

    __slots__ = ("data", "fields", "labels", "name", "namespace", "rv")

    def __init__(
        self,
        namespace: str,
        name: str,
        rv: int,
        labels: dict[str, str] | None,
        fields: dict[str, str] | None,
        data: bytes,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.rv = rv
        self.labels = labels
        self.fields = fields
        self.data = data

    def load(self) -> dict[str, Any]:
        obj: dict[str, Any] = orjson.loads(self.data)
        return obj


def format_timestamp(seconds: float) -> str:
    """RFC 3339 with second precision, as metav1.Time serializes."""
    return rfc3339_seconds(seconds)


def index(info: ResourceInfo, obj: dict[str, Any]) -> tuple[dict[str, str] | None, dict[str, str] | None]:
    """The labels and selectable fields of `obj`, as its `Entry` keeps them (None for none)."""
    labels = (obj.get("metadata") or {}).get("labels") or None
    if labels is not None:
        labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else None
    fields = extract_fields(obj, info.field_paths) if info.field_paths else None
    if info.key == "nodes" and fields is not None and "spec.unschedulable" not in fields:
        fields["spec.unschedulable"] = "false"
    return labels, fields or None


def _field_value(entry: Entry, field: str) -> str:
    if field == "metadata.name":
        return entry.name
    if field == "metadata.namespace":
        return entry.namespace
    return (entry.fields or {}).get(field, "")


def fields_match(selector: FieldSelector, entry: Entry) -> bool:
    """Whether `entry` satisfies every requirement of the field selector."""
    for req in selector.requirements:
        value = _field_value(entry, req.field)
        if (value == req.value) != (req.op == "="):
            return False
    return True


__all__ = ["Entry", "fields_match", "format_timestamp", "index"]
