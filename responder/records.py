"""The `DeviceQuarantine` record: the responder's durable state, one object per device.

Pure: no I/O. The record is a cluster-scoped custom resource (`gpuhealth.io/v1alpha1`,
manifest in `deploy/crds/`); this module owns its names, its phases and the bounded lists
it keeps, and converts between the object the API stores and the frozen dataclasses the
policy decides over. Everything the responder must remember across a restart or a change
of leader is in here (or in a Lease), never only in process memory.

Names are deterministic, so two replicas racing on one alert create the same object and
one of them gets 409 AlreadyExists instead of a second quarantine: `<node>-<device>`
reduced to a DNS-1123 subdomain, always followed by a short hash of the exact pair (case
and characters that had to be replaced would otherwise let two devices share a name).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

GROUP = "gpuhealth.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DeviceQuarantine"
PLURAL = "devicequarantines"

MAX_NAME = 253
"""DNS-1123 subdomain limit for object names."""
MAX_HISTORY = 50
"""History entries kept per record (oldest dropped first): enough for a device's flaps
within a week at the default backoff, small enough to keep the object well under 1 MiB."""
MAX_SOURCE_ALERTS = 16
"""Source alerts kept per record (oldest dropped first): the alerts a device's failure raised."""
MAX_KEYS = 64
"""Idempotency keys kept per record: Alertmanager re-sends within repeat_interval and HA
peers within seconds, so recent keys are what duplicates carry."""

DRA = "dra"
DEVICE_PLUGIN = "device-plugin"


class Phase(StrEnum):
    """Where a device stands. Release walks Probing -> Canary -> Stabilizing -> Ramp -> Released."""

    PENDING = "Pending"
    """Recorded, not enforced yet (rate limit; the reason says which)."""
    DEFERRED = "Deferred"
    """Recorded while the circuit breaker is open; re-evaluated only when a person resets it."""
    QUARANTINED = "Quarantined"
    """Enforced: the device receives no new allocations."""
    PROBING = "Probing"
    CANARY = "Canary"
    STABILIZING = "Stabilizing"
    RAMP = "Ramp"
    RELEASED = "Released"
    """Enforcement removed; the record stays with its history."""
    ABANDONED = "Abandoned"
    """A person removed gpuhealth's enforcement; gpuhealth no longer owns this quarantine."""


ACTIVE_PHASES = frozenset(set(Phase) - {Phase.RELEASED, Phase.ABANDONED})
RELEASE_PHASES = (Phase.PROBING, Phase.CANARY, Phase.STABILIZING, Phase.RAMP, Phase.RELEASED)


@dataclass(frozen=True, slots=True)
class SourceAlert:
    alertname: str
    fingerprint: str
    starts_at: str
    """RFC 3339, as Alertmanager sent it."""
    resolved_at: str = ""
    """RFC 3339 of the resolved notification; empty while the alert fires. A resolved alert
    starts the release checks; it never releases by itself."""

    @property
    def firing(self) -> bool:
        return not self.resolved_at


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    time: str
    """RFC 3339."""
    phase: Phase
    actor: str
    message: str


@dataclass(frozen=True, slots=True)
class QuarantineSpec:
    node: str
    device: str
    """The device as the exporter names it: GPU UUID (device plugin) or driver/pool/device (DRA)."""
    path: str
    """`dra` or `device-plugin`: decides how the quarantine is enforced."""
    reason: str
    actor: str
    """Who asked: `alert/<alertname>` or `person/<name>`."""
    expires_at: str
    """RFC 3339. Expiry re-evaluates the device; it never releases silently."""
    action: str = "quarantine"
    """`quarantine` (may migrate checkpointed work) or `restrict` (Unknown: never evicts)."""
    uuid: str = ""
    driver: str = ""
    pool: str = ""
    device_name: str = ""
    source_alerts: tuple[SourceAlert, ...] = ()


@dataclass(frozen=True, slots=True)
class QuarantineStatus:
    phase: Phase = Phase.PENDING
    phase_reason: str = ""
    """Why the record waits in its phase (RateLimited, BreakerOpen, NodeOptedOut, ...)."""
    phase_since: str = ""
    """RFC 3339 of the last phase change: timeouts of probe, canary, stability and ramp count from it."""
    enforced: str = ""
    """What gpuhealth put in place and owns (`DeviceTaintRule/<name>`, `Node/<name>`); empty
    while nothing is. Enforcement found missing while this is set was removed by someone else."""
    attempt: int = 0
    """Release attempts started (names the probe and canary Jobs of each, so a retry never
    mistakes an old Job's result for its own)."""
    failures: int = 0
    """Consecutive failed release attempts: the quarantine is extended by the backoff doubled
    this many times."""
    last_check: str = ""
    """Outcome of the last probe or canary (`probe-failed`, `canary-failed`, `passed`): a person
    may not release a device whose last check failed."""
    history: tuple[HistoryEntry, ...] = ()
    processed_keys: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Quarantine:
    name: str
    spec: QuarantineSpec
    status: QuarantineStatus = field(default_factory=QuarantineStatus)
    resource_version: str = ""
    """Of the object this was read from; an update with it is refused (409) if someone wrote since."""
    uid: str = ""
    """Of the object this was read from: what owner references to it name."""

    def seen(self, key: str) -> bool:
        return key in self.status.processed_keys

    def with_phase(
        self, phase: Phase, *, time: str, actor: str, message: str, reason: str = ""
    ) -> Quarantine:
        entry = HistoryEntry(time=time, phase=phase, actor=actor, message=message)
        history = _bounded((*self.status.history, entry), MAX_HISTORY)
        since = self.status.phase_since if phase == self.status.phase and self.status.phase_since else time
        status = replace(self.status, phase=phase, phase_reason=reason, phase_since=since, history=history)
        return replace(self, status=status)

    def with_key(self, key: str) -> Quarantine:
        if self.seen(key):
            return self
        keys = _bounded((*self.status.processed_keys, key), MAX_KEYS)
        return replace(self, status=replace(self.status, processed_keys=keys))


def record_name(node: str, device: str) -> str:
    """The record's deterministic object name for (node, device)."""
    digest = hashlib.sha256(f"{node}\x00{device}".encode()).hexdigest()[:10]
    readable = _dns_part(f"{node}-{device}")
    room = MAX_NAME - len(digest) - 1
    readable = readable[:room].rstrip("-.")
    return f"{readable}-{digest}" if readable else digest


def path_of(labels: dict[str, str] | Any) -> str:
    """DRA when the alert names a DRA driver, else the device-plugin path."""
    return DRA if labels.get("driver") else DEVICE_PLUGIN


def to_object(record: Quarantine) -> dict[str, Any]:
    """The API object for `record` (metadata.resourceVersion set when it was read from one)."""
    spec = record.spec
    metadata: dict[str, Any] = {
        "name": record.name,
        "labels": {f"{GROUP}/node": _label_value(spec.node)},
    }
    if record.resource_version:
        metadata["resourceVersion"] = record.resource_version
    if record.uid:
        metadata["uid"] = record.uid
    body_spec: dict[str, Any] = {
        "node": spec.node,
        "device": spec.device,
        "path": spec.path,
        "action": spec.action,
        "reason": spec.reason,
        "actor": spec.actor,
        "expiresAt": spec.expires_at,
        "sourceAlerts": [_source_alert(a) for a in spec.source_alerts],
    }
    for key, value in (("uuid", spec.uuid), ("driver", spec.driver), ("pool", spec.pool)):
        if value:
            body_spec[key] = value
    if spec.device_name:
        body_spec["deviceName"] = spec.device_name
    status = record.status
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": body_spec,
        "status": {
            "phase": status.phase.value,
            "phaseReason": status.phase_reason,
            "phaseSince": status.phase_since,
            "enforced": status.enforced,
            "attempt": status.attempt,
            "failures": status.failures,
            "lastCheck": status.last_check,
            "history": [
                {"time": h.time, "phase": h.phase.value, "actor": h.actor, "message": h.message}
                for h in status.history
            ],
            "processedKeys": list(status.processed_keys),
        },
    }


class RecordError(ValueError):
    """A stored object that is not a readable DeviceQuarantine; the message names the field."""


def from_object(obj: Any) -> Quarantine:
    """The record in an API object; RecordError names what is wrong (someone edited it by hand)."""
    if not isinstance(obj, dict):
        raise RecordError("not an object")
    meta = _mapping(obj.get("metadata"), "metadata")
    spec = _mapping(obj.get("spec"), "spec")
    status = _mapping(obj.get("status") or {}, "status")
    phase_text = status.get("phase") or Phase.PENDING.value
    try:
        phase = Phase(phase_text)
    except ValueError:
        raise RecordError(f"status.phase: {phase_text!r} is not a phase") from None
    return Quarantine(
        name=_text(meta, "name", "metadata"),
        resource_version=str(meta.get("resourceVersion") or ""),
        uid=str(meta.get("uid") or ""),
        spec=QuarantineSpec(
            node=_text(spec, "node", "spec"),
            device=_text(spec, "device", "spec"),
            path=_text(spec, "path", "spec"),
            reason=_text(spec, "reason", "spec"),
            actor=_text(spec, "actor", "spec"),
            expires_at=_text(spec, "expiresAt", "spec"),
            action=str(spec.get("action") or "quarantine"),
            uuid=str(spec.get("uuid") or ""),
            driver=str(spec.get("driver") or ""),
            pool=str(spec.get("pool") or ""),
            device_name=str(spec.get("deviceName") or ""),
            source_alerts=tuple(
                _read_source_alert(a, f"spec.sourceAlerts[{i}]")
                for i, a in enumerate(_list(spec.get("sourceAlerts"), "spec.sourceAlerts"))
            ),
        ),
        status=QuarantineStatus(
            phase=phase,
            phase_reason=str(status.get("phaseReason") or ""),
            phase_since=str(status.get("phaseSince") or ""),
            enforced=str(status.get("enforced") or ""),
            attempt=_count(status.get("attempt"), "status.attempt"),
            failures=_count(status.get("failures"), "status.failures"),
            last_check=str(status.get("lastCheck") or ""),
            history=tuple(
                _history(h, f"status.history[{i}]")
                for i, h in enumerate(_list(status.get("history"), "status.history"))
            ),
            processed_keys=tuple(str(k) for k in _list(status.get("processedKeys"), "status.processedKeys")),
        ),
    )


def _read_source_alert(entry: Any, path: str) -> SourceAlert:
    data = _mapping(entry, path)
    return SourceAlert(
        alertname=_text(data, "alertname", path),
        fingerprint=_text(data, "fingerprint", path),
        starts_at=_text(data, "startsAt", path),
        resolved_at=str(data.get("resolvedAt") or ""),
    )


def _source_alert(alert: SourceAlert) -> dict[str, str]:
    out = {"alertname": alert.alertname, "fingerprint": alert.fingerprint, "startsAt": alert.starts_at}
    if alert.resolved_at:
        out["resolvedAt"] = alert.resolved_at
    return out


def _history(entry: Any, path: str) -> HistoryEntry:
    data = _mapping(entry, path)
    try:
        phase = Phase(str(data.get("phase")))
    except ValueError:
        raise RecordError(f"{path}.phase: {data.get('phase')!r} is not a phase") from None
    return HistoryEntry(
        time=_text(data, "time", path),
        phase=phase,
        actor=str(data.get("actor") or ""),
        message=str(data.get("message") or ""),
    )


def _bounded(items: Sequence[Any], limit: int) -> tuple[Any, ...]:
    return tuple(items[-limit:])


_NOT_DNS = re.compile(r"[^a-z0-9.-]+")


def _dns_part(text: str) -> str:
    reduced = _NOT_DNS.sub("-", text.lower())
    reduced = re.sub(r"-{2,}", "-", reduced)
    reduced = re.sub(r"\.{2,}", ".", reduced)
    reduced = re.sub(r"(\.-|-\.)", "-", reduced)
    return reduced.strip("-.")


def _label_value(text: str) -> str:
    """A label value (63 characters of [A-Za-z0-9_.-], starting and ending alphanumeric)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:63]
    return value.strip("_.-")


def _count(value: Any, path: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RecordError(f"{path}: expected a whole number >= 0")
    return value


def _mapping(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RecordError(f"{path}: expected an object")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RecordError(f"{path}: expected a list")
    return value


def _text(data: dict[str, Any], key: str, path: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise RecordError(f"{path}.{key}: expected a non-empty string")
    return value
