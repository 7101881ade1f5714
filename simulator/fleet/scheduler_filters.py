"""The scheduler's node filters and scores, pure: a pod and a node in, a verdict out.

`PodInfo` and `NodeInfo` are what the filters read, parsed once from the API objects;
`filter_node` runs the default profile's filters in kube-scheduler's order (NodeUnschedulable,
TaintToleration, NodeAffinity, NodeResourcesFit) and returns the reasons a node fails, worded
as kube-scheduler words them, so `failed_scheduling_message` can aggregate them into its
"0/N nodes are available: ..." line, which `mark_unschedulable` puts in the pod's PodScheduled
condition. `score_node` is least-allocated over the resources the pod asks for. No store, no
clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
KEEPS_AWAY = ("NoSchedule", "NoExecute")
OUR_SCHEDULERS = ("", "default-scheduler")

REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_TOO_MANY_PODS = "Too many pods"

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[kMGTPE]i?|Ki|m|n|u)?$")
_SUFFIX = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


class QuantityError(ValueError):
    pass


def milli(value: Any) -> int:
    """A resource quantity (`"500m"`, `"32Gi"`, `4`) in thousandths, rounded up as the API does."""
    if isinstance(value, bool):
        raise QuantityError(f"quantities must match the regular expression: {value!r}")
    if isinstance(value, int):
        return value * 1000
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"quantities must match the regular expression: {text!r}")
    try:
        number = Fraction(match.group(1))
    except ValueError as exc:
        raise QuantityError(f"quantities must match the regular expression: {text!r}") from exc
    unit = match.group(2) or ""
    exponent = unit[:1] in ("e", "E") and len(unit) > 1
    scale = Fraction(10) ** int(unit[1:]) if exponent else _SUFFIX[unit]
    return math.ceil(number * scale * 1000)


def _resources(block: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    if isinstance(block, dict):
        for name, value in block.items():
            out[str(name)] = milli(value)
    return out


def _container_requests(container: dict[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    # The apiserver defaults a request to its limit where only the limit is given.
    out = _resources(resources.get("limits"))
    out.update(_resources(resources.get("requests")))
    return out


def pod_requests(spec: dict[str, Any]) -> dict[str, int]:
    """What a pod asks of its node, in thousandths: its containers' sum, at least its largest
    init container, plus the runtime class overhead."""
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, value in _container_requests(container).items():
            total[name] = total.get(name, 0) + value
    for container in spec.get("initContainers") or []:
        for name, value in _container_requests(container).items():
            total[name] = max(total.get(name, 0), value)
    for name, value in _resources(spec.get("overhead")).items():
        total[name] = total.get(name, 0) + value
    return total


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pending pod as the filters read it."""

    namespace: str
    name: str
    uid: str
    requests: Mapping[str, int]
    tolerations: tuple[dict[str, Any], ...]
    node_selector: Mapping[str, str]
    required_terms: tuple[dict[str, Any], ...] | None
    """requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms; None when absent."""
    claims: tuple[dict[str, Any], ...]
    """spec.resourceClaims."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_info(obj: dict[str, Any]) -> PodInfo:
    """Parse a pod; `QuantityError` for a request that is not a quantity."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    terms = None if affinity is None else tuple(affinity.get("nodeSelectorTerms") or ())
    return PodInfo(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        requests=pod_requests(spec),
        tolerations=tuple(t for t in spec.get("tolerations") or () if isinstance(t, dict)),
        node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
        required_terms=terms,
        claims=tuple(c for c in spec.get("resourceClaims") or () if isinstance(c, dict)),
    )


@dataclass(slots=True)
class NodeInfo:
    """A node as the filters read it, with what its bound pods request (kept by the scheduler)."""

    name: str
    labels: dict[str, str]
    taints: tuple[dict[str, Any], ...]
    unschedulable: bool
    allocatable: dict[str, int]
    requested: dict[str, int] = field(default_factory=dict)
    pods: int = 0

    def free(self, resource: str) -> int:
        return self.allocatable.get(resource, 0) - self.requested.get(resource, 0)

    def signature(self) -> tuple[Any, ...]:
        """What scheduling depends on; equal signatures need no retry of unschedulable pods."""
        return (
            tuple(sorted(self.labels.items())),
            repr(self.taints),
            self.unschedulable,
            tuple(sorted(self.allocatable.items())),
        )


def node_info(obj: dict[str, Any]) -> NodeInfo:
    """Parse a node. A Ready condition that is not True counts as the not-ready/unreachable
    NoSchedule taint when the node lifecycle controller has not written it (yet)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    taints = [t for t in spec.get("taints") or () if isinstance(t, dict)]
    for cond in status.get("conditions") or ():
        if cond.get("type") != "Ready" or cond.get("status") == "True":
            continue
        key = UNREACHABLE_TAINT if cond.get("status") == "Unknown" else NOT_READY_TAINT
        if not any(t.get("key") == key and t.get("effect") == "NoSchedule" for t in taints):
            taints.append({"key": key, "effect": "NoSchedule"})
    allocatable: dict[str, int] = {}
    for name, value in (status.get("allocatable") or {}).items():
        try:
            allocatable[str(name)] = milli(value)
        except QuantityError:
            continue  # the kubelet's business; an unreadable figure offers nothing
    return NodeInfo(
        name=meta.get("name", ""),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        taints=tuple(taints),
        unschedulable=bool(spec.get("unschedulable")),
        allocatable=allocatable,
    )


# ---------------------------------------------------------------------------- taints and tolerations


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """One toleration against one taint (node or device): effect, key, operator Equal/Exists."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    key = toleration.get("key") or ""
    if operator == "Exists":
        return not key or key == taint.get("key")
    if operator != "Equal":
        return False
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated(
    taints: Iterable[Mapping[str, Any]], tolerations: Iterable[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The first NoSchedule/NoExecute taint no toleration matches."""
    tolerations = tuple(tolerations)
    for taint in taints:
        if taint.get("effect") not in KEEPS_AWAY:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def taint_reason(taint: Mapping[str, Any]) -> str:
    return f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value', '')}}}"


# ---------------------------------------------------------------------------- node affinity


def _requirement_matches(req: Mapping[str, Any], value: str | None) -> bool:
    operator = req.get("operator")
    values = [str(v) for v in req.get("values") or ()]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def term_matches(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    """One nodeSelectorTerm: its expressions and fields all hold; an empty term matches nothing."""
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False
    for req in expressions:
        if not _requirement_matches(req, labels.get(str(req.get("key")))):
            return False
    for req in fields:
        value = name if req.get("key") == "metadata.name" else None
        if not _requirement_matches(req, value):
            return False
    return True


def selector_matches(terms: Iterable[Mapping[str, Any]], name: str, labels: Mapping[str, str]) -> bool:
    """A NodeSelector: any of its terms."""
    return any(term_matches(t, name, labels) for t in terms)


def affinity_matches(pod: PodInfo, node: NodeInfo) -> bool:
    for key, value in pod.node_selector.items():
        if node.labels.get(key) != value:
            return False
    return pod.required_terms is None or selector_matches(pod.required_terms, node.name, node.labels)


# ---------------------------------------------------------------------------- the filters


def fit_reasons(pod: PodInfo, node: NodeInfo, ignored: frozenset[str] = frozenset()) -> list[str]:
    """NodeResourcesFit: one `Insufficient <resource>` per resource the node lacks."""
    reasons = []
    if node.pods + 1 > node.allocatable.get("pods", 110_000) // 1000:
        reasons.append(REASON_TOO_MANY_PODS)
    for resource, amount in pod.requests.items():
        if amount <= 0 or resource in ignored:
            continue
        if node.free(resource) < amount:
            reasons.append(f"Insufficient {resource}")
    return reasons


def filter_node(pod: PodInfo, node: NodeInfo, ignored: frozenset[str] = frozenset()) -> list[str]:
    """Why `pod` cannot go to `node` (empty: it can), the first failing filter's reasons."""
    if node.unschedulable and not any(
        tolerates(t, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}) for t in pod.tolerations
    ):
        return [REASON_UNSCHEDULABLE]
    if node.taints:
        taint = untolerated(node.taints, pod.tolerations)
        if taint is not None:
            return [taint_reason(taint)]
    if (pod.node_selector or pod.required_terms is not None) and not affinity_matches(pod, node):
        return [REASON_AFFINITY]
    return fit_reasons(pod, node, ignored)


def score_node(pod: PodInfo, node: NodeInfo) -> int:
    """Least allocated (0-100) over cpu, memory and the other resources the pod requests."""
    resources = {"cpu", "memory", *(r for r, v in pod.requests.items() if v > 0 and r != "pods")}
    total = 0
    counted = 0
    for resource in resources:
        capacity = node.allocatable.get(resource, 0)
        if capacity <= 0:
            continue
        used = node.requested.get(resource, 0) + pod.requests.get(resource, 0)
        total += max(0, capacity - used) * 100 // capacity
        counted += 1
    return total // counted if counted else 0


def feasible_nodes_to_find(total: int) -> int:
    """How many feasible nodes to look for before scoring (kube-scheduler's adaptive percentage)."""
    if total < 100:
        return total
    percentage = max(5, 50 - total // 125)
    return max(100, total * percentage // 100)


def preemption_could_help(reasons: Iterable[str]) -> bool:
    """Whether removing pods could make the node fit (its reasons are all about resources)."""
    reasons = tuple(reasons)
    return bool(reasons) and all(r.startswith("Insufficient ") or r == REASON_TOO_MANY_PODS for r in reasons)


def failed_scheduling_message(total: int, reasons: Mapping[str, int], resolvable: int) -> str:
    """`0/N nodes are available: <count> <reason>, ...` (sorted) and the preemption verdict, as
    kube-scheduler writes them; `resolvable` nodes lack only resources (no victims here, since
    the simulated scheduler does not preempt), the others preemption cannot help."""
    parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
    text = f"0/{total} nodes are available"
    text += f": {', '.join(parts)}." if parts else "."
    verdicts = []
    if resolvable:
        verdicts.append(f"{resolvable} No preemption victims found for incoming pod")
    if total - resolvable:
        verdicts.append(f"{total - resolvable} Preemption is not helpful for scheduling")
    text += f" preemption: 0/{total} nodes are available: {', '.join(sorted(verdicts))}."
    return text


def mark_unschedulable(pod_obj: dict[str, Any], message: str, ts: str) -> dict[str, Any] | None:
    """The pod with PodScheduled=False/Unschedulable saying `message` (at `ts` when it changes);
    None when it already says so."""
    status = pod_obj.setdefault("status", {})
    status.setdefault("phase", "Pending")
    conditions = status.setdefault("conditions", [])
    for cond in conditions:
        if cond.get("type") == "PodScheduled":
            if cond.get("status") == "False" and cond.get("message") == message:
                return None
            if cond.get("status") != "False":
                cond["lastTransitionTime"] = ts
            cond.update(status="False", reason="Unschedulable", message=message)
            cond.setdefault("lastTransitionTime", ts)
            return pod_obj
    conditions.append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
         "lastProbeTime": None, "lastTransitionTime": ts}
    )  # fmt: skip
    return pod_obj
