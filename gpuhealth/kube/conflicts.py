"""Optimistic writes tried again: the one loop every read-modify-write at a resourceVersion uses."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from gpuhealth.kube.errors import Conflict

T = TypeVar("T")

ATTEMPTS = 5
"""Reads and writes of one change before giving up: a write loses a race only to another writer
of the same object, and five losses in a row mean something rewrites it in a loop."""


def retry_on_conflict(attempt: Callable[[], T], *, what: str, attempts: int = ATTEMPTS) -> T:
    """`attempt()` (read the object, change it, write it conditionally) again while its write
    answers 409 Conflict; Conflict naming `what` after `attempts` losses."""
    for _ in range(attempts):
        try:
            return attempt()
        except Conflict:
            continue
    raise Conflict(f"{what}: still conflicting after {attempts} attempts")
