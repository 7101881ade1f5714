"""PodDisruptionBudget arithmetic, as pure functions over plain dicts: the disruption
controller's status and the eviction subresource's verdict.

One computation serves both writers of a PDB's status: the disruption controller
(`simulator/fleet/disruption_controller.py`, after every pod or budget change) and the eviction
subresource (`Store.evict`, which recomputes before it decides, so a store without a running
fleet still judges from a true status). They follow policy/v1 as the real components do:

- healthy pods: Ready=True, not being deleted, and not in `disruptedPods` for less than two
  minutes (an evicted pod whose deletion has not been observed yet);
- expected pods: an integer `minAvailable` counts the selected pods present; every other form
  (percentages, `maxUnavailable`) takes the scale of the pods' controllers (a ReplicaSet owned
  by a Deployment counts the Deployment's `spec.replicas`), so an evicted pod keeps counting
  until its replacement is Ready. Pods without a controller are ignored there; a controller
  that cannot be found fails the sync (`SyncFailed`, no disruption allowed);
- percentages round up, for `minAvailable` and `maxUnavailable` alike;
- the eviction of a pod that is Pending, terminal or being deleted ignores budgets; a Running
  pod that is not Ready may go when the budget is met (`IfHealthyBudget`, the default) or
  always (`AlwaysAllow`); any other eviction needs `disruptionsAllowed >= 1` and records the pod
  in `disruptedPods` with the eviction time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuhealth.kube.meta import parse_rfc3339

DELETION_TIMEOUT_SECONDS = 120.0
"""How long an evicted pod stays in `disruptedPods` (not counted healthy) before the controller drops it."""

MAX_DISRUPTED_PODS = 2000
"""The eviction subresource refuses more unconfirmed evictions than this per budget."""

CONDITION = "DisruptionAllowed"

ControllerGet = Callable[[str, str, str], dict[str, Any] | None]
"""`get(resource, namespace, name)`: a stored object or None; how the scale of pods' controllers is read."""

_SCALE_RESOURCES = {
    ("apps", "ReplicaSet"): "replicasets.apps",
    ("apps", "StatefulSet"): "statefulsets.apps",
    ("", "ReplicationController"): "replicationcontrollers",
}


class SyncFailed(ValueError):
    """The budget cannot be computed (malformed spec, a controller not found)."""


def pod_is_ready(pod: dict[str, Any]) -> bool:
    return any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def pod_is_healthy(pod: dict[str, Any]) -> bool:
    """Ready and not being deleted (disruptedPods aside)."""
    return not (pod.get("metadata") or {}).get("deletionTimestamp") and pod_is_ready(pod)


def controller_ref(obj: dict[str, Any]) -> dict[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None


def _group(api_version: str) -> str:
    return api_version.split("/", 1)[0] if "/" in api_version else ""


def scaled_value(value: Any, total: int, *, round_up: bool = True) -> int:
    """An IntOrString budget value against `total` pods; SyncFailed when malformed."""
    if isinstance(value, bool):
        raise SyncFailed(f"invalid value for IntOrString: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.endswith("%"):
        try:
            pct = int(value[:-1])
        except ValueError:
            raise SyncFailed(
                "invalid value for IntOrString: invalid type: string is not a percentage"
            ) from None
        exact = pct * total / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    raise SyncFailed("invalid value for IntOrString: invalid type: string is not a percentage")


def expected_scale(namespace: str, pods: list[dict[str, Any]], get: ControllerGet) -> int:
    """Sum of the scales of the selected pods' controllers, each counted once."""
    scales: dict[str, int] = {}
    for pod in pods:
        ref = controller_ref(pod)
        if ref is None:
            continue  # an unmanaged pod: ignored, as the real controller does (it warns)
        uid = str(ref.get("uid") or "")
        if uid in scales:
            continue
        scale = _controller_scale(namespace, ref, get)
        if scale is None:
            name = (pod.get("metadata") or {}).get("name")
            raise SyncFailed(f"found no controllers for pod {name!r}")
        scales[uid] = scale
    return sum(scales.values())


def _controller_scale(namespace: str, ref: dict[str, Any], get: ControllerGet) -> int | None:
    resource = _SCALE_RESOURCES.get((_group(str(ref.get("apiVersion") or "")), str(ref.get("kind"))))
    if resource is None:
        return None
    owner = get(resource, namespace, str(ref.get("name")))
    if owner is None or (owner.get("metadata") or {}).get("uid") != ref.get("uid"):
        return None
    if resource == "replicasets.apps":
        parent = controller_ref(owner)
        if parent is not None and parent.get("kind") == "Deployment":
            deployment = get("deployments.apps", namespace, str(parent.get("name")))
            if deployment is not None and (deployment.get("metadata") or {}).get("uid") == parent.get("uid"):
                return int((deployment.get("spec") or {}).get("replicas", 1))
    return int((owner.get("spec") or {}).get("replicas", 1))


@dataclass(frozen=True)
class Budget:
    """The computed counts of one PDB."""

    expected_pods: int
    current_healthy: int
    desired_healthy: int

    @property
    def disruptions_allowed(self) -> int:
        return max(0, self.current_healthy - self.desired_healthy)


def compute_budget(
    pdb: dict[str, Any],
    pods: list[dict[str, Any]],
    get: ControllerGet,
    disrupted: dict[str, float] | None = None,
    now: float = 0.0,
) -> Budget:
    """The budget of `pdb` over the pods its selector matches; SyncFailed on what cannot be computed.

    `disrupted` maps pod names to their eviction time (seconds); such a pod does not count as
    healthy until `DELETION_TIMEOUT_SECONDS` have passed.
    """
    spec = pdb.get("spec") or {}
    namespace = str((pdb.get("metadata") or {}).get("namespace") or "")
    disrupted = disrupted or {}
    healthy = sum(
        1
        for p in pods
        if pod_is_healthy(p)
        and not (
            p["metadata"]["name"] in disrupted
            and disrupted[p["metadata"]["name"]] + DELETION_TIMEOUT_SECONDS > now
        )
    )
    if spec.get("maxUnavailable") is not None:
        expected = expected_scale(namespace, pods, get)
        desired = max(0, expected - scaled_value(spec["maxUnavailable"], expected))
    elif isinstance(spec.get("minAvailable"), int) and not isinstance(spec.get("minAvailable"), bool):
        expected = len(pods)
        desired = int(spec["minAvailable"])
    elif spec.get("minAvailable") is not None:
        expected = expected_scale(namespace, pods, get)
        desired = scaled_value(spec["minAvailable"], expected)
    else:
        expected, desired = 0, 0
    return Budget(expected, healthy, desired)


def disrupted_pods(pdb: dict[str, Any], pods: list[dict[str, Any]], now: float) -> dict[str, float]:
    """`status.disruptedPods` still worth keeping: pods present, not yet being deleted, not timed out."""
    recorded = (pdb.get("status") or {}).get("disruptedPods") or {}
    present = {
        p["metadata"]["name"]: p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")
    }
    out: dict[str, float] = {}
    for name, stamp in recorded.items() if isinstance(recorded, dict) else ():
        at = parse_rfc3339(str(stamp))
        if name in present and at is not None and at + DELETION_TIMEOUT_SECONDS > now:
            out[name] = at
    return out


def compute_status(
    pdb: dict[str, Any],
    pods: list[dict[str, Any]],
    get: ControllerGet,
    now: float,
    format_time: Callable[[float], str],
) -> dict[str, Any]:
    """The whole `status` the disruption controller writes for `pdb` at wall time `now`."""
    old = pdb.get("status") or {}
    generation = int((pdb.get("metadata") or {}).get("generation") or 1)
    disrupted = disrupted_pods(pdb, pods, now)
    status: dict[str, Any] = {"observedGeneration": generation}
    if disrupted:
        status["disruptedPods"] = {name: format_time(at) for name, at in sorted(disrupted.items())}
    try:
        budget = compute_budget(pdb, pods, get, disrupted, now)
    except SyncFailed as exc:
        status.update(
            {
                "disruptionsAllowed": 0,
                "currentHealthy": int(old.get("currentHealthy") or 0),
                "desiredHealthy": int(old.get("desiredHealthy") or 0),
                "expectedPods": int(old.get("expectedPods") or 0),
            }
        )
        condition = ("False", "SyncFailed", str(exc))
    else:
        status.update(
            {
                "disruptionsAllowed": budget.disruptions_allowed,
                "currentHealthy": budget.current_healthy,
                "desiredHealthy": budget.desired_healthy,
                "expectedPods": budget.expected_pods,
            }
        )
        condition = (
            ("True", "SufficientPods", "")
            if budget.disruptions_allowed > 0
            else ("False", "InsufficientPods", "")
        )
    status["conditions"] = [_condition(old, condition, generation, format_time(now))]
    return status


def _condition(
    old: dict[str, Any], condition: tuple[str, str, str], generation: int, ts: str
) -> dict[str, Any]:
    state, reason, message = condition
    previous = next(
        (c for c in old.get("conditions") or () if isinstance(c, dict) and c.get("type") == CONDITION), None
    )
    since = ts
    if previous is not None and previous.get("status") == state and previous.get("lastTransitionTime"):
        since = previous["lastTransitionTime"]
    return {
        "type": CONDITION,
        "status": state,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    }


@dataclass(frozen=True)
class Verdict:
    """What the eviction subresource does with one pod under one budget."""

    allowed: bool
    record: bool = False
    """Count the eviction against the budget: disruptionsAllowed - 1, the pod into disruptedPods."""
    code: int = 201
    message: str = ""
    cause: str = ""


TOO_MANY = "Cannot evict pod as it would violate the pod's disruption budget."


def ignores_budgets(pod: dict[str, Any]) -> bool:
    """Pods the eviction subresource deletes without looking at budgets."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return True
    return (pod.get("status") or {}).get("phase") in ("Pending", "Succeeded", "Failed")


def eviction_verdict(pdb: dict[str, Any], pod: dict[str, Any]) -> Verdict:
    """Decide from `pdb`'s (just computed) status whether `pod` may be evicted."""
    status = pdb.get("status") or {}
    name = (pdb.get("metadata") or {}).get("name")
    if ignores_budgets(pod):
        return Verdict(True)
    if not pod_is_ready(pod):
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
        current, desired = int(status.get("currentHealthy") or 0), int(status.get("desiredHealthy") or 0)
        if policy == "AlwaysAllow" or (current >= desired and desired > 0):
            return Verdict(True)
    if int((pdb.get("metadata") or {}).get("generation") or 1) > int(status.get("observedGeneration") or 0):
        return Verdict(
            False,
            code=429,
            message=TOO_MANY,
            cause=f"The disruption budget {name} is still being processed by the server.",
        )
    allowed = int(status.get("disruptionsAllowed") or 0)
    if allowed < 0:
        return Verdict(False, code=403, message="pdb disruptions allowed is negative")
    if len(status.get("disruptedPods") or {}) > MAX_DISRUPTED_PODS:
        return Verdict(
            False,
            code=403,
            message="DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        )
    if allowed == 0:
        return Verdict(
            False,
            code=429,
            message=TOO_MANY,
            cause=(
                f"The disruption budget {name} needs {int(status.get('desiredHealthy') or 0)} healthy pods "
                f"and has {int(status.get('currentHealthy') or 0)} currently"
            ),
        )
    return Verdict(True, record=True)


def record_eviction(status: dict[str, Any], pod_name: str, stamp: str) -> dict[str, Any]:
    """The status after one eviction is counted against the budget."""
    out = dict(status)
    out["disruptionsAllowed"] = int(status.get("disruptionsAllowed") or 0) - 1
    out["disruptedPods"] = {**(status.get("disruptedPods") or {}), pod_name: stamp}
    if out["disruptionsAllowed"] <= 0:
        # The eviction spends the last allowed disruption: the condition says so at once.
        generation = int(status.get("observedGeneration") or 1)
        out["conditions"] = [_condition(status, ("False", "InsufficientPods", ""), generation, stamp)]
    return out
