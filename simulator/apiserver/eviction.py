"""The pods/eviction subresource: delete a pod unless its PodDisruptionBudget forbids it.

`evict(store, ...)` works through the store's own API (reads, `mutate` of the budget's status,
`delete`), as the real eviction REST handler works through the registry: the budget's status is
recomputed first (as the disruption controller would write it), the verdict taken from it
(`disruption.eviction_verdict`: 429 with a DisruptionBudget cause when no disruption is
allowed), and an eviction counted against the budget recorded in `disruptedPods`, so a second
eviction before the replacement is Ready is refused. A dry run decides and answers, writing
nothing. The arithmetic is `disruption.py` (pure); this module is its executor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator.apiserver import disruption
from simulator.apiserver.errors import ApiError, bad_request, invalid
from simulator.apiserver.selectors import selector_from_label_selector_object
from simulator.apiserver.stored import Entry, format_timestamp

if TYPE_CHECKING:
    from simulator.apiserver.store import Store

PDBS = "poddisruptionbudgets.policy"


def evict(
    store: Store, name: str, namespace: str, body: dict[str, Any] | None = None, *, dry_run: bool = False
) -> dict[str, Any]:
    """Evict the pod (`Store.evict`); `deleteOptions.dryRun: ["All"]` in the body is a dry run too."""
    pod = store.get("pods", name, namespace)
    if body is not None and not isinstance(body, dict):
        raise bad_request("the eviction body must be a JSON object")
    options = (body or {}).get("deleteOptions") or {}
    if not isinstance(options, dict):
        raise bad_request("deleteOptions must be an object")
    flags = options.get("dryRun") or []
    if not isinstance(flags, list) or any(f != "All" for f in flags):
        raise invalid("Eviction", "policy", name, [("deleteOptions.dryRun", f"Unsupported value: {flags!r}")])
    dry_run = dry_run or bool(flags)
    labels = (pod["metadata"].get("labels")) or {}
    matching: list[tuple[Entry, dict[str, Any]]] = []
    budgets, _ = store.list_entries(PDBS, namespace)
    for entry in budgets:
        pdb = entry.load()
        selector = (pdb.get("spec") or {}).get("selector")
        if selector is None:
            continue  # policy/v1: a null selector selects no pods
        if selector_from_label_selector_object(selector).matches(labels):
            matching.append((entry, pdb))
    if len(matching) > 1:
        raise ApiError(
            500,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, "
            "which the eviction subresource does not support.",
        )
    if matching and not disruption.ignores_budgets(pod):
        entry, pdb = matching[0]
        pdb["status"] = record_budget(store, entry, pdb, dry_run=dry_run)
        verdict = disruption.eviction_verdict(pdb, pod)
        if not verdict.allowed:
            if verdict.code == 429:
                raise ApiError(
                    429,
                    "TooManyRequests",
                    verdict.message,
                    details={"causes": [{"reason": "DisruptionBudget", "message": verdict.cause}]},
                )
            raise ApiError(verdict.code, "Forbidden", verdict.message)
        if verdict.record and not dry_run:
            counted = disruption.record_eviction(pdb["status"], name, format_timestamp(store.clock.now()))

            def spend(obj: dict[str, Any]) -> None:
                obj["status"] = counted

            store.mutate(PDBS, entry.name, entry.namespace, spend, subresource="status")
    grace = options.get("gracePeriodSeconds")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int)):
        raise bad_request(f"deleteOptions.gracePeriodSeconds must be an integer, got {grace!r}")
    if not dry_run:
        store.delete("pods", name, namespace, grace_period_seconds=grace)
        for listener in list(store.eviction_listeners):
            listener(pod)
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def record_budget(
    store: Store, entry: Entry, pdb: dict[str, Any], *, dry_run: bool = False
) -> dict[str, Any]:
    """Recompute the PDB's status from the pods and their controllers; write it when it changed."""
    selector = (pdb.get("spec") or {}).get("selector")
    pods: list[dict[str, Any]] = []
    if selector is not None:
        selected, _ = store.list_entries(
            "pods", entry.namespace, label_selector=selector_from_label_selector_object(selector)
        )
        pods = [p.load() for p in selected]

    def get_or_none(resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return store.get(resource, name, namespace)
        except ApiError:
            return None

    status = disruption.compute_status(pdb, pods, get_or_none, store.clock.now(), format_timestamp)
    if status != (pdb.get("status") or {}) and not dry_run:

        def apply(obj: dict[str, Any]) -> None:
            obj["status"] = status

        store.mutate(PDBS, entry.name, entry.namespace, apply, subresource="status")
    return status


__all__ = ["evict", "record_budget"]
