"""The watch stream's wire format: one JSON event per line, `{"type": ..., "object": ...}`.

Lines are split per chunk received, so a reader hands on everything one read brought at
once (the exporter's hot path: one message per chunk, not per event). Decoding never
raises: a line that is not an event comes back as the reason, a fixed vocabulary that
services count under a metric label. An ERROR event carries a Status, which
`errors.error_from_status` turns into the error it means (`Gone` for an expired
resourceVersion).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, NamedTuple

import orjson

INVALID_JSON: Final = "invalid_json"
"""Parse error reason: a watch line that is not JSON."""
MALFORMED_EVENT: Final = "malformed_event"
"""Parse error reason: JSON, but not an object with a string `type`."""

ADDED: Final = "ADDED"
MODIFIED: Final = "MODIFIED"
DELETED: Final = "DELETED"
BOOKMARK: Final = "BOOKMARK"
"""Carries only a newer resourceVersion to resume from; no change to apply."""
ERROR: Final = "ERROR"
"""Carries a Status; the watch ends after it."""

Event = tuple[str, Any]
"""(type, object) of a decoded watch event; the object as the decoder made it."""


class WatchEvent(NamedTuple):
    """A watch event as `KubeClient.watch` yields it: the object is a plain dict."""

    type: str
    object: dict[str, Any]


def split_lines(chunks: Iterator[bytes]) -> Iterator[list[bytes]]:
    """Complete lines of a byte stream, grouped per chunk received (a watch is one JSON per line)."""
    pending = b""
    for chunk in chunks:
        if not chunk:
            continue
        data = pending + chunk if pending else chunk
        lines = data.split(b"\n")
        pending = lines.pop()
        complete = [line for line in lines if line.strip()]
        if complete:
            yield complete
    if pending.strip():
        yield [pending]


def decode_event(line: bytes) -> Event | str:
    """A watch line as (type, object) with orjson, or the parse error reason when it is not one."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return INVALID_JSON
    if not isinstance(event, dict):
        return MALFORMED_EVENT
    event_type = event.get("type")
    if not isinstance(event_type, str):
        return MALFORMED_EVENT
    return event_type, event.get("object")
