"""The reset rung's executor: asks an installed reset controller to reset one card.

An adapter over the API, thin and idempotent, with the shape of a check's (`CheckRunner`):
`responder.reconcile.policy` decides when the reset of an attempt starts (`StartReset`), reads
its result (`CheckResult`) and times it out (`PolicySettings.reset_timeout_seconds`); this
creates the request and reads its status. One request per record and attempt, named as a
check's Job is (`<record>-reset-<attempt>`), so a second `start` is a no-op (409 AlreadyExists)
and a retry never reads an older attempt's result. Each request is owned by the record.

The default request is NVSentinel janitor's `GPUReset` (`janitor.dgxc.nvidia.com/v1alpha1`,
cluster-scoped): `spec.nodeName` and `spec.selector.uuids: [<uuid>]`. The janitor sets the
condition `Complete` True when it is done, whatever the outcome, and says which in the
condition's reason (`GPUResetSucceeded`, or a failure such as `ResetJobFailed`) and in
`status.phase` (`Succeeded` / `Failed`); so the outcome is read from the reason, and a
`Complete` that is not True means still under way. Kind, group, version, scope, field paths,
condition and success reason are settings, for a controller of another shape.

A card is reset as a whole: the request names the card's UUID (`spec.uuid`), never a MIG
partition's, and a record that names none cannot be reset (its reset fails, and says why in
the log). Synchronous like the client; the reconciler runs it in a thread.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from gpuhealth import yaml_keys
from gpuhealth.fields import SettingsError
from gpuhealth.kube.api import Api
from gpuhealth.kube.errors import AlreadyExists, Forbidden, NotFound
from gpuhealth.kube.resources import Resource
from responder.checks.jobs import job_name
from responder.reconcile.policy import CheckResult
from responder.records import Quarantine, owner_reference

log = logging.getLogger(__name__)

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_FIELD = re.compile(r"[A-Za-z][A-Za-z0-9]*(\.[A-Za-z][A-Za-z0-9]*)*")


@dataclass(frozen=True, slots=True)
class ResetSettings:
    """The reset controller's request kind (NVSentinel janitor's `GPUReset` by default)."""

    group: str = field(
        default="janitor.dgxc.nvidia.com", metadata=yaml_keys.key("reset.group", yaml_keys.text)
    )
    """API group of the request kind."""
    version: str = field(default="v1alpha1", metadata=yaml_keys.key("reset.version", yaml_keys.text))
    kind: str = field(default="GPUReset", metadata=yaml_keys.key("reset.kind", yaml_keys.text))
    plural: str = field(default="gpuresets", metadata=yaml_keys.key("reset.plural", yaml_keys.text))
    """The resource's plural name (the URL path, and what the RBAC rule grants)."""
    namespace: str = field(
        default="",
        metadata=yaml_keys.key(
            "reset.namespace", yaml_keys.object_name("a namespace name, or empty for a cluster-scoped kind")
        ),
    )
    """Empty: the kind is cluster-scoped (the janitor's); else the namespace requests go in."""
    node_field: str = field(
        default="spec.nodeName", metadata=yaml_keys.key("reset.node_field", yaml_keys.text)
    )
    """Where the request names the device's node (a dotted path)."""
    uuids_field: str = field(
        default="spec.selector.uuids", metadata=yaml_keys.key("reset.uuids_field", yaml_keys.text)
    )
    """Where the request lists the UUIDs of the cards to reset (a dotted path to a list)."""
    complete_condition: str = field(
        default="Complete", metadata=yaml_keys.key("reset.complete_condition", yaml_keys.text)
    )
    """The condition that is True once the controller is done, whatever the outcome."""
    succeeded_reason: str = field(
        default="GPUResetSucceeded", metadata=yaml_keys.key("reset.succeeded_reason", yaml_keys.text)
    )
    """That condition's reason when the reset succeeded; any other reason is a failed reset."""

    def __post_init__(self) -> None:
        for name in ("group", "plural", "namespace"):
            value = getattr(self, name)
            if (value or name != "namespace") and not _NAME.fullmatch(value):
                raise SettingsError(f"ResetSettings.{name} must be a DNS name, not {value!r}")
        for name in ("version", "kind", "complete_condition", "succeeded_reason"):
            if not str(getattr(self, name)).strip():
                raise SettingsError(f"ResetSettings.{name} must not be empty")
        for name in ("node_field", "uuids_field"):
            value = getattr(self, name)
            if not _FIELD.fullmatch(value) or "." not in value:
                raise SettingsError(
                    f"ResetSettings.{name} must be a dotted path below the object (spec.x), not {value!r}"
                )

    @property
    def resource(self) -> Resource:
        return Resource(self.group, self.version, self.plural, namespaced=bool(self.namespace))


def request_result(obj: dict[str, Any], settings: ResetSettings) -> CheckResult:
    """A request's status as the rung's result (pure)."""
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if not isinstance(condition, dict) or condition.get("type") != settings.complete_condition:
            continue
        if condition.get("status") != "True":
            return CheckResult.RUNNING
        if condition.get("reason") == settings.succeeded_reason:
            return CheckResult.SUCCEEDED
        return CheckResult.FAILED
    return CheckResult.RUNNING


def card_uuid(record: Quarantine) -> str:
    """The UUID of the card the record's device is on ("" when the record names none): a card's
    (`GPU-...`), never a MIG partition's (`MIG-...`), which the janitor's CRD refuses and no
    controller can reset on its own."""
    for candidate in (record.spec.uuid, record.spec.device):
        if candidate.startswith("GPU-"):
            return candidate
    return ""


class ResetHandoff:
    """The reset rung's executor (a `responder.checks.jobs.CheckRunner`)."""

    def __init__(self, client: Api, settings: ResetSettings | None = None) -> None:
        self._client = client
        self.settings = settings or ResetSettings()

    def unserved(self) -> str | None:
        """Why no request can be made in this cluster (the kind is not served), or None."""
        s = self.settings
        versions = self._client.served_versions(s.group, s.plural)
        if s.version in versions:
            return None
        served = f" (served: {', '.join(versions)})" if versions else ""
        return (
            f"the cluster serves no {s.plural}.{s.group}/{s.version}{served}: every reset will time "
            "out and count as a failed attempt; install the reset controller (NVSentinel's janitor) "
            "or set reset.enabled: false"
        )

    def start(self, record: Quarantine, kind: str, attempt: int) -> None:
        if not card_uuid(record):
            log.warning("%s: no card UUID in the record: the card cannot be reset", record.name)
            return
        s = self.settings
        try:
            self._client.create(s.resource, self.request(record, kind, attempt), namespace=self._ns)
        except AlreadyExists:
            pass  # a previous start got this far
        except NotFound:
            # Not raised: the record goes on to Resetting, where the reset times out and counts as
            # failed (a card is never held on a rung without a failure to show for it).
            log.error(
                "%s: no %s.%s/%s in the cluster: is the reset controller installed?",
                record.name, s.plural, s.group, s.version,
            )  # fmt: skip
        except Forbidden:
            log.error(
                "%s: creating a %s is forbidden: the responder needs the RBAC of deploy/components/gpu-reset",
                record.name, s.kind,
            )  # fmt: skip

    def result(self, record: Quarantine, kind: str, attempt: int) -> CheckResult:
        if not card_uuid(record):
            return CheckResult.FAILED
        try:
            obj = self._client.get(
                self.settings.resource, job_name(record, kind, attempt), namespace=self._ns
            )
        except NotFound:
            return CheckResult.ABSENT
        return request_result(obj, self.settings)

    def finish(self, record: Quarantine, kind: str, attempt: int) -> None:
        # The request is done with once the record has moved on; the janitor restores the node's
        # GPU services on its deletion (its finalizer), so it is deleted, never left behind.
        with contextlib.suppress(NotFound):
            self._client.delete(self.settings.resource, job_name(record, kind, attempt), namespace=self._ns)

    def request(self, record: Quarantine, kind: str, attempt: int) -> dict[str, Any]:
        s = self.settings
        metadata: dict[str, Any] = {
            "name": job_name(record, kind, attempt),
            "labels": {
                "app.kubernetes.io/managed-by": "gpuhealth",
                "gpuhealth.io/record": record.name[:63].rstrip("-."),
            },
            "annotations": {
                "gpuhealth.io/attempt": str(attempt),
                "gpuhealth.io/device": f"{record.spec.node}/{record.spec.device}",
            },
            "ownerReferences": [owner_reference(record)],
        }
        if s.namespace:
            metadata["namespace"] = s.namespace
        obj: dict[str, Any] = {"apiVersion": f"{s.group}/{s.version}", "kind": s.kind, "metadata": metadata}
        _put(obj, s.node_field, record.spec.node)
        _put(obj, s.uuids_field, [card_uuid(record)])
        return obj

    @property
    def _ns(self) -> str | None:
        return self.settings.namespace or None


def _put(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = obj
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
