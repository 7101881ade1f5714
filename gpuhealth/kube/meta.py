"""Object metadata, read the same way by every service: resourceVersion order, times, names.

Pure functions over plain dicts (as orjson returns them); nothing here raises on bad input.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

NODE_LEASE_NAMESPACE: Final = "kube-node-lease"
"""Where each kubelet renews its node's Lease (named after the node)."""


def rv_number(resource_version: str) -> int | None:
    """A resourceVersion as an integer where it is one (etcd's are), else None."""
    if resource_version.isdigit():
        return int(resource_version)
    return None


def is_newer(candidate: str, current: str) -> bool:
    """Whether resourceVersion `candidate` comes after `current`.

    Kubernetes calls resourceVersions opaque, but every real server (etcd revisions) and
    our simulated one issue increasing integers, which is the only way to tell an old
    event from a new one. Non-numeric versions can only be told equal or not.
    """
    a, b = rv_number(candidate), rv_number(current)
    if a is not None and b is not None:
        return a > b
    return candidate != current


def resource_version(obj: Any) -> str | None:
    """`metadata.resourceVersion` of a plain-dict object; None when absent, empty or malformed."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and rv else None


def metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`metadata` of a plain-dict object; an empty dict when absent or malformed."""
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def rfc3339(seconds: float) -> str:
    """Epoch seconds as RFC 3339 in UTC with microseconds (`2026-11-30T10:00:00.000000Z`): what
    gpuhealth writes in its records, and Kubernetes' MicroTime."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339_seconds(seconds: float) -> str:
    """Epoch seconds as RFC 3339 in UTC, whole seconds (`2026-11-30T10:00:00Z`): Kubernetes' Time."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: Any) -> float | None:
    """Kubernetes MicroTime/Time as epoch seconds; None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
