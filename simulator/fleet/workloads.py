"""What the workload controllers share, as pure functions over plain dicts: owner references,
pods from templates, pod states (active, ready, available) and the fleet-managed marker.

The scenario's own workloads are laid out and replaced by the fleet (`job_controller`,
`scheduler`: deterministic placement on usable devices). Their Deployments, ReplicaSets and
Jobs exist in the API, so owner references resolve and garbage collection keeps them, but they
carry `MANAGED_BY_FLEET`: the API controllers keep those objects' status and never create or
delete their pods, so two controllers never fight over one workload.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from typing import Any

from gpuhealth.kube.meta import parse_rfc3339
from simulator.fleet.objects import MANAGED_BY_FLEET

__all__ = ["MANAGED_BY_FLEET"]

POD_TEMPLATE_HASH = "pod-template-hash"


def fleet_managed(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(MANAGED_BY_FLEET) == "true"


def owner_reference(owner: dict[str, Any], *, block: bool = True) -> dict[str, Any]:
    """The controller reference a controller sets on what it creates."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": block,
    }


def controller_ref(obj: dict[str, Any]) -> dict[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None


def controlled_by(obj: dict[str, Any], owner_uid: str) -> bool:
    ref = controller_ref(obj)
    return ref is not None and ref.get("uid") == owner_uid


def pod_from_template(
    template: dict[str, Any],
    owner: dict[str, Any],
    *,
    name: str | None = None,
    generate_name: str | None = None,
    extra_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Pod as a controller creates it: template labels, annotations and spec, owned, unbound, Pending."""
    tmeta = template.get("metadata") or {}
    meta: dict[str, Any] = {
        "namespace": owner["metadata"]["namespace"],
        "labels": {**(tmeta.get("labels") or {}), **(extra_labels or {})},
        "ownerReferences": [owner_reference(owner)],
    }
    if tmeta.get("annotations"):
        meta["annotations"] = dict(tmeta["annotations"])
    if tmeta.get("finalizers"):
        meta["finalizers"] = list(tmeta["finalizers"])
    if name is not None:
        meta["name"] = name
    else:
        meta["generateName"] = generate_name
    spec = copy.deepcopy(template.get("spec") or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        # What a create through the API stores: the scheduler and the kubelet take it from here.
        "status": {"phase": "Pending"},
    }


def phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def terminating(obj: dict[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def is_active(pod: dict[str, Any]) -> bool:
    """Counts toward a ReplicaSet's replicas: not terminal, not being deleted."""
    return phase(pod) not in ("Succeeded", "Failed") and not terminating(pod)


def ready_since(pod: dict[str, Any]) -> str | None:
    """The Ready condition's lastTransitionTime when the pod is Ready ("" when it has none), else None."""
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return str(cond.get("lastTransitionTime") or "") if cond.get("status") == "True" else None
    return None


def is_ready(pod: dict[str, Any]) -> bool:
    return ready_since(pod) is not None


def template_hash(template: dict[str, Any], collisions: int = 0) -> str:
    """A stable pod-template-hash for a template (10 characters of the controllers' alphabet)."""
    meta = dict(template.get("metadata") or {})
    labels = dict(meta.get("labels") or {})
    labels.pop(POD_TEMPLATE_HASH, None)
    meta["labels"] = labels
    text = json.dumps({**template, "metadata": meta}, sort_keys=True) + f"/{collisions}"
    digest = hashlib.sha256(text.encode()).digest()
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(alphabet[b % len(alphabet)] for b in digest[:10])


def same_template(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal pod templates, ignoring the pod-template-hash label a ReplicaSet's copy carries."""
    return template_hash(a) == template_hash(b)


def scaled(value: Any, total: int, *, round_up: bool) -> int:
    """An IntOrString (count or percentage) against `total`."""
    if isinstance(value, str) and value.endswith("%"):
        exact = int(value[:-1]) * total / 100
        return int(-(-exact // 1)) if round_up else int(exact // 1)
    return int(value)


@functools.lru_cache(maxsize=4096)  # second-precision stamps repeat: parsing is the slow part
def parse_time(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 timestamp (`parse_rfc3339`); None if unreadable."""
    return parse_rfc3339(text)
