"""Graceful pod deletion: the API server's part of terminating a pod (pure decisions, no store).

A DELETE of a pod that a kubelet runs (bound, not yet Succeeded or Failed) does not remove it:
it sets `metadata.deletionTimestamp` (now + the grace period) and
`deletionGracePeriodSeconds`, and the kubelet stops the containers and then deletes the pod
again with a grace period of 0, which removes it (finalizers still hold it). The grace period
is the request's `gracePeriodSeconds`, else the pod's `spec.terminationGracePeriodSeconds`
(default 30). A later DELETE may shorten a pending grace period, never lengthen it; 0 (a
force delete) removes the pod at once. Unbound and finished pods go at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from simulator.apiserver.stored import format_timestamp

DEFAULT_GRACE_SECONDS = 30

Action = Literal["remove", "unchanged", "terminating"]
"""What the store does with the DELETE: remove the object (or hand it to the finalizer path),
leave it as it is, or store the returned object (a MODIFIED event)."""


def grace_period(pod: dict[str, Any], requested: int | None) -> int:
    """Seconds the pod gets to stop; 0 means it is removed at once."""
    spec = pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase")
    if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
        return 0
    if requested is None:
        configured = spec.get("terminationGracePeriodSeconds")
        requested = DEFAULT_GRACE_SECONDS if configured is None else int(configured)
    # A negative period would mean "already overdue"; the API server treats it as 1 second.
    return 1 if requested < 0 else requested


def delete_pod(
    pod: dict[str, Any], requested: int | None, now: float, runs: Callable[[dict[str, Any]], bool]
) -> tuple[Action, dict[str, Any]]:
    """Decide a pod DELETE. `runs(pod)`: whether a simulated kubelet runs it (and so will finish it).

    `pod` is a private copy; the returned object is what to store for "terminating".
    """
    meta = pod["metadata"]
    grace = grace_period(pod, requested) if runs(pod) else 0
    current = meta.get("deletionGracePeriodSeconds")
    if grace > 0:
        if current is not None and current <= grace:
            return "unchanged", pod  # a longer or equal grace period never extends a pending one
        meta["deletionTimestamp"] = format_timestamp(now + grace)
        meta["deletionGracePeriodSeconds"] = grace
        meta.pop("resourceVersion", None)
        return "terminating", pod
    if meta.get("deletionTimestamp") and meta.get("finalizers"):
        if current == 0:
            return "unchanged", pod
        meta["deletionGracePeriodSeconds"] = 0  # finalizers hold it; their removal removes it
        meta.pop("resourceVersion", None)
        return "terminating", pod
    return "remove", pod
