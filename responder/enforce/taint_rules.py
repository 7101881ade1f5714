"""The DRA backend: a quarantine is a `DeviceTaintRule` (an executor over the API).

Thin and idempotent: `responder.reconcile.policy` decides `Enforce`/`Unenforce`; this makes the cluster
say so. One rule per record, named like the record and owned by it (owner reference: deleting
the record deletes the rule), selecting the device by driver, pool and device name. Created,
its taint updated (quarantine -> canary on the ramp, back on a failure), deleted on release. A
rule of that name that the record does not own is never modified (`NotOurs`). The version is
the one the cluster serves (`discover`).

A device is this backend's when one of the cluster's ResourceSlices publishes it on the
record's node (by its `uuid` attribute, or by driver/pool/device), whatever the alert carried.
The pods that hold it are those whose ResourceClaims are allocated it; a check's pod gets it
through a ResourceClaimTemplate of the check's name whose one request selects the device by
its `uuid` attribute (CEL) and tolerates the quarantine and canary taints (the rule keeps
every other claim off it). This is what a real cluster runs too.

A MIG card on DRA (the NVIDIA DRA driver publishes its MIG devices, not the card; the record's
`partitions` are their names) is quarantined as all of them: a DeviceTaintRule's selector names
one driver, pool and device (no CEL, no attribute), so one rule per MIG device, each named
`<record>-<i>` (`i` its place among the partitions) and owned by the record; its holders are
the pods allocated any of them; a check's claim asks for all of them (`allocationMode: All`,
selected by their `parentUUID`, through the driver's MIG DeviceClass `mig.nvidia.com`), so the
check runs on the whole card.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from gpuhealth.kube.api import Api
from gpuhealth.kube.conflicts import retry_on_conflict
from gpuhealth.kube.errors import Conflict, NotFound
from gpuhealth.kube.resources import RESOURCE_CLAIM, Resource
from responder.enforce.backends import DeviceRequest, Evidence
from responder.enforce.identity import Identity, resolve_slice
from responder.enforce.observed import Observed
from responder.ladder import CANARY_TAINT, QUARANTINE_TAINT
from responder.reconcile.policy import Enforce
from responder.records import KIND, Quarantine, owner_reference

TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
"""Served versions of DeviceTaintRule, newest first (1.37, 1.36 behind a gate, 1.35)."""
CLAIM_TEMPLATE = Resource("resource.k8s.io", "v1", "resourceclaimtemplates", namespaced=True)
DRA = "dra"
"""This backend's `spec.path`: devices a ResourceSlice publishes."""
DEVICE_CLASS = "gpu.nvidia.com"
"""DeviceClass of the DRA driver's GPUs (NVIDIA's DRA driver names its class so)."""
MIG_DEVICE_CLASS = "mig.nvidia.com"
"""DeviceClass of the NVIDIA DRA driver's MIG devices (its chart installs it beside the GPUs')."""
CLAIM = "gpu"
"""The check pod's claim (and its request)."""
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuhealth"}


class NotOurs(RuntimeError):
    """Something gpuhealth does not own stands where its enforcement would go: left alone."""


class NotServed(RuntimeError):
    """The cluster serves no DeviceTaintRule version: DRA devices cannot be quarantined."""


def discover(client: Api) -> Resource | None:
    """The DeviceTaintRule resource in the newest version the cluster serves; None if none."""
    served = client.served_versions("resource.k8s.io", "devicetaintrules")
    for version in TAINT_RULE_VERSIONS:
        if version in served:
            return Resource("resource.k8s.io", version, "devicetaintrules", namespaced=False)
    return None


class TaintRules:
    path = DRA
    holds_card = False
    """The scheduler allocates DRA devices: a DeviceTaintRule keeps new claims off, no card hold."""

    def __init__(
        self,
        client: Api,
        taint_rules: Resource | None,
        *,
        device_class: str = DEVICE_CLASS,
        mig_device_class: str = MIG_DEVICE_CLASS,
    ) -> None:
        self._client = client
        self._rules = taint_rules
        self.listed: tuple[Resource, ...] = (taint_rules,) if taint_rules is not None else ()
        """Every DeviceTaintRule is listed once per pass: presence is read from the list, not
        one GET per record (`responder.enforce.observed`)."""
        self.device_class = device_class
        self.mig_device_class = mig_device_class

    def identify(self, record: Quarantine, evidence: Evidence) -> Identity | None:
        return resolve_slice(record.spec, evidence.slices, self.path)

    def enforced_as(self, record: Quarantine) -> str:
        return f"DeviceTaintRule/{record.name}"

    def present(
        self, record: Quarantine, wanted: Enforce | None = None, seen: Observed | None = None
    ) -> bool:
        rules = self._rules_resource()
        reads = seen or Observed(self._client)
        for name, _ in rule_devices(record):
            rule = reads.get(rules, name)
            if rule is None or not owned(rule, record):
                return False
            if wanted is None:
                continue
            taint = (rule.get("spec") or {}).get("taint") or {}
            if (taint.get("key"), taint.get("value"), taint.get("effect")) != (
                wanted.taint_key,
                wanted.taint_value,
                wanted.effect,
            ):
                return False
        return True

    def enforce(self, record: Quarantine, effect: Enforce, seen: Observed | None = None) -> None:
        rules = self._rules_resource()
        reads = seen or Observed(self._client)
        taint = {"key": effect.taint_key, "value": effect.taint_value, "effect": effect.effect}
        for name, device in rule_devices(record):

            def attempt(name: str = name, device: str = device) -> None:
                current = reads.get(rules, name)
                try:
                    if current is None:
                        if not record.uid:
                            raise ValueError(f"{record.name}: the record has no uid to own its rule")
                        obj = self._rule_object(record, name, device, taint)
                        reads.wrote(rules, name, self._client.create(rules, obj))
                        return
                    if not owned(current, record):
                        raise NotOurs(
                            f"DeviceTaintRule {name} exists and is not owned by the record: left alone"
                        )
                    spec = current.get("spec") or {}
                    existing = spec.get("taint") or {}
                    if not all(existing.get(k) == v for k, v in taint.items()):
                        changed = {**current, "spec": {**spec, "taint": taint}}
                        reads.wrote(rules, name, self._client.update(rules, changed))
                except Conflict:
                    # Created or changed since the pass read it (another replica's executor, a
                    # person): the next attempt decides on it as it is now.
                    reads.reread(rules, name)
                    raise

            retry_on_conflict(attempt, what=f"DeviceTaintRule {name}")

    def lift(self, record: Quarantine, seen: Observed | None = None) -> None:
        rules = self._rules_resource()
        reads = seen or Observed(self._client)
        # The record's own name too: a card whose partitions became known after its first rule.
        names = dict.fromkeys([record.name, *(name for name, _ in rule_devices(record))])
        for name in names:
            rule = reads.get(rules, name)
            if rule is None:
                continue
            if not owned(rule, record):
                raise NotOurs(f"DeviceTaintRule {name} is not owned by the record: left alone")
            with contextlib.suppress(NotFound):  # gone meanwhile: what release wants
                self._client.delete(rules, name, uid=rule["metadata"]["uid"])
            reads.wrote(rules, name, None)

    def holders(self, record: Quarantine, node_pods: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        held = self._claimed(record)
        return [p for p in node_pods if _pod_holds(p, held)]

    def device_request(self, record: Quarantine, name: str, namespace: str) -> DeviceRequest:
        return DeviceRequest(
            container={"resources": {"claims": [{"name": CLAIM}]}},
            pod={"resourceClaims": [{"name": CLAIM, "resourceClaimTemplateName": name}]},
            objects=((CLAIM_TEMPLATE, self.claim_template(record, name, namespace)),),
        )

    # ----- the objects --------------------------------------------------------------------------

    def claim_template(self, record: Quarantine, name: str, namespace: str) -> dict[str, Any]:
        uuid = record.spec.uuid
        if not uuid:
            raise ValueError(
                f"{record.name}: a DRA record without spec.uuid cannot pin a check to its device"
            )
        domain = record.spec.driver or self.device_class
        tolerations = [
            {"key": key, "operator": "Exists", "effect": effect}
            for key in (QUARANTINE_TAINT, CANARY_TAINT)
            for effect in ("NoSchedule", "NoExecute")
        ]
        request: dict[str, Any]
        if record.spec.partitions:
            # A MIG card: every MIG device carved from it, so the check runs on the whole card.
            request = {
                "deviceClassName": self.mig_device_class,
                "allocationMode": "All",
                "selectors": [
                    {"cel": {"expression": f'device.attributes["{domain}"].parentUUID == "{uuid}"'}}
                ],
                "tolerations": tolerations,
            }
        else:
            request = {
                "deviceClassName": self.device_class,
                "count": 1,
                "selectors": [{"cel": {"expression": f'device.attributes["{domain}"].uuid == "{uuid}"'}}],
                "tolerations": tolerations,
            }
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": dict(MANAGED_BY),
                "ownerReferences": [owner_reference(record)],
            },
            "spec": {"spec": {"devices": {"requests": [{"name": CLAIM, "exactly": request}]}}},
        }

    def _rules_resource(self) -> Resource:
        if self._rules is None:
            raise NotServed(
                "this cluster serves no DeviceTaintRule version (resource.k8s.io v1, v1beta2, v1alpha3)"
            )
        return self._rules

    def _rule_object(
        self, record: Quarantine, name: str, device: str, taint: dict[str, str]
    ) -> dict[str, Any]:
        spec = record.spec
        selector = {"driver": spec.driver, "pool": spec.pool, "device": device}
        rules = self._rules_resource()
        return {
            "apiVersion": f"{rules.group}/{rules.version}",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": name,
                "labels": dict(MANAGED_BY),
                "annotations": {"gpuhealth.io/device": f"{spec.node}/{spec.device}"},
                "ownerReferences": [owner_reference(record)],
            },
            "spec": {"deviceSelector": {k: v for k, v in selector.items() if v}, "taint": taint},
        }

    def _claimed(self, record: Quarantine) -> set[tuple[str, str]]:
        """(namespace, claim name) and (namespace, pod uid) of claims allocated the device."""
        spec = record.spec
        wanted = {(spec.driver, spec.pool, device) for _, device in rule_devices(record)}
        held: set[tuple[str, str]] = set()
        for claim in self._client.list(RESOURCE_CLAIM).items:
            allocation = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
            results = allocation.get("results") or []
            if not any(
                isinstance(r, dict) and (r.get("driver"), r.get("pool"), r.get("device")) in wanted
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


def rule_devices(record: Quarantine) -> list[tuple[str, str]]:
    """(rule name, device name) of each DeviceTaintRule the record's quarantine is: one named like
    the record for a whole GPU, one per MIG device (`<record>-<i>`) for a MIG card."""
    if record.spec.partitions:
        return [(f"{record.name}-{i}", device) for i, device in enumerate(record.spec.partitions)]
    return [(record.name, record.spec.device_name)]


def owned(obj: dict[str, Any], record: Quarantine) -> bool:
    """Owned by this very record (its uid: a record deleted and made again is another owner)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(
        isinstance(r, dict)
        and r.get("kind") == KIND
        and r.get("name") == record.name
        and r.get("uid") == record.uid
        for r in refs
    )


def _pod_holds(pod: dict[str, Any], held: set[tuple[str, str]]) -> bool:
    meta = _meta(pod)
    namespace = str(meta.get("namespace") or "")
    if (namespace, "pod:" + str(meta.get("uid"))) in held:
        return True
    names = [s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []]
    names += [c.get("resourceClaimName") for c in (pod.get("spec") or {}).get("resourceClaims") or []]
    # The special claim of a pod whose nvidia.com/gpu a DRA DeviceClass serves (KEP-5004).
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    if isinstance(extended, dict):
        names.append(extended.get("resourceClaimName"))
    return any((namespace, f"claim:{n}") in held for n in names if n)


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}
