"""Applies and removes a quarantine's enforcement in the cluster (an executor over the API).

Thin and idempotent: `responder.policy` decides `Enforce`/`Unenforce`; this makes the cluster
say so and reports whether ours is there (`present`). It only ever touches what gpuhealth
owns, and says when it finds something it does not own in the way:
- DRA: one `DeviceTaintRule` per record, named like the record and owned by it (owner
  reference: deleting the record deletes the rule), selecting the device by driver, pool and
  device name. Created, its taint updated (quarantine -> canary on the ramp, back on a
  failure), deleted on release. A rule of that name that the record does not own is never
  modified (`NotOurs`). The version is the one the cluster serves (`discover`).
- Device plugins: the node annotation `gpuhealth.io/quarantined-devices`, a JSON list of
  device IDs, edited by read-modify-write at the node's resourceVersion (409: read again).
  Nothing else on the node is touched: no taint, no cordon, no label.
Synchronous, like the client; the reconciler runs it in a thread.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Protocol

import orjson

from gpuhealth.kube.errors import Conflict, NotFound
from gpuhealth.kube.resources import NODE, Resource
from responder.policy import Enforce
from responder.records import API_VERSION, DRA, KIND, Quarantine

log = logging.getLogger(__name__)

NODE_ANNOTATION = "gpuhealth.io/quarantined-devices"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuhealth"}
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
"""Served versions of DeviceTaintRule, newest first (1.37, 1.36 behind a gate, 1.35)."""
MAX_ATTEMPTS = 5


class NotOurs(RuntimeError):
    """Something gpuhealth does not own stands where its enforcement would go: left alone."""


class NotServed(RuntimeError):
    """The cluster serves no DeviceTaintRule version: DRA devices cannot be quarantined."""


class Client(Protocol):
    def get(self, resource: Resource, name: str, *, namespace: str | None = ...) -> dict[str, Any]: ...

    def create(
        self, resource: Resource, obj: dict[str, Any], *, namespace: str | None = ...
    ) -> dict[str, Any]: ...

    def update(
        self, resource: Resource, obj: dict[str, Any], *, subresource: str | None = ...
    ) -> dict[str, Any]: ...

    def delete(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = ...,
        uid: str | None = ...,
        resource_version: str | None = ...,
    ) -> dict[str, Any]: ...

    def served_versions(self, group: str, plural: str) -> tuple[str, ...]: ...


def discover(client: Client) -> Resource | None:
    """The DeviceTaintRule resource in the newest version the cluster serves; None if none."""
    served = client.served_versions("resource.k8s.io", "devicetaintrules")
    for version in TAINT_RULE_VERSIONS:
        if version in served:
            return Resource("resource.k8s.io", version, "devicetaintrules", namespaced=False)
    return None


class Enforcer:
    def __init__(self, client: Client, taint_rules: Resource | None) -> None:
        self._client = client
        self._rules = taint_rules

    # ----- what the policy asks -----------------------------------------------------------------

    def present(self, record: Quarantine) -> bool:
        """Whether the enforcement gpuhealth owns for `record` exists (any taint key)."""
        if record.spec.path == DRA:
            rule = self._rule(record)
            return rule is not None and _owned(rule, record)
        return record.spec.device in _listed(self._node(record))

    def enforce(self, record: Quarantine, effect: Enforce) -> None:
        if record.spec.path == DRA:
            self._enforce_rule(record, effect)
        elif effect.effect != "None":  # dry-run on this path: nothing to preview with
            self._edit_annotation(record, add=True)

    def unenforce(self, record: Quarantine) -> None:
        if record.spec.path == DRA:
            rule = self._rule(record)
            if rule is None:
                return
            if not _owned(rule, record):
                raise NotOurs(f"DeviceTaintRule {record.name} is not owned by the record: left alone")
            with contextlib.suppress(NotFound):  # gone meanwhile: what release wants
                self._client.delete(self._rules_resource(), record.name, uid=rule["metadata"]["uid"])
        else:
            self._edit_annotation(record, add=False)

    # ----- DRA ----------------------------------------------------------------------------------

    def _rules_resource(self) -> Resource:
        if self._rules is None:
            raise NotServed(
                "this cluster serves no DeviceTaintRule version (resource.k8s.io v1, v1beta2, v1alpha3)"
            )
        return self._rules

    def _rule(self, record: Quarantine) -> dict[str, Any] | None:
        try:
            return self._client.get(self._rules_resource(), record.name)
        except NotFound:
            return None

    def _enforce_rule(self, record: Quarantine, effect: Enforce) -> None:
        rules = self._rules_resource()
        taint = {"key": effect.taint_key, "value": effect.taint_value, "effect": effect.effect}
        for _ in range(MAX_ATTEMPTS):
            current = self._rule(record)
            if current is None:
                if not record.uid:
                    raise ValueError(f"{record.name}: the record has no uid to own its rule")
                try:
                    self._client.create(rules, self._rule_object(record, taint))
                    return
                except Conflict:
                    continue  # created meanwhile (another replica's executor): read it
            if not _owned(current, record):
                raise NotOurs(
                    f"DeviceTaintRule {record.name} exists and is not owned by the record: left alone"
                )
            spec = current.get("spec") or {}
            existing = spec.get("taint") or {}
            if all(existing.get(k) == v for k, v in taint.items()):
                return
            updated = {**current, "spec": {**spec, "taint": taint}}
            try:
                self._client.update(rules, updated)
                return
            except Conflict:
                continue
        raise Conflict(f"DeviceTaintRule {record.name}: still conflicting after {MAX_ATTEMPTS} attempts")

    def _rule_object(self, record: Quarantine, taint: dict[str, str]) -> dict[str, Any]:
        spec = record.spec
        selector = {"driver": spec.driver, "pool": spec.pool, "device": spec.device_name}
        return {
            "apiVersion": f"{self._rules_resource().group}/{self._rules_resource().version}",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": record.name,
                "labels": dict(MANAGED_BY),
                "annotations": {"gpuhealth.io/device": f"{spec.node}/{spec.device}"},
                "ownerReferences": [
                    {
                        "apiVersion": API_VERSION,
                        "kind": KIND,
                        "name": record.name,
                        "uid": record.uid,
                        "controller": True,
                        "blockOwnerDeletion": False,
                    }
                ],
            },
            "spec": {"deviceSelector": {k: v for k, v in selector.items() if v}, "taint": taint},
        }

    # ----- device plugins -------------------------------------------------------------------------

    def _node(self, record: Quarantine) -> dict[str, Any]:
        return self._client.get(NODE, record.spec.node)

    def _edit_annotation(self, record: Quarantine, *, add: bool) -> None:
        device = record.spec.device
        for _ in range(MAX_ATTEMPTS):
            try:
                node = self._node(record)
            except NotFound:
                if add:
                    raise
                return  # the node is gone, and the annotation with it
            listed = _listed(node)
            wanted = sorted({*listed, device}) if add else [d for d in listed if d != device]
            if wanted == listed:
                return
            meta = node.get("metadata") or {}
            annotations = dict(meta.get("annotations") or {})
            if wanted:
                annotations[NODE_ANNOTATION] = orjson.dumps(wanted).decode()
            else:
                annotations.pop(NODE_ANNOTATION, None)
            try:
                self._client.update(NODE, {**node, "metadata": {**meta, "annotations": annotations}})
                return
            except Conflict:
                continue
        raise Conflict(f"Node {record.spec.node}: still conflicting after {MAX_ATTEMPTS} attempts")


def _owned(obj: dict[str, Any], record: Quarantine) -> bool:
    """Owned by this very record (its uid: a record deleted and made again is another owner)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(
        isinstance(r, dict)
        and r.get("kind") == KIND
        and r.get("name") == record.name
        and r.get("uid") == record.uid
        for r in refs
    )


def _listed(node: dict[str, Any]) -> list[str]:
    """The devices the node annotation lists; an unreadable value lists none (and is logged)."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(NODE_ANNOTATION)
    if not raw:
        return []
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        log.warning("node annotation %s is not JSON: %r", NODE_ANNOTATION, raw[:200])
        return []
    return sorted(v for v in value if isinstance(v, str)) if isinstance(value, list) else []
