"""Each pass's node escalations: judge every node with failing cards, escalate or lift.

An executor over the pure rule (`responder.reconcile.escalation`) and the Node's taint
(`responder.enforce.node_taint`). The reconciler calls it once per pass, after every record is
decided, with the pass's breaker state, counts and bucket: the nodes judged are those with an
active record and those already escalated (one labelled list, so a node whose records all ended
is still lifted). Per node: a justification that holds and no escalation yet is admitted under
the breaker and the bucket (the node counts as the GPUs it takes out beyond its failing cards),
then written; one that stands is left (its first record kept); none holding lifts it. A node
opted out of remediation (`gpuhealth.io/remediation=disabled`) is never escalated. One node's
failure is logged and never stops the others or the pass: the next pass judges it again.

`load` is what standing escalations weigh on the guardrails of the next pass (and of a new
leader): each escalated node's GPUs beyond its failing cards, from when it was escalated.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry

from gpuhealth import instruments
from gpuhealth.kube.resources import NODE
from gpuhealth.kube.slices import SliceDevice
from responder import metrics
from responder.enforce.node_taint import NodeTaint
from responder.enforce.observed import Observed
from responder.reconcile.breaker import BreakerSettings, BreakerState, Counts
from responder.reconcile.escalation import (
    JUSTIFICATIONS,
    EscalationSettings,
    acted_at,
    admit,
    failing_cards,
    justify,
    node_gpus,
    read_annotation,
)
from responder.reconcile.limits import Bucket
from responder.records import ACTIVE_PHASES, Quarantine

log = logging.getLogger(__name__)


class Escalator:
    def __init__(
        self,
        taints: NodeTaint,
        settings: EscalationSettings,
        breaker: BreakerSettings,
        registry: CollectorRegistry,
        *,
        opted_out: Callable[[dict[str, Any]], bool],
        dry_run: bool = False,
    ) -> None:
        """`opted_out`: whether a Node is opted out of remediation (its label). `dry_run`: decide
        and log, write nothing."""
        self._taints = taints
        self.settings = settings
        self._breaker = breaker
        self._opted_out = opted_out
        self._dry_run = dry_run
        self.escalations = instruments.counter(metrics.NODE_ESCALATIONS, registry)
        self.escalated = instruments.gauge(metrics.NODES_ESCALATED, registry)
        for justification in JUSTIFICATIONS:
            self.escalations.labels(justification)
        self._series: set[tuple[str, str]] = set()
        self._refused: dict[str, str] = {}
        """Node -> why its escalation was last refused (BreakerOpen, RateLimited, ...): logged once
        per change, not every pass."""
        self._decided: set[str] = set()
        """A dry run's escalated nodes (nothing is written to read them back from)."""

    def standing(self, page_size: int) -> dict[str, dict[str, Any]]:
        """The escalated Nodes by name (one list)."""
        return {
            str((n.get("metadata") or {}).get("name") or ""): n for n in self._taints.escalated(page_size)
        }

    def load(
        self, standing: dict[str, dict[str, Any]], records: Sequence[Quarantine], seen: Observed
    ) -> list[tuple[float, int]]:
        """(when escalated, GPUs beyond its failing cards) of each standing escalation."""
        out = []
        by_node = _by_node(records)
        slices = _slices_by_node(seen.slices)
        for name, node in standing.items():
            at = acted_at(node)
            extra = node_gpus(node, slices.get(name, ()), name) - len(
                failing_cards(by_node.get(name, []), name)
            )
            if at is not None and extra > 0:
                out.append((at, extra))
        return out

    def pass_over(
        self,
        records: Sequence[Quarantine],
        standing: dict[str, dict[str, Any]],
        seen: Observed,
        *,
        state: BreakerState,
        counts: Counts,
        bucket: Bucket,
        now: float,
        fence: threading.Event,
    ) -> Bucket:
        """Escalate or lift every node with an active record or a standing escalation; the bucket after."""
        # Each node judged on its own records: a pass over 10,000 records and a thousand nodes
        # must not walk every record for every node.
        by_node = _by_node(records)
        slices = _slices_by_node(seen.slices)
        active = {r.spec.node for r in records if r.status.phase in ACTIVE_PHASES}
        series: set[tuple[str, str]] = set()
        for name in sorted(active | standing.keys()):
            mine = by_node.get(name, [])
            if fence.is_set():
                return bucket
            try:
                node = standing.get(name) or seen.get(NODE, name)
                current = read_annotation(node) if node is not None else None
                wanted = None
                if node is not None and not self._opted_out(node):
                    wanted = justify(name, mine, slices.get(name, ()), now=now, settings=self.settings)
                if wanted is None:
                    self._decided.discard(name)
                    if current is not None:
                        log.warning(
                            "node %s: escalation %s lifted: it no longer holds", name, current.justification
                        )
                        if not self._dry_run:
                            self._taints.lift(name, seen)
                            self._tell(
                                name,
                                "NodeEscalationLifted",
                                f"{current.justification} no longer holds: the node takes new GPU work again",
                                warning=False,
                                now=now,
                            )
                    continue
                if current is None and self._dry_run and name in self._decided:
                    series.add((name, wanted.justification))  # a dry run's escalation, counted once
                    continue
                if current is None:
                    extra = max(
                        0, node_gpus(node, slices.get(name, ()), name) - len(failing_cards(mine, name))
                    )
                    why, bucket = admit(extra, state, counts, bucket, now=now, settings=self._breaker)
                    if why:
                        if self._refused.get(name) != why.split(":")[0]:
                            log.warning(
                                "node %s: %s holds, escalation held back: %s", name, wanted.justification, why
                            )
                        self._refused[name] = why.split(":")[0]
                        continue
                    counts = replace(
                        counts,
                        quarantined=counts.quarantined + extra,
                        started_in_window=counts.started_in_window + extra,
                    )
                    log.warning(
                        "node %s escalated (%s): %s", name, wanted.justification, "; ".join(wanted.evidence)
                    )
                    self.escalations.labels(wanted.justification).inc()
                self._refused.pop(name, None)
                if self._dry_run:
                    self._decided.add(name)
                else:
                    self._taints.escalate(wanted, now, seen)
                    if current is None:
                        self._tell(
                            name,
                            "NodeEscalated",
                            f"{wanted.justification}: no new GPU work ({'; '.join(wanted.evidence)})",
                            warning=True,
                            now=now,
                        )
                series.add((name, wanted.justification))
            except Exception as exc:  # one node's failure never stops the others: judged again next pass
                log.warning("node %s: escalation not judged: %s", name, exc)
        for gone in self._series - series:
            self.escalated.remove(*gone)
        for labels in series:
            self.escalated.labels(*labels).set(1)
        self._series = series
        return bucket

    def _tell(self, node: str, reason: str, message: str, *, warning: bool, now: float) -> None:
        """Best effort: the Node's annotation is the durable account, an Event is for people."""
        try:
            self._taints.tell(node, reason, message, warning=warning, now=now)
        except Exception as exc:
            log.warning("node %s: event %s not recorded: %s", node, reason, exc)

    def clear(self) -> None:
        for gone in self._series:
            self.escalated.remove(*gone)
        self._series = set()


def _by_node(records: Sequence[Quarantine]) -> dict[str, list[Quarantine]]:
    out: dict[str, list[Quarantine]] = {}
    for r in records:
        out.setdefault(r.spec.node, []).append(r)
    return out


def _slices_by_node(devices: Iterable[SliceDevice]) -> dict[str, list[SliceDevice]]:
    out: dict[str, list[SliceDevice]] = {}
    for d in devices:
        out.setdefault(d.node, []).append(d)
    return out
