"""Object metadata, read the same way by every service: resourceVersion order, times, names.

Pure functions over plain dicts (as orjson returns them); nothing here raises on bad input but
`strict_rfc3339`, for callers that say what was wrong.
"""

from __future__ import annotations

import re
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


_RFC3339: Final = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2}(?:\.\d+)?)(?P<offset>[Zz]|[+-]\d{2}:\d{2})?",
    re.ASCII,
)
"""RFC 3339's date-time (section 5.6), its offset optional here only to say that it is missing."""


class NoTimeZone(ValueError):
    """An RFC 3339 date-time without its offset: a local time, which would be a guess."""


def strict_rfc3339(text: str) -> datetime:
    """An RFC 3339 date-time (`2026-11-30T10:00:00Z`, `t` and `z` too, any fraction of a second,
    `+hh:mm` offsets) as an aware datetime; nothing else: no date alone, no bare number, no space
    for `T`. Raises `NoTimeZone` for one without its offset, ValueError for anything else, each
    naming `text`."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not an RFC 3339 time")
    if match["offset"] is None:
        raise NoTimeZone(f"{text!r} has no time zone")
    offset = "+00:00" if match["offset"] in ("Z", "z") else match["offset"]
    try:
        return datetime.fromisoformat(f"{match[1]}T{match[2]}{offset}")
    except ValueError:  # a field out of range (month 13, 25 o'clock)
        raise ValueError(f"{text!r} is not an RFC 3339 time") from None


def parse_rfc3339(value: Any) -> float | None:
    """Kubernetes MicroTime/Time (any RFC 3339 date-time, `strict_rfc3339`) as epoch seconds;
    None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return strict_rfc3339(value).timestamp()
    except ValueError:
        return None
