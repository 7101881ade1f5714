"""PodDisruptionBudget arithmetic for the eviction subresource, as pure functions over plain dicts.

Counting follows policy/v1: healthy pods are Running with condition Ready=True and not being
deleted; expected pods are the matching pods that are not terminal (Succeeded/Failed) nor being
deleted. Deviation: the real disruption controller takes expected pods from the owning
controller's scale, so an evicted pod still counts until its replacement appears; here expected
pods are the matching pods present now, so percentage and maxUnavailable budgets are computed
against the pods that remain (integer minAvailable budgets are unaffected).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def pod_is_healthy(pod: dict[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
        if isinstance(c, dict)
    )


def pod_is_expected(pod: dict[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _scaled(value: Any, total: int, *, round_up: bool) -> int:
    """An IntOrString budget value against `total` pods; ValueError when malformed."""
    if isinstance(value, bool):
        raise ValueError(f"invalid budget value {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        if value.endswith("%"):
            pct = int(value[:-1])
            exact = pct * total / 100
            return math.ceil(exact) if round_up else math.floor(exact)
        return int(value)
    raise ValueError(f"invalid budget value {value!r}")


@dataclass(frozen=True)
class Budget:
    """The computed state of one PDB (what goes into its status)."""

    expected_pods: int
    current_healthy: int
    desired_healthy: int

    @property
    def disruptions_allowed(self) -> int:
        return max(0, self.current_healthy - self.desired_healthy)

    def status(self, observed_generation: int) -> dict[str, Any]:
        return {
            "observedGeneration": observed_generation,
            "disruptionsAllowed": self.disruptions_allowed,
            "currentHealthy": self.current_healthy,
            "desiredHealthy": self.desired_healthy,
            "expectedPods": self.expected_pods,
        }


def compute_budget(pdb: dict[str, Any], pods: list[dict[str, Any]]) -> Budget:
    """The budget of `pdb` over the pods its selector matches; ValueError on a malformed spec."""
    spec = pdb.get("spec") or {}
    expected = sum(1 for p in pods if pod_is_expected(p))
    healthy = sum(1 for p in pods if pod_is_healthy(p))
    if spec.get("minAvailable") is not None:
        # minAvailable percentages round up (more pods must stay), like the disruption controller.
        desired = _scaled(spec["minAvailable"], expected, round_up=True)
    elif spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected, round_up=True))
    else:
        # Neither set: policy/v1 defaults to minAvailable=1.
        desired = 1 if expected else 0
    return Budget(expected, healthy, desired)


def eviction_allowed(pdb: dict[str, Any], pod: dict[str, Any], budget: Budget) -> bool:
    """Whether evicting `pod` keeps `pdb` satisfied.

    Pods that are not Running never count against a budget. A Running pod that is not Ready may
    go when the budget is currently met (unhealthyPodEvictionPolicy IfHealthyBudget, the default)
    or always (AlwaysAllow). A healthy pod needs one allowed disruption.
    """
    if (pod.get("status") or {}).get("phase") != "Running":
        return True
    if not pod_is_healthy(pod):
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
        return policy == "AlwaysAllow" or budget.current_healthy >= budget.desired_healthy
    return budget.disruptions_allowed >= 1
