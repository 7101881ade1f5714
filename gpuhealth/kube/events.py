"""Kubernetes Events (core/v1) as gpuhealth writes them: the one builder. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuhealth.kube.meta import rfc3339_seconds
from gpuhealth.kube.resources import Resource

EVENT = Resource("", "v1", "events", namespaced=True)
MAX_MESSAGE = 1024
"""Characters of an Event's message kept (the apiserver refuses much longer ones)."""


def core_event(
    *,
    involved: Mapping[str, Any],
    namespace: str,
    reason: str,
    message: str,
    warning: bool,
    now: float,
    component: str,
    name: str = "",
    generate_name: str = "",
    instance: str = "",
) -> dict[str, Any]:
    """One Event about `involved` (its objectReference), counted once at `now`. `name` gives it a
    fixed name (a second write is 409 AlreadyExists: written once); else `generate_name`."""
    if bool(name) == bool(generate_name):
        raise ValueError("an Event needs exactly one of name and generate_name")
    metadata: dict[str, Any] = {"namespace": namespace}
    metadata["name" if name else "generateName"] = name or generate_name
    stamp = rfc3339_seconds(now)
    event: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": metadata,
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    if instance:
        event["reportingInstance"] = instance
    return event
