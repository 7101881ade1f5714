"""A list response's wire format, one page at a time: `{"items": [...], "metadata": {...}}`.

`metadata.continue` says where the next page starts (absent on the last page) and
`metadata.resourceVersion` is the list's, to watch from. How the items are decoded is the
reader's choice (`PageDecoder`): plain dicts by default (`decode_page`); the exporter reads
pod pages straight into its partial Structs. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list body, as a `PageDecoder` reads it."""

    items: list[Any]
    """The objects, in the form the decoder makes them (plain dicts by default)."""
    continue_token: str
    """Where the next page starts; empty on the last page."""
    resource_version: str | None
    """The list's resourceVersion (every page carries it; the last one must)."""


PageDecoder = Callable[[bytes], Page]
"""Reads one list response body into a `Page`; raises ValueError where it is not a list."""


def decode_page(body: bytes) -> Page:
    """A list response body with orjson: the items as plain dicts."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"the body is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("the body is not a JSON object")
    items = doc.get("items") or []
    meta = doc.get("metadata") or {}
    if not isinstance(items, list) or not isinstance(meta, dict):
        raise ValueError("malformed body")
    token, rv = meta.get("continue") or "", meta.get("resourceVersion")
    return Page(items, token if isinstance(token, str) else "", rv if isinstance(rv, str) and rv else None)
