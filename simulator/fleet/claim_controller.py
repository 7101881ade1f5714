"""The resource claim controller (kube-controller-manager) for the pods clients create.

For a pod whose `spec.resourceClaims` names a ResourceClaimTemplate it creates the claim
`<pod>-<claim>-<suffix>` from the template (owned by the pod, annotated
`resource.kubernetes.io/pod-claim-name`) and records it in the pod's
`status.resourceClaimStatuses`. When such a pod is gone it ends the pod's reservations
(`reservedFor`) and deallocates a claim no one reserves any more; claims generated for the
pod are deleted with it (the garbage collector's part). The scenario's own pods keep their
claims' life in the job controller.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from simulator.apiserver.errors import ApiError
from simulator.fleet import objects

if TYPE_CHECKING:
    from simulator.apiserver.store import Store

_CLAIMS = "resourceclaims.resource.k8s.io"
_TEMPLATES = "resourceclaimtemplates.resource.k8s.io"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


class TemplateMissing(LookupError):
    """The pod names a template that does not exist (yet): the pod waits."""


class ResourceClaimController:
    """Generates claims from templates and lets go of them when their pod is gone."""

    def __init__(self, store: Store, rng: random.Random, fleet_pod: Callable[[str], bool]) -> None:
        self._store = store
        self._rng = rng
        self._fleet_pod = fleet_pod

    def claim_for(self, pod_obj: dict[str, Any], pod_claim: str, template: str) -> dict[str, Any]:
        """Create the claim for `pod_claim` from `template`; the claim as stored."""
        meta = pod_obj["metadata"]
        namespace, pod_name = meta["namespace"], meta["name"]
        try:
            tmpl = self._store.get(_TEMPLATES, template, namespace)
        except ApiError as exc:
            raise TemplateMissing(f'resourceclaimtemplate "{template}" not found') from exc
        tmeta = tmpl.get("metadata") or {}
        name = f"{pod_name}-{pod_claim}-{objects.suffix(self._rng)}"
        labels = dict(tmeta.get("labels") or {})
        claim: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": name,
                "namespace": namespace,
                **({"labels": labels} if labels else {}),
                "annotations": {**(tmeta.get("annotations") or {}), POD_CLAIM_ANNOTATION: pod_claim},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": meta.get("uid", ""),
                     "controller": True, "blockOwnerDeletion": True}
                ],
            },
            "spec": (tmpl.get("spec") or {}).get("spec") or {},
        }  # fmt: skip
        created = self._store.create(_CLAIMS, claim, namespace=namespace, validate=False)

        def record(obj: dict[str, Any]) -> dict[str, Any]:
            status = obj.setdefault("status", {})
            kept = [s for s in status.get("resourceClaimStatuses") or () if s.get("name") != pod_claim]
            status["resourceClaimStatuses"] = [*kept, {"name": pod_claim, "resourceClaimName": name}]
            return obj

        self._store.mutate("pods", pod_name, namespace, record, subresource="status")
        return created

    def pod_gone(self, pod_obj: dict[str, Any], claims: Callable[[str, str], dict[str, Any] | None]) -> None:
        """A client's pod was deleted; `claims(namespace, name)` reads a claim as last seen."""
        meta = pod_obj.get("metadata") or {}
        namespace, uid = meta.get("namespace", ""), meta.get("uid")
        if self._fleet_pod(f"{namespace}/{meta.get('name')}"):
            return  # the scenario's own pods: the job controller removes their claims
        names = {
            s.get("resourceClaimName")
            for s in (pod_obj.get("status") or {}).get("resourceClaimStatuses") or ()
            if isinstance(s, dict)
        }
        names |= {c.get("resourceClaimName") for c in (pod_obj.get("spec") or {}).get("resourceClaims") or ()}
        for name in sorted(str(n) for n in names if n):
            claim = claims(namespace, name)
            if claim is None:
                continue
            owners = claim["metadata"].get("ownerReferences") or ()
            if any(o.get("uid") == uid and o.get("controller") for o in owners):
                with contextlib.suppress(ApiError):
                    self._store.delete(_CLAIMS, name, namespace)
                continue

            def release(obj: dict[str, Any]) -> dict[str, Any]:
                status = obj.setdefault("status", {})
                status["reservedFor"] = [r for r in status.get("reservedFor") or () if r.get("uid") != uid]
                if not status["reservedFor"]:
                    status.pop("reservedFor")
                    status.pop("allocation", None)
                return obj

            with contextlib.suppress(ApiError):
                self._store.mutate(_CLAIMS, name, namespace, release, subresource="status")
