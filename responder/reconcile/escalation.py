"""Escalation to the node: when a node's card failures are the node's, not its cards'.

Pure: no I/O, time passed in. The records stay per device (node, device); a node is escalated
only while a justification holds over its records and the driver's signals, and the record of
the escalation says which one held, with its evidence (`Escalation`, kept on the Node as the
annotation `ANNOTATION`, beside the taint `TAINT_KEY`):
- `cards-failing`: at least `cards` cards of the node are under an automatic quarantine
  (Quarantined: enforced, not yet on the release ladder) whose starts fall within `window`
  of each other. An NVLink fabric, a PCIe switch or a driver failing shows as several cards at
  once; cards failing days apart on one node are each their own failure.
- `driver-gpu-lost`: every whole GPU the node's ResourceSlices publish carries the DRA driver's
  `gpu.nvidia.com/gpu-lost` taint, and at least `lost_cards` of its cards are under an automatic
  quarantine. The driver sets that taint on every device of the node when NVML reports a GPU
  lost (NVML says so of the event set, not of one GPU), so alone it cannot tell one lost card
  from a lost node: a single card's failure never escalates, whatever the driver taints.

What never counts: Unknown (`restrict` records: unconfirmed), a person's quarantine (maintenance
is not a failure), a card on the release ladder (it walks its own), a record not yet enforced
(Pending or Deferred: the breaker or the bucket held it back). A fleet-wide storm trips the
breaker, which holds every escalation back (`admit`); a node counts as its GPUs against the
breaker's limits and the new-quarantine bucket, since its taint keeps all of them from new work.

The action is the smallest that keeps new GPU work off the node: a NoSchedule taint that no GPU
pod tolerates (never a drain: the per-device moves handle running work; never NotReady). It is
lifted when the justification no longer holds (the cards recover and walk their own ladders).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuhealth import yaml_keys
from gpuhealth.kube.meta import parse_rfc3339, rfc3339
from gpuhealth.kube.slices import SliceDevice
from responder.reconcile import breaker
from responder.reconcile.breaker import BreakerSettings, BreakerState, Counts
from responder.reconcile.limits import Bucket
from responder.records import Phase, Quarantine, quarantine_starts

CARDS_FAILING = "cards-failing"
DRIVER_GPU_LOST = "driver-gpu-lost"
JUSTIFICATIONS = (CARDS_FAILING, DRIVER_GPU_LOST)
"""Every justification an escalation may carry, in the order they are tried."""

TAINT_KEY = "gpuhealth.io/node-escalated"
"""The node taint (value: the justification, effect NoSchedule). Not `nvidia.com/gpu`: GPU pods
commonly tolerate that key (the device plugin's own taint convention), so it would keep nothing
off. No pod of a tenant tolerates this one; gpuhealth's holders and checks tolerate it."""
TAINT_EFFECT = "NoSchedule"
"""Keeps new work off; running work stays (the per-device moves judge it)."""
ANNOTATION = "gpuhealth.io/node-escalation"
"""The escalation's record on the Node (JSON): justification, evidence, since, at."""
GPU_LOST_TAINT = "gpu.nvidia.com/gpu-lost"
"""The NVIDIA DRA driver's taint of a device when NVML reports a GPU lost (every device of the node)."""
AUTOMATIC_ACTOR = "alert/"


@dataclass(frozen=True, slots=True)
class EscalationSettings:
    enabled: bool = field(default=True, metadata=yaml_keys.key("escalation.enabled", yaml_keys.flag))
    """Escalate a node at all (off: every failure stays the cards' own)."""
    cards: int = field(default=3, metadata=yaml_keys.key("escalation.cards", yaml_keys.whole(2)))
    """Cards of one node failing together that make the failure the node's. 3 of 8: two cards of
    a node failing at once happen by chance on a large fleet; three rarely do."""
    window_seconds: float = field(
        default=600.0, metadata=yaml_keys.key("escalation.window", yaml_keys.duration)
    )
    """How close together their quarantines start: a fabric, a switch or a driver takes its cards
    within minutes; the breaker's window, so one storm is judged over one span."""
    lost_cards: int = field(default=2, metadata=yaml_keys.key("escalation.lost_cards", yaml_keys.whole(2)))
    """Cards under quarantine that, with the driver's gpu-lost taint on every device, make the node
    lost. At least 2: the taint is node-wide even for one lost card."""

    def __post_init__(self) -> None:
        for name in ("cards", "lost_cards"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(
                    f"{name} must be a whole number >= 2 (one card never escalates), not {value!r}"
                )
        if not 0 < self.window_seconds < math.inf:
            raise ValueError(f"window_seconds must be finite and above zero, not {self.window_seconds!r}")


@dataclass(frozen=True, slots=True)
class Failing:
    """One card of the node under an automatic quarantine: the evidence of an escalation."""

    device: str
    since: float
    """When its current quarantine was enforced."""
    reason: str

    def evidence(self) -> str:
        return f"{self.device} {self.reason} since {rfc3339(self.since)}"


@dataclass(frozen=True, slots=True)
class Escalation:
    node: str
    justification: str
    """One of `JUSTIFICATIONS`."""
    evidence: tuple[str, ...]
    """What held: one line per card (`<device> <reason> since <time>`), the driver's taints."""
    since: float
    """When the justification first held (the card that completed it)."""

    def annotation(self, at: float) -> str:
        """The Node annotation's value: the justification, its evidence, and when it was acted on."""
        body = {
            "justification": self.justification,
            "evidence": list(self.evidence),
            "since": rfc3339(self.since),
            "at": rfc3339(at),
        }
        return json.dumps(body, sort_keys=True)


def failing_cards(records: Iterable[Quarantine], node: str) -> list[Failing]:
    """The node's cards under an automatic, enforced quarantine not yet on the release ladder,
    oldest first."""
    out = []
    for r in records:
        if r.spec.node != node or r.spec.action != "quarantine" or r.status.phase != Phase.QUARANTINED:
            continue
        if not r.spec.actor.startswith(AUTOMATIC_ACTOR):
            continue
        starts = quarantine_starts(r)
        if starts:
            out.append(Failing(r.spec.device, starts[-1], r.spec.reason))
    return sorted(out, key=lambda f: (f.since, f.device))


def together(failing: Sequence[Failing], cards: int, window: float) -> tuple[Failing, ...] | None:
    """The first `cards` cards (by start) whose starts fall within `window`; None when no such set."""
    ordered = sorted(failing, key=lambda f: (f.since, f.device))
    for i in range(len(ordered) - cards + 1):
        group = ordered[i : i + cards]
        if group[-1].since - group[0].since <= window:
            return tuple(group)
    return None


def justify(
    node: str,
    records: Iterable[Quarantine],
    slice_devices: Iterable[SliceDevice] = (),
    *,
    now: float,
    settings: EscalationSettings,
) -> Escalation | None:
    """The justification that holds for escalating `node` now, with its evidence; None: none does."""
    if not settings.enabled:
        return None
    failing = [f for f in failing_cards(records, node) if f.since <= now]
    group = together(failing, settings.cards, settings.window_seconds)
    if group is not None:
        return Escalation(node, CARDS_FAILING, tuple(f.evidence() for f in group), group[-1].since)
    whole = [d for d in slice_devices if d.node == node and not d.parent]
    if (
        whole
        and len(failing) >= settings.lost_cards
        and all(any(t.key == GPU_LOST_TAINT for t in d.taints) for d in whole)
    ):
        lines = [f.evidence() for f in failing]
        lines.append(f"{GPU_LOST_TAINT} on all {len(whole)} devices of the node's ResourceSlices")
        return Escalation(node, DRIVER_GPU_LOST, tuple(lines), failing[settings.lost_cards - 1].since)
    return None


def read_annotation(node: Mapping[str, Any]) -> Escalation | None:
    """The escalation a Node carries (its taint; the annotation's justification and evidence);
    None when it carries no taint of ours. A taint without a readable annotation is still ours:
    its value names the justification, the evidence is lost."""
    taints = (node.get("spec") or {}).get("taints") or ()
    ours = [t for t in taints if isinstance(t, dict) and t.get("key") == TAINT_KEY]
    if not ours:
        return None
    meta = node.get("metadata") or {}
    name = str(meta.get("name") or "")
    text = (meta.get("annotations") or {}).get(ANNOTATION)
    try:
        body = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    since = parse_rfc3339(str(body.get("since") or ""))
    evidence = body.get("evidence")
    return Escalation(
        name,
        str(body.get("justification") or ours[0].get("value") or ""),
        tuple(str(e) for e in evidence) if isinstance(evidence, list) else (),
        since if since is not None else 0.0,
    )


def acted_at(node: Mapping[str, Any]) -> float | None:
    """When the Node's escalation was made (the annotation's `at`); None when not known."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    try:
        body = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return parse_rfc3339(str(body.get("at") or "")) if isinstance(body, dict) else None


def node_gpus(node: Mapping[str, Any] | None, slice_devices: Iterable[SliceDevice], name: str) -> int:
    """How many GPUs the node has: its device plugin's capacity or its slices' whole GPUs."""
    capacity = ((node or {}).get("status") or {}).get("capacity") or {}
    try:
        plugin = int(str(capacity.get("nvidia.com/gpu") or 0))
    except ValueError:
        plugin = 0
    slices = {d.uuid or d.device for d in slice_devices if d.node == name and not d.parent}
    return max(plugin, len(slices))


def admit(
    gpus: int,
    state: BreakerState,
    counts: Counts,
    bucket: Bucket,
    *,
    now: float,
    settings: BreakerSettings,
) -> tuple[str, Bucket]:
    """May an escalation taking `gpus` more GPUs out of new work go ahead? ("" when it may, else
    why not; the bucket after). The node counts as its GPUs: against the breaker's rate and
    capacity limits and the new-quarantine bucket. Refused, the breaker is not tripped by it (the
    cards' own quarantines stand; the escalation is asked again each pass)."""
    if state.tripped:
        return "BreakerOpen", bucket
    if counts.eligible is None or counts.eligible > 0:
        eligible = counts.eligible or 0
        rate = breaker.rate_limit(settings, eligible)
        if counts.started_in_window + gpus > rate:
            return f"BreakerRate: {counts.started_in_window} + {gpus} would exceed {rate}", bucket
        capacity = breaker.capacity_limit(settings, eligible)
        if counts.quarantined + gpus > capacity:
            return f"BreakerCapacity: {counts.quarantined} + {gpus} would exceed {capacity}", bucket
    current = bucket.at(now)
    if current.tokens < gpus:
        return f"RateLimited: {gpus} tokens wanted, {current.tokens:.1f} left", current
    taken = current
    for _ in range(gpus):
        _, taken = taken.take(now)
    return "", taken
