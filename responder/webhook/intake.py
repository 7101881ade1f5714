"""What the webhook records for one alert: a pure decision over the device's record.

The webhook records intent and never acts: this module decides how one alert changes the
`DeviceQuarantine` record of its device (or that it changes nothing), and the recorder
(`responder.webhook.recorder`) writes the result, conditional on the resourceVersion it read, and
decides again on a conflict. Pure: no I/O, time passed in.

The rules, each a safety property the tests check:
- A key already in the record changes nothing (Alertmanager delivers at least once: retries,
  repeat_interval, HA peers). Keys are (fingerprint, startsAt, status) of the alert.
- A firing alert with an action opens a quarantine (phase Pending: the reconciler enforces
  it), or joins the open one as another source alert. `restrict` (Unknown) never becomes a
  migration: its action stays `restrict` unless a confirmed failure (`quarantine`) arrives,
  and a quarantine is never downgraded to a restrict.
- A resolved alert marks its source alert resolved; that starts the release checks, never a
  release. Within one episode (fingerprint and startsAt) resolved is final: a resolved that
  overtakes its firing is remembered in the record, and the late firing changes nothing, so
  the order of deliveries does not matter. Only a resolved for a device with no record at all
  is not remembered (there is nothing to hold it): if its firing arrives later, the
  quarantine it opens goes through probe and canary like any other (and its expiry
  re-evaluates it), which is the safe side of an out-of-order delivery.
- A record that is Released or Abandoned is history: a new failure opens a new quarantine in
  the same object (its name is the device's), keeping the history.
- Only alerts that name a device are recorded: nothing here can act on a whole node.
- One responder per cluster: an alert whose cluster label (`intake.cluster_label`) names another
  cluster than this responder's own (`intake.cluster`) is refused before anything is read (an
  `OtherCluster` skip: answered 200, so Alertmanager does not deliver it again, and counted). An
  alert without the label is this cluster's (a Prometheus that serves one cluster sets none), and
  a responder with no cluster of its own takes every alert, as before clusters were named.
- A restrict whose alert says how long it lasts at least (annotation `restrict_for`, seconds:
  the rules' restriction schedule, longer for each repeated Unknown of the device) holds its
  release attempt until then (`status.retryAt`, kept in the record: a restarted responder reads
  it back); a later restrict of the same open record only ever moves that time later.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from gpuhealth import yaml_keys
from gpuhealth.kube.meta import parse_rfc3339, rfc3339
from gpuhealth.outcomes import Skipped, Unchanged
from responder.records import (
    ACTIVE_PHASES,
    MAX_SOURCE_ALERTS,
    Phase,
    Quarantine,
    QuarantineSpec,
    SourceAlert,
    device_uuid,
    record_name,
)
from responder.webhook.alerts import FIRING, NONE, QUARANTINE, RESTRICT, Alert

ACTOR = "responder"
"""Who writes history entries the webhook adds."""

RESTRICT_FOR = "restrict_for"
"""Annotation of a restrict alert: the seconds its restriction lasts at least, from now."""

UNKNOWN_REASON = "Unknown"
"""The reason of every restrict: Unknown past its tolerance, or flapping into Unknown (flapping
into Unhealthy is a quarantine, reason `UnhealthyFlapping`)."""


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _label_name(value: Any) -> str:
    if not isinstance(value, str) or not _LABEL_NAME.fullmatch(value) or value.startswith("__"):
        raise yaml_keys.Invalid(f"{value!r} must be a Prometheus label name")
    return value


def _cluster_name(value: Any) -> str:
    if not isinstance(value, str) or value != value.strip():
        raise yaml_keys.Invalid(f"{value!r} must be a cluster label's value, or empty for none")
    return value


@dataclass(frozen=True, slots=True)
class IntakeSettings:
    expiry_seconds: float = field(
        default=24 * 3600.0, metadata=yaml_keys.key("intake.expiry", yaml_keys.duration)
    )
    """When a new quarantine is re-evaluated. Expiry never releases: a device that still fails
    is extended with backoff; a day keeps a person's attention on a device that stays broken."""
    cluster: str = field(default="", metadata=yaml_keys.key("intake.cluster", _cluster_name))
    """This responder's own cluster: the value its Prometheus sets as the cluster label (an
    external label). Alerts of another cluster are refused; empty takes every alert (one
    Prometheus, one cluster)."""
    cluster_label: str = field(default="cluster", metadata=yaml_keys.key("intake.cluster_label", _label_name))
    """The label that names an alert's cluster: rules/config.yaml `selectors.cluster_label`."""

    def __post_init__(self) -> None:
        if not 0 < self.expiry_seconds < math.inf:
            raise ValueError(
                f"expiry_seconds must be finite and greater than zero, not {self.expiry_seconds!r}"
            )
        _label_name(self.cluster_label)
        _cluster_name(self.cluster)


@dataclass(frozen=True, slots=True)
class OtherCluster(Skipped):
    """Refused: the alert is another cluster's, and another responder's to act on."""


def other_cluster(alert: Alert, settings: IntakeSettings) -> OtherCluster | None:
    """The refusal of an alert of another cluster than this responder's own, or None."""
    theirs = alert.labels.get(settings.cluster_label, "")
    if not settings.cluster or not theirs or theirs == settings.cluster:
        return None
    return OtherCluster(
        f"{alert.name} is an alert of cluster {theirs!r} ({settings.cluster_label} label); "
        f"this responder serves cluster {settings.cluster!r}: refused, nothing recorded"
    )


@dataclass(frozen=True, slots=True)
class Write:
    """Write `record`: create it when `create`, else update it at its resourceVersion."""

    record: Quarantine
    create: bool
    detail: str


Decision = Write | Unchanged | Skipped


def reason_of(alert: Alert) -> str:
    """The quarantine reason an alert gives: `GPUDeviceFatalXid` -> `FatalXid`; restricts: Unknown."""
    if alert.action == RESTRICT:
        return UNKNOWN_REASON
    return alert.name.removeprefix("GPUDevice") or alert.name or "Unspecified"


def decide(record: Quarantine | None, alert: Alert, *, now: float, settings: IntakeSettings) -> Decision:
    """How `alert` changes `record` (None: the device has none yet)."""
    refused = other_cluster(alert, settings)
    if refused is not None:
        return refused
    key = alert.device_key
    if alert.action == NONE or key is None:
        return Skipped("no action for the responder in this alert")
    if record is not None and record.seen(alert.idempotency_key):
        return Unchanged(f"{alert.name} {alert.status}: already recorded")
    stamp = rfc3339(now)
    if alert.status == FIRING:
        if record is not None and _episode_resolved(record, alert):
            # Its resolved came first (an HA peer, a retry): within one episode (same startsAt)
            # resolved is final, so the late firing changes nothing.
            return Unchanged(f"{alert.name} firing: this episode already resolved")
        if record is None or not record.status.history or record.status.phase not in ACTIVE_PHASES:
            return _open(record, alert, now=now, stamp=stamp, settings=settings)
        return _join(record, alert, now=now, stamp=stamp)
    if record is None:
        return Unchanged(f"{alert.name} resolved: no quarantine recorded for {key.node}/{key.device}")
    return _resolve(record, alert, stamp=stamp)


def _open(
    previous: Quarantine | None, alert: Alert, *, now: float, stamp: str, settings: IntakeSettings
) -> Write:
    key = alert.device_key
    assert key is not None  # checked by decide
    labels = alert.labels
    spec = QuarantineSpec(
        node=key.node,
        device=key.device,
        path="",  # the reconciler's first pass identifies the device through the backends
        reason=reason_of(alert),
        actor=f"alert/{alert.name}",
        expires_at=rfc3339(now + settings.expiry_seconds),
        action=alert.action,
        uuid=device_uuid(key.device, labels.get("uuid", "")),
        driver=labels.get("driver", ""),
        pool=labels.get("pool", ""),
        device_name=labels.get("device_name", ""),
        source_alerts=(_source(alert),),
    )
    if previous is None or not previous.status.history:
        # A record whose status was never written is one another replica (or a crash) left
        # between its two writes: it is opened here as if new, in the same object.
        base = Quarantine(name=record_name(key.node, key.device), spec=spec)
        if previous is not None:
            base = replace(base, resource_version=previous.resource_version, status=previous.status)
        message = f"{alert.name} fired: {alert.action} recorded"
    else:
        # Same object, new quarantine: the history of the old one stays, its keys too.
        base = replace(previous, spec=spec, status=replace(previous.status, phase_reason=""))
        message = f"{alert.name} fired after {previous.status.phase}: a new {alert.action} recorded"
    record = base.with_phase(Phase.PENDING, time=stamp, actor=ACTOR, message=message).with_key(
        alert.idempotency_key
    )
    held = restriction_seconds(alert)
    if held is not None:
        record = replace(record, status=replace(record.status, retry_at=rfc3339(now + held)))
    return Write(record, create=previous is None, detail=message)


def restriction_seconds(alert: Alert) -> float | None:
    """How long a restrict alert's restriction lasts at least (its `restrict_for` annotation);
    None for a quarantine, or a restrict that gives none or an unreadable one (then the
    restriction lasts as long as its alerts, as before the rules carried it)."""
    if alert.action != RESTRICT:
        return None
    text = alert.annotations.get(RESTRICT_FOR, "").strip()
    try:
        seconds = float(text)
    except ValueError:
        return None
    return seconds if 0 < seconds < math.inf else None


def _join(record: Quarantine, alert: Alert, *, now: float, stamp: str) -> Write:
    spec = record.spec
    sources = _with_source(spec.source_alerts, _source(alert))
    escalate = alert.action == QUARANTINE and spec.action == RESTRICT
    if escalate:
        spec = replace(spec, action=QUARANTINE, reason=reason_of(alert), actor=f"alert/{alert.name}")
        message = f"{alert.name} fired: restrict escalated to quarantine"
    else:
        message = f"{alert.name} fired: joins the open {spec.action}"
    updated = replace(record, spec=replace(spec, source_alerts=sources)).with_key(alert.idempotency_key)
    held = restriction_seconds(alert)
    if held is not None and spec.action == RESTRICT:
        # A repeated Unknown while the record is open: its restriction lasts from now, never
        # shorter than the one already held.
        until = now + held
        current = parse_rfc3339(record.status.retry_at) if record.status.retry_at else None
        if current is None or until > current:
            updated = replace(updated, status=replace(updated.status, retry_at=rfc3339(until)))
    if escalate or record.status.phase not in (Phase.PENDING, Phase.QUARANTINED, Phase.DEFERRED):
        # A failure while a release is under way is the reconciler's cue to return the device
        # to Quarantined; the history shows when it was seen.
        updated = updated.with_phase(
            record.status.phase, time=stamp, actor=ACTOR, message=message, reason=record.status.phase_reason
        )
    return Write(updated, create=False, detail=message)


def _resolve(record: Quarantine, alert: Alert, *, stamp: str) -> Write | Unchanged:
    if _episode_resolved(record, alert):
        return Unchanged(f"{alert.name} resolved: already recorded")
    episode = (alert.fingerprint, _starts(alert))
    sources = record.spec.source_alerts
    if any((s.fingerprint, s.starts_at) == episode for s in sources):
        updated_sources = tuple(
            replace(s, resolved_at=stamp) if (s.fingerprint, s.starts_at) == episode else s for s in sources
        )
    else:
        # The resolved overtook its firing: remember the episode as resolved, so the firing,
        # when it comes, changes nothing.
        updated_sources = _with_source(sources, replace(_source(alert), resolved_at=stamp))
    updated = replace(record, spec=replace(record.spec, source_alerts=updated_sources)).with_key(
        alert.idempotency_key
    )
    still = sum(1 for s in updated_sources if s.firing)
    message = f"{alert.name} resolved" + (f"; {still} source alert(s) still firing" if still else "")
    updated = updated.with_phase(
        record.status.phase, time=stamp, actor=ACTOR, message=message, reason=record.status.phase_reason
    )
    return Write(updated, create=False, detail=message)


def _episode_resolved(record: Quarantine, alert: Alert) -> bool:
    episode = (alert.fingerprint, _starts(alert))
    return any((s.fingerprint, s.starts_at) == episode and not s.firing for s in record.spec.source_alerts)


def _source(alert: Alert) -> SourceAlert:
    return SourceAlert(alertname=alert.name, fingerprint=alert.fingerprint, starts_at=_starts(alert))


def _starts(alert: Alert) -> str:
    return rfc3339(alert.starts_at)


def _with_source(sources: tuple[SourceAlert, ...], new: SourceAlert) -> tuple[SourceAlert, ...]:
    """`new` added (or refreshed, when the same episode re-fires after a resolved), bounded."""
    kept = [s for s in sources if (s.fingerprint, s.starts_at) != (new.fingerprint, new.starts_at)]
    return tuple([*kept, new][-MAX_SOURCE_ALERTS:])
