"""The work a move cost: time a pod had worked since its last checkpoint when it was evicted.

Pure: no I/O, no clock reads (the caller passes the eviction's time and the pod object as it
read it). The migration executor observes `gpuhealth_migration_work_lost_seconds{since}` for
every pod an eviction of a move landed on (`responder.reconcile.accounting.WorkLostMeter`).

A workload says when it last saved its state with the pod annotation `LAST_CHECKPOINT`
(`gpuhealth.io/last-checkpoint-time`, RFC 3339, written by its checkpoint agent after each
committed checkpoint, whether asked for by the responder or taken on its own schedule;
docs/workloads.md). The work lost is the eviction's time minus that time (`since="checkpoint"`).
A pod without the annotation has saved nothing the responder can see: everything since its
containers started is lost (`since="start"`, from `status.startTime`), an upper bound for a
workload that checkpoints without saying so. A checkpoint time after the eviction (clocks of
two machines) counts as nothing lost, never as negative work.

An annotation that is present but not RFC 3339 is the workload's error to hear about: it is
refused with `WorkLostError` naming the pod, the annotation and the value, and the executor
logs it and counts the pod since its start (what it would have counted had the workload said
nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuhealth.kube.meta import parse_rfc3339

LAST_CHECKPOINT = "gpuhealth.io/last-checkpoint-time"
"""Pod annotation: when the workload last committed a checkpoint (RFC 3339, UTC or with offset)."""


class Since(StrEnum):
    """What the work lost is counted from (the `since` label)."""

    CHECKPOINT = "checkpoint"
    START = "start"


class WorkLostError(ValueError):
    """The pod's checkpoint annotation cannot be read; the message names pod, annotation and value."""


@dataclass(frozen=True, slots=True)
class WorkLost:
    seconds: float
    since: Since


def work_lost(pod: Mapping[str, Any], evicted_at: float) -> WorkLost | None:
    """The work `pod` lost when it was evicted at `evicted_at` (Unix seconds).

    None when the pod says nothing at all (no annotation and no start time: it never ran).
    Raises WorkLostError for an annotation that is not an RFC 3339 time."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    text = annotations.get(LAST_CHECKPOINT)
    if text is not None:
        at = parse_rfc3339(str(text).strip())
        if at is None:
            name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            raise WorkLostError(
                f"pod {name}: annotation {LAST_CHECKPOINT}={text!r} is not an RFC 3339 time "
                "such as 2026-05-01T12:00:00Z"
            )
        return WorkLost(max(0.0, evicted_at - at), Since.CHECKPOINT)
    started = (pod.get("status") or {}).get("startTime")
    at = parse_rfc3339(started)
    if at is None:
        return None
    return WorkLost(max(0.0, evicted_at - at), Since.START)


def fallback(pod: Mapping[str, Any], evicted_at: float) -> WorkLost | None:
    """`work_lost` with the annotation disregarded: counted from the pod's start."""
    meta = dict(pod.get("metadata") or {})
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_CHECKPOINT}
    return work_lost({**pod, "metadata": meta}, evicted_at)
