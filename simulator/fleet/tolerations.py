"""Taints and tolerations, pure: whether a toleration matches a taint, and for how long it tolerates.

Shared by the taint eviction controllers (`taint_manager`): node taints against pod tolerations
and device taints against a ResourceClaim request's tolerations follow the same rules.
"""

from __future__ import annotations

from typing import Any


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """An empty key with operator Exists matches every taint; an empty effect matches every effect."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return (toleration.get("value") or "") == (taint.get("value") or "")


def toleration_seconds(tolerations: list[dict[str, Any]], taints: list[dict[str, Any]]) -> float | None:
    """How long `taints` are tolerated: 0 when one is not, None for ever, else the shortest bound."""
    shortest: float | None = None
    for taint in taints:
        matching = [t for t in tolerations if tolerates(t, taint)]
        if not matching:
            return 0.0
        bounds = [float(t["tolerationSeconds"]) for t in matching if t.get("tolerationSeconds") is not None]
        if len(bounds) < len(matching):
            continue  # one matching toleration has no bound: this taint is tolerated for ever
        bound = max(0.0, min(bounds)) if bounds else None
        if bound is not None:
            shortest = bound if shortest is None else min(shortest, bound)
    return shortest
