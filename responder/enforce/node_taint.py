"""The node escalation's executor: the Node's taint, label and annotation, nothing else.

Thin: the decision is `responder.reconcile.escalation`'s. Escalating a node writes, in one
conditional update of the Node (read-modify-write at its resourceVersion, `retry_on_conflict`):
- the taint `gpuhealth.io/node-escalated=<justification>:NoSchedule`, which keeps new pods off
  unless they tolerate it (no tenant's pod does; gpuhealth's holders tolerate every taint and its
  checks tolerate this one). Never a cordon (`spec.unschedulable`), never NoExecute: running
  work is the per-device moves' to judge, and the node stays Ready;
- the label `gpuhealth.io/node-escalated=<justification>`, so that a pass finds every escalated
  node with one list (a node whose cards' records all ended is still found and lifted);
- the annotation `gpuhealth.io/node-escalation`: the justification, its evidence, when it first
  held and when it was acted on (JSON). The Node is the escalation's record: it survives a
  restart and a change of leader, and the next pass judges it again from the records.
Lifting removes the three; taints and annotations of others are kept as they are. Each
escalation and lift is also told as a core/v1 Event on the Node (in `default`, where kubectl
looks for a cluster-scoped object's: `kubectl describe node` lists it), best effort: the Node's
annotation is the durable account.
"""

from __future__ import annotations

import json
from typing import Any

from gpuhealth.kube.api import Api
from gpuhealth.kube.conflicts import retry_on_conflict
from gpuhealth.kube.errors import Conflict
from gpuhealth.kube.events import EVENT, core_event
from gpuhealth.kube.resources import NODE
from responder.enforce.observed import Observed
from responder.reconcile.escalation import ANNOTATION, TAINT_EFFECT, TAINT_KEY, Escalation

LABEL = TAINT_KEY
"""The label that lists escalated nodes (value: the justification)."""
EVENT_NAMESPACE = "default"
"""Where Events of a cluster-scoped object go (kubectl looks there)."""
COMPONENT = "gpuhealth-responder"


class NodeTaint:
    def __init__(self, client: Api) -> None:
        self._client = client

    def escalated(self, page_size: int = 500) -> list[dict[str, Any]]:
        """Every Node that carries gpuhealth's escalation label (one list)."""
        return list(self._client.list(NODE, label_selector=LABEL, page_size=page_size).items)

    def escalate(self, escalation: Escalation, at: float, seen: Observed | None = None) -> None:
        """Taint, label and annotate the node with `escalation` (idempotent)."""
        taint = {"key": TAINT_KEY, "value": escalation.justification, "effect": TAINT_EFFECT}
        self._edit(escalation.node, taint, escalation.justification, escalation.annotation(at), seen)

    def lift(self, node: str, seen: Observed | None = None) -> None:
        """Remove the taint, label and annotation (idempotent; a node gone is lifted)."""
        self._edit(node, None, None, None, seen)

    def tell(self, node: str, reason: str, message: str, *, warning: bool, now: float) -> None:
        """An Event on the Node (`NodeEscalated`, `NodeEscalationLifted`)."""
        involved = {"apiVersion": "v1", "kind": "Node", "name": node}
        body = core_event(
            involved=involved,
            namespace=EVENT_NAMESPACE,
            reason=reason,
            message=message,
            warning=warning,
            now=now,
            component=COMPONENT,
            generate_name=f"{node[:236]}.",
        )
        self._client.create(EVENT, body, namespace=EVENT_NAMESPACE)

    def _edit(
        self,
        name: str,
        taint: dict[str, str] | None,
        label: str | None,
        annotation: str | None,
        seen: Observed | None,
    ) -> None:
        reads = seen or Observed(self._client)

        def attempt() -> None:
            node = reads.get(NODE, name)
            if node is None:
                return  # a node gone carries nothing
            meta = node.get("metadata") or {}
            spec = node.get("spec") or {}
            before = list(spec.get("taints") or ())
            taints = [t for t in before if not (isinstance(t, dict) and t.get("key") == TAINT_KEY)]
            labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != LABEL}
            annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != ANNOTATION}
            if taint is not None:
                # In its place when it stands, so that an unchanged node is not written.
                at = next(
                    (i for i, t in enumerate(before) if isinstance(t, dict) and t.get("key") == TAINT_KEY),
                    None,
                )
                taints.insert(len(taints) if at is None or at > len(taints) else at, taint)
            if label is not None:
                labels[LABEL] = label
            if annotation is not None:
                # An escalation already recorded keeps its first `at`: a pass that finds it
                # standing does not rewrite when it was acted on.
                annotations[ANNOTATION] = (meta.get("annotations") or {}).get(ANNOTATION) or annotation
                if _justification(annotations[ANNOTATION]) != label:
                    annotations[ANNOTATION] = annotation
            if (
                taints == before
                and labels == (meta.get("labels") or {})
                and annotations == (meta.get("annotations") or {})
            ):
                return
            changed = {
                **node,
                "metadata": {**meta, "labels": labels, "annotations": annotations},
                "spec": {**spec, "taints": taints},
            }
            try:
                reads.wrote(NODE, name, self._client.update(NODE, changed))
            except Conflict:
                reads.reread(NODE, name)
                raise

        retry_on_conflict(attempt, what=f"Node {name}")


def _justification(text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return ""
    return str(body.get("justification") or "") if isinstance(body, dict) else ""
