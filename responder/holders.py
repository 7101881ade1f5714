"""Which pods hold a device: the one reading of it that migration and release share.

An adapter over the API, read-only. Device-plugin pods on the record's node hold the device
when their `allocatedResourcesStatus` names it (`<uuid>`, or a time-sliced replica
`<uuid>::<n>`); DRA pods when one of their ResourceClaims is allocated driver/pool/device.
The migrator moves the jobs of these pods; the reconciler starts no probe while one of them
(other than gpuhealth's own checks) still holds the device, since a probe or canary cannot get
a device a running pod holds, and its timeout would count as the device's failure.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpuhealth.kube.resources import POD, RESOURCE_CLAIM, Resource
from responder.records import DRA, Quarantine

CHECK_LABEL = "gpuhealth.io/check"
"""Label of the pods of gpuhealth's own probe and canary Jobs (`responder.checks`)."""


class Client(Protocol):
    def list(
        self, resource: Resource, *, namespace: str | None = ..., field_selector: str | None = ...
    ) -> Any: ...


def pods_on_device(client: Client, record: Quarantine) -> list[dict[str, Any]]:
    """Every pod on the record's node that holds its device (finished or not)."""
    spec = record.spec
    node_pods = client.list(POD, field_selector=f"spec.nodeName={spec.node}").items
    if spec.path == DRA:
        held = _dra_holders(client, record)
        return [p for p in node_pods if _dra_pod_holds(p, held)]
    device = spec.uuid or spec.device
    return [p for p in node_pods if _plugin_pod_holds(p, device)]


class DeviceHolders:
    """`of(record)`: the pods (`namespace/name`) that still hold the record's device."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def of(self, record: Quarantine) -> tuple[str, ...]:
        held = []
        for pod in pods_on_device(self._client, record):
            meta = _meta(pod)
            if CHECK_LABEL in (meta.get("labels") or {}):
                continue  # gpuhealth's own probe or canary: it is meant to hold the device
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue  # a finished pod's containers no longer use the device
            held.append(f"{meta.get('namespace') or ''}/{meta.get('name') or ''}")
        return tuple(sorted(held))


def _dra_holders(client: Client, record: Quarantine) -> set[tuple[str, str]]:
    """(namespace, claim name) and (namespace, pod uid) of claims allocated the device."""
    spec = record.spec
    wanted = (spec.driver, spec.pool, spec.device_name)
    held: set[tuple[str, str]] = set()
    for claim in client.list(RESOURCE_CLAIM).items:
        allocation = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        results = allocation.get("results") or []
        if not any(
            isinstance(r, dict) and (r.get("driver"), r.get("pool"), r.get("device")) == wanted
            for r in results
        ):
            continue
        meta = _meta(claim)
        namespace = str(meta.get("namespace") or "")
        held.add((namespace, "claim:" + str(meta.get("name"))))
        for consumer in (claim.get("status") or {}).get("reservedFor") or []:
            if isinstance(consumer, dict) and consumer.get("resource") == "pods":
                held.add((namespace, "pod:" + str(consumer.get("uid"))))
    return held


def _plugin_pod_holds(pod: dict[str, Any], device: str) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        for entry in (status or {}).get("allocatedResourcesStatus") or []:
            for resource in (entry or {}).get("resources") or []:
                rid = str((resource or {}).get("resourceID") or "")
                # Time-sliced replicas of one GPU are advertised as `<uuid>::<n>`.
                if rid == device or rid.startswith(device + "::"):
                    return True
    return False


def _dra_pod_holds(pod: dict[str, Any], held: set[tuple[str, str]]) -> bool:
    meta = _meta(pod)
    namespace = str(meta.get("namespace") or "")
    if (namespace, "pod:" + str(meta.get("uid"))) in held:
        return True
    names = [s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []]
    names += [c.get("resourceClaimName") for c in (pod.get("spec") or {}).get("resourceClaims") or []]
    return any((namespace, f"claim:{n}") in held for n in names if n)


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}
