"""Deletion with dependents, as the apiserver prepares it for the garbage collector and the
namespace controller (both in `simulator/fleet/`): pure decisions over plain data.

- `propagationPolicy` (DeleteOptions body or query) or the older `orphanDependents`: `Orphan`
  adds the `orphan` finalizer, `Foreground` the `foregroundDeletion` one; `Background` (and no
  policy) deletes at once and leaves the dependents to the garbage collector. Without a policy,
  ReplicationControllers and batch/v1 Jobs orphan their dependents, as the real defaults keep
  for compatibility.
- A namespace with `spec.finalizers` (`kubernetes`, set on create) is not removed by a delete:
  it turns `Terminating` until the namespace controller has emptied it; creating anything in it
  meanwhile is 403 Forbidden.

`decide_delete` is the whole of what a DELETE does to an object, graceful pod deletion
included; the store only carries out its answer.

These finalizers are only added while the controllers that remove them run
(`Store.finalizing_controllers`, set by the fleet): a bare store (API tests without a fleet)
deletes at once, as it always did, instead of leaving objects no one will finalize.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from simulator.apiserver import graceful
from simulator.apiserver.errors import ApiError, invalid
from simulator.apiserver.stored import format_timestamp

ORPHAN = "orphan"
FOREGROUND = "foregroundDeletion"
NAMESPACE_FINALIZER = "kubernetes"
POLICIES = ("Foreground", "Background", "Orphan")
_ORPHAN_BY_DEFAULT = ("replicationcontrollers", "jobs.batch")


def deletion_policy(options: Mapping[str, Any], query: Mapping[str, str]) -> str | None:
    """The propagation policy a delete asks for (None: the resource's default); 422 when malformed."""
    policy = options.get("propagationPolicy") or query.get("propagationPolicy")
    orphan = options.get("orphanDependents")
    if orphan is None and query.get("orphanDependents") is not None:
        orphan = query.get("orphanDependents") == "true"
    if policy is not None and orphan is not None:
        raise invalid(
            "DeleteOptions",
            "",
            "",
            [
                (
                    "propagationPolicy",
                    "Invalid value: orphanDependents and deletionPropagation cannot be both set",
                )
            ],
        )
    if policy is not None and policy not in POLICIES:
        raise invalid(
            "DeleteOptions",
            "",
            "",
            [
                (
                    "propagationPolicy",
                    f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan"',
                )
            ],
        )
    if orphan is not None:
        return "Orphan" if orphan else "Background"
    return str(policy) if policy is not None else None


def deletion_finalizer(resource: str, policy: str | None) -> str | None:
    """The garbage collector's finalizer a delete adds to the object (None: delete at once)."""
    if policy is None:
        policy = "Orphan" if resource in _ORPHAN_BY_DEFAULT else "Background"
    return {"Orphan": ORPHAN, "Foreground": FOREGROUND}.get(policy)


def decide_delete(
    resource: str,
    obj: dict[str, Any],
    *,
    now: float,
    grace_period_seconds: int | None,
    policy: str | None,
    pod_runs: Callable[[dict[str, Any]], bool] | None,
    finalizing_controllers: bool,
) -> tuple[graceful.Action, dict[str, Any]]:
    """What a DELETE does to `obj` (a private copy): "remove" it, leave it "unchanged", or store
    the returned object, "terminating" (a deletionTimestamp set, finalizers or a grace period
    holding it; for a namespace its Terminating phase).

    A pod a simulated kubelet runs (`pod_runs`) is deleted gracefully (`graceful`); while the
    finalizing controllers run, a namespace turns Terminating and other objects get the
    finalizer of the propagation `policy`."""
    if resource == "pods" and pod_runs is not None:
        action, obj = graceful.delete_pod(obj, grace_period_seconds, now, pod_runs)
        if action != "remove":
            return action, obj
    meta = obj["metadata"]
    if finalizing_controllers and not meta.get("deletionTimestamp"):
        if resource == "namespaces" and (obj.get("spec") or {}).get("finalizers"):
            # The namespace controller empties it, then removes the finalizer and the namespace.
            meta["deletionTimestamp"] = format_timestamp(now)
            obj["status"] = {**(obj.get("status") or {}), "phase": "Terminating"}
            return "terminating", obj
        finalizer = deletion_finalizer(resource, policy)
        if finalizer is not None and finalizer not in (meta.get("finalizers") or ()):
            meta["finalizers"] = [*(meta.get("finalizers") or ()), finalizer]
    if meta.get("finalizers"):
        if meta.get("deletionTimestamp"):
            return "unchanged", obj
        meta["deletionTimestamp"] = format_timestamp(now)
        meta["deletionGracePeriodSeconds"] = 0
        return "terminating", obj
    return "remove", obj


def namespace_terminating(kind_plural: str, group: str, name: str, namespace: str) -> ApiError:
    """403 for a create in a namespace being deleted, worded as the namespace lifecycle admission does."""
    qualified = f"{kind_plural}.{group}" if group else kind_plural
    message = f"unable to create new content in namespace {namespace} because it is being terminated"
    details: dict[str, Any] = {
        "name": name,
        "kind": kind_plural,
        "causes": [{"reason": "NamespaceTerminating", "message": message, "field": "metadata.namespace"}],
    }
    if group:
        details["group"] = group
    return ApiError(403, "Forbidden", f'{qualified} "{name}" is forbidden: {message}', details=details)
