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

from gpuhealth.kube.meta import parse_rfc3339
from gpuhealth.kube.resources import Resource
from responder.ladder import KNOWN, LADDER, Ladder

GROUP = "gpuhealth.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DeviceQuarantine"
PLURAL = "devicequarantines"
QUARANTINES = Resource(GROUP, VERSION, PLURAL, namespaced=False)
"""The records' resource, as the API client addresses it."""

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
MAX_MIGRATIONS = 32
"""Moves a record keeps, over all its episodes (finished ones of earlier episodes dropped first,
then finished ones of the current episode, oldest first): a GPU serves a handful of pods per
episode, so more than this means jobs came and went while the device stayed quarantined."""
MAX_TARGETS = 64
"""Pods one migration moves (and evictions it remembers): a fixed-topology job of 8 nodes x 8 GPUs."""
MAX_EVIDENCE = 8
"""Unrecoverable pods whose status a migration keeps."""
MAX_EXCERPT = 4096
"""Characters of one pod's status excerpt: enough for phase, conditions and the device's health
entries, small enough that 32 migrations stay far below the object size limit."""

IDENTIFIED = "Identified"
"""`status.conditions[].type` present (False) only while no backend claims the record's device:
until one does, nothing is enforced and the record waits (`responder.reconcile.reconciler`)."""
HELD = "Held"
"""`status.conditions[].type` of a device-plugin card's hold (`responder.enforce.hold`): True
while holder pods hold every unit of the card; its reason says where the hold stands."""


class Phase(StrEnum):
    """Where a device stands off the release ladder. On the way out it stands on the ladder's
    rungs (`responder.ladder.LADDER`: Probing, Canary, Stabilizing, Ramp), then Released."""

    PENDING = "Pending"
    """Recorded, not enforced yet (rate limit; the reason says which)."""
    DEFERRED = "Deferred"
    """Recorded while the circuit breaker is open; re-evaluated only when a person resets it."""
    QUARANTINED = "Quarantined"
    """Enforced: the device receives no new allocations."""
    RELEASED = "Released"
    """Enforcement removed; the record stays with its history."""
    ABANDONED = "Abandoned"
    """A person removed gpuhealth's enforcement; gpuhealth no longer owns this quarantine."""


ENDED_PHASES: tuple[str, ...] = (Phase.RELEASED, Phase.ABANDONED)
"""The phases a record ends in (gpuhealth no longer enforces on the device), in this order; a
record leaves one only when a new episode opens on the device."""


def phases_of(ladder: Ladder) -> tuple[str, ...]:
    """Every phase a record of a responder walking `ladder` can be in, in the order a device
    walks them."""
    return (Phase.PENDING, Phase.DEFERRED, Phase.QUARANTINED, *ladder.phases, *ENDED_PHASES)


PHASES = phases_of(KNOWN)
"""The shipped responder's phases (the optional reset rung's included): the CRD's enum, the
demo's progress columns and the dashboards' phase lists are this sequence (generated from it,
or checked against it)."""
RELEASE_PHASES: tuple[str, ...] = (*LADDER.phases, Phase.RELEASED)
"""The phases a released device walked, in order (the optional reset before them aside)."""
ACTIVE_PHASES = frozenset(PHASES) - frozenset(ENDED_PHASES)


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
    phase: str
    """A `Phase` or a rung's phase (`responder.ladder`)."""
    actor: str
    message: str


class MigrationOutcome(StrEnum):
    """Where one job's move off the device stands: what `responder.migrate.plan.plan` decides and the
    record keeps (one enum for both)."""

    WAITING = "Waiting"
    SUCCEEDED = "Succeeded"
    UNRECOVERABLE = "Unrecoverable"
    """Not movable (no checkpoint, or none in time): evidence kept, tenant told, nothing evicted."""
    FAILED = "Failed"
    """The move stopped on something a retry will not mend (403, several disruption budgets): escalated."""

    @property
    def finished(self) -> bool:
        return self is not MigrationOutcome.WAITING


@dataclass(frozen=True, slots=True)
class Evidence:
    """What an unrecoverable pod looked like: its status excerpt, kept for people; the whole of
    the evidence (the pod's status, the device's directory entry and NVML readings) is in
    `object`."""

    pod: str
    reason: str
    excerpt: str
    """JSON of the pod's phase, conditions and allocatedResourcesStatus, cut to MAX_EXCERPT characters."""
    object: str = ""
    """`<namespace>/<name>` of the evidence ConfigMap (owned by the record); empty: not written."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One job's move off the quarantined device: the state a new leader continues from."""

    namespace: str
    owner: str
    """`<kind>/<name>` of the pods' controller."""
    owner_uid: str
    key: str
    """The move's idempotency key (the value of checkpoint-requested): of (device, job, episode)."""
    episode: int = 0
    """The record's episode (`QuarantineStatus.episode`) this move belongs to: a job is moved
    once per episode, and again in the next one should it hold the device then. 0: written
    before episodes were counted."""
    targets: tuple[str, ...] = ()
    """UIDs of the pods to move, fixed when the move started."""
    started_at: str = ""
    """RFC 3339 of the first plan: the node's hourly cap counts these."""
    requested_at: str = ""
    """RFC 3339 of the first step towards the checkpoint (new requests stopped, or the checkpoint
    requested); the checkpoint timeout counts from it."""
    retry_at: str = ""
    """RFC 3339 before which no eviction is tried (a disruption budget answered 429)."""
    evictions: tuple[str, ...] = ()
    """RFC 3339 of each eviction that landed: the namespace's eviction cap counts these."""
    evicting: str = ""
    """RFC 3339 of when the move first decided to evict, stored before its first eviction is
    sent: a write that records the eviction can be lost (a 409, a crash) after the pods are gone,
    and the move must still know that they went because it evicted them."""
    outcome: MigrationOutcome = MigrationOutcome.WAITING
    detail: str = ""
    evidence: tuple[Evidence, ...] = ()
    kept: tuple[str, ...] = ()
    """UIDs of the job's other live pods when the move started (a shardable job's other shards),
    which are never counted as its replacements."""
    replacing_since: str = ""
    """RFC 3339 of when every pod of the move had gone and the job's replacements were awaited:
    from then the move holds no node's in-flight slot."""


@dataclass(frozen=True, slots=True)
class QuarantineSpec:
    node: str
    device: str
    """The device as the exporter names it: GPU UUID (device plugin) or driver/pool/device (DRA)."""
    path: str
    """The backend that enforces the quarantine, as the reconciler identified the device from the
    API (`responder.enforce.backends`: the shipped backends' `dra` or `device-plugin`); empty
    until a backend claims the device. Nothing guesses it: the webhook records what the alert
    says, and the first pass that can tell sets it."""
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
    partitions: tuple[str, ...] = ()
    """A MIG card's partitions as its path names them: on device plugins their MIG UUIDs (the
    plugin's device IDs), on DRA the driver's MIG device names in `pool`; empty: the device is a
    whole GPU (or its partitions are not known). The record is of the card; these are how its
    path reaches it (`docs/quarantine.md`, "MIG: the card is the device")."""
    profiles: tuple[tuple[str, str], ...] = ()
    """Device plugins: (MIG UUID, MIG profile) of each partition whose profile NVML named
    (`gpu_nvml_mig_device_info`): under MIG strategy mixed a partition is one unit of
    `nvidia.com/mig-<profile>`, which the card's holders and checks ask the kubelet for."""
    source_alerts: tuple[SourceAlert, ...] = ()
    release_request: ReleaseRequest | None = None
    """A person's pending request to release the device (the only way a person asks for one:
    the operator role writes the spec, never the status)."""


@dataclass(frozen=True, slots=True)
class ReleaseRequest:
    """A person's request to release the device (`gpuhealth quarantine release`): the responder
    carries it out through the release ladder. It may shorten the ladder's waits (a window, a
    ramp), never skip a check, and is refused while a failure or Unhealthy evidence stands; the
    answer is the record's `ReleaseRequest` condition (and an Event)."""

    actor: str
    """Who asked: `person/<name>`."""
    reason: str
    requested_at: str
    """RFC 3339 of the request: a newer request replaces an older one."""


@dataclass(frozen=True, slots=True)
class Condition:
    """One `status.conditions` entry, shaped as Kubernetes' metav1.Condition."""

    type: str
    status: str
    """`True`, `False` or `Unknown`."""
    reason: str
    """CamelCase, what a program matches on."""
    message: str
    last_transition_time: str
    """RFC 3339 of the last change of `status` or `reason`."""


class Verdict(StrEnum):
    PASSED = "Passed"
    FAILED = "Failed"


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """The verdict of one check rung of one release attempt (a timeout is Failed)."""

    check: str
    """The rung's name (`probe`, `canary`)."""
    attempt: int
    verdict: Verdict

    @property
    def failed(self) -> bool:
        return self.verdict is Verdict.FAILED


@dataclass(frozen=True, slots=True)
class QuarantineStatus:
    phase: str = Phase.PENDING
    """A `Phase`, or the phase of the release ladder's rung the device stands on."""
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
    retry_at: str = ""
    """RFC 3339 before which no release attempt starts: the doubled backoff of the last failure
    (set with `failures`; the expiry is moved to it only when it was earlier)."""
    last_check: CheckOutcome | None = None
    """The verdict of the last check rung (None before the first): a person may not release a
    device whose last check failed."""
    history: tuple[HistoryEntry, ...] = ()
    processed_keys: tuple[str, ...] = ()
    migrations: tuple[Migration, ...] = ()
    """Jobs moved (or being moved) off the device, one entry per job and episode."""
    conditions: tuple[Condition, ...] = ()
    """The responder's answers (`ReleaseRequest`: honoured or refused, and why)."""
    episode: int = 0
    """Quarantine episodes of the device: counted up at every entry into Quarantined from
    another phase (enforced from Pending, which a re-opened record passes through again, or
    sent back from a rung of the release ladder), never while it stays Quarantined. The work on
    the device is moved once per episode (`Migration.episode`)."""

    def condition(self, kind: str) -> Condition | None:
        for c in self.conditions:  # a loop, not next(genexpr): asked 3 times per record per pass
            if c.type == kind:
                return c
        return None


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

    def with_phase(self, phase: str, *, time: str, actor: str, message: str, reason: str = "") -> Quarantine:
        entry = HistoryEntry(time=time, phase=phase, actor=actor, message=message)
        history = _bounded((*self.status.history, entry), MAX_HISTORY)
        since = self.status.phase_since if phase == self.status.phase and self.status.phase_since else time
        entering = phase == Phase.QUARANTINED and self.status.phase != Phase.QUARANTINED
        episode = self.status.episode + entering
        status = replace(
            self.status,
            phase=phase,
            phase_reason=reason,
            phase_since=since,
            history=history,
            episode=episode,
        )
        return replace(self, status=status)

    def with_key(self, key: str) -> Quarantine:
        if self.seen(key):
            return self
        keys = _bounded((*self.status.processed_keys, key), MAX_KEYS)
        return replace(self, status=replace(self.status, processed_keys=keys))

    def with_migrations(self, migrations: Sequence[Migration]) -> Quarantine:
        """`migrations` kept within bounds: finished moves are dropped (oldest first) before any in flight."""
        return replace(self, status=replace(self.status, migrations=bound_migrations(migrations)))


def quarantine_starts(record: Quarantine) -> list[float]:
    """When the record's quarantines were enforced: each entry into Quarantined from Pending or
    Deferred (a failed release returning to Quarantined is the same quarantine)."""
    starts: list[float] = []
    previous: str | None = None
    for entry in record.status.history:
        if entry.phase == Phase.QUARANTINED and previous in (None, Phase.PENDING, Phase.DEFERRED):
            at = parse_rfc3339(entry.time)
            if at is not None:
                starts.append(at)
        previous = entry.phase
    return starts


def bound_migrations(migrations: Sequence[Migration]) -> tuple[Migration, ...]:
    """At most MAX_MIGRATIONS entries, each within its own bounds. A move in flight outlives
    finished ones, and a finished move of the latest episode outlives those of earlier ones:
    dropping it while its job still holds the device (an unrecoverable job) would start the
    job's move of this episode again."""
    entries = [_bounded_migration(m) for m in migrations]
    latest = max((m.episode for m in entries), default=0)
    while len(entries) > MAX_MIGRATIONS:
        earlier = (i for i, m in enumerate(entries) if m.outcome.finished and m.episode < latest)
        finished = (i for i, m in enumerate(entries) if m.outcome.finished)
        del entries[next(earlier, next(finished, 0))]
    return tuple(entries)


def _bounded_migration(m: Migration) -> Migration:
    evidence = tuple(replace(e, excerpt=e.excerpt[:MAX_EXCERPT]) for e in m.evidence[-MAX_EVIDENCE:])
    return replace(
        m,
        targets=m.targets[:MAX_TARGETS],
        kept=m.kept[:MAX_TARGETS],
        evictions=_bounded(m.evictions, MAX_TARGETS),
        evidence=evidence,
    )


def owner_reference(record: Quarantine) -> dict[str, Any]:
    """The record as the controlling owner of an object gpuhealth creates for it."""
    if not record.uid:
        raise ValueError(f"{record.name}: the record has no uid to own what is made for it")
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": record.name,
        "uid": record.uid,
        "controller": True,
        "blockOwnerDeletion": False,
    }


def record_name(node: str, device: str) -> str:
    """The record's deterministic object name for (node, device)."""
    digest = hashlib.sha256(f"{node}\x00{device}".encode()).hexdigest()[:10]
    readable = _dns_part(f"{node}-{device}")
    room = MAX_NAME - len(digest) - 1
    readable = readable[:room].rstrip("-.")
    return f"{readable}-{digest}" if readable else digest


def device_uuid(device: str, uuid: str = "") -> str:
    """The GPU UUID of a device named `device`, `uuid` where one is known: the exporter names a
    device by its UUID wherever it knows one (device plugins; DRA devices whose ResourceSlice
    publishes it, `exporter.identity`), and by `<driver>/<pool>/<device>` otherwise (no UUID
    known: empty)."""
    return uuid or ("" if "/" in device else device)


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
        "action": spec.action,
        "reason": spec.reason,
        "actor": spec.actor,
        "expiresAt": spec.expires_at,
        "sourceAlerts": [_source_alert(a) for a in spec.source_alerts],
    }
    for key, value in (
        ("path", spec.path),
        ("uuid", spec.uuid),
        ("driver", spec.driver),
        ("pool", spec.pool),
    ):
        if value:
            body_spec[key] = value
    if spec.device_name:
        body_spec["deviceName"] = spec.device_name
    if spec.partitions:
        body_spec["partitions"] = list(spec.partitions)
    if spec.profiles:
        body_spec["partitionProfiles"] = dict(spec.profiles)
    if spec.release_request is not None:
        request = spec.release_request
        body_spec["releaseRequest"] = {
            "actor": request.actor,
            "reason": request.reason,
            "requestedAt": request.requested_at,
        }
    status = record.status
    body_status: dict[str, Any] = {
        "phase": str(status.phase),
        "phaseReason": status.phase_reason,
        "phaseSince": status.phase_since,
        "enforced": status.enforced,
        "attempt": status.attempt,
        "failures": status.failures,
        "episode": status.episode,
        "history": [
            {"time": h.time, "phase": str(h.phase), "actor": h.actor, "message": h.message}
            for h in status.history
        ],
        "processedKeys": list(status.processed_keys),
        "migrations": [_migration(m) for m in status.migrations],
    }
    if status.last_check is not None:
        check = status.last_check
        body_status["lastCheck"] = {
            "check": check.check,
            "attempt": check.attempt,
            "verdict": check.verdict.value,
        }
    if status.retry_at:
        body_status["retryAt"] = status.retry_at
    if status.conditions:
        body_status["conditions"] = [
            {
                "type": c.type,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": c.last_transition_time,
            }
            for c in status.conditions
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": body_spec,
        "status": body_status,
    }


def _migration(m: Migration) -> dict[str, Any]:
    out: dict[str, Any] = {
        "namespace": m.namespace,
        "owner": m.owner,
        "ownerUID": m.owner_uid,
        "key": m.key,
        "episode": m.episode,
        "targets": list(m.targets),
        "outcome": m.outcome.value,
        "detail": m.detail,
    }
    for name, value in (
        ("startedAt", m.started_at),
        ("requestedAt", m.requested_at),
        ("retryAt", m.retry_at),
        ("replacingSince", m.replacing_since),
        ("evicting", m.evicting),
    ):
        if value:
            out[name] = value
    if m.evictions:
        out["evictions"] = list(m.evictions)
    if m.kept:
        out["kept"] = list(m.kept)
    if m.evidence:
        out["evidence"] = [
            {
                "pod": e.pod,
                "reason": e.reason,
                "excerpt": e.excerpt,
                **({"object": e.object} if e.object else {}),
            }
            for e in m.evidence
        ]
    return out


def _read_migration(entry: Any, path: str) -> Migration:
    data = _mapping(entry, path)
    text = data.get("outcome") or MigrationOutcome.WAITING.value
    try:
        outcome = MigrationOutcome(text)
    except ValueError:
        raise RecordError(f"{path}.outcome: {text!r} is not an outcome") from None
    evidence = []
    for i, item in enumerate(_list(data.get("evidence"), f"{path}.evidence")):
        e = _mapping(item, f"{path}.evidence[{i}]")
        evidence.append(
            Evidence(
                pod=_text(e, "pod", f"{path}.evidence[{i}]"),
                reason=str(e.get("reason") or ""),
                excerpt=str(e.get("excerpt") or ""),
                object=str(e.get("object") or ""),
            )
        )
    return Migration(
        namespace=_text(data, "namespace", path),
        owner=_text(data, "owner", path),
        owner_uid=_text(data, "ownerUID", path),
        key=_text(data, "key", path),
        episode=_count(data.get("episode"), f"{path}.episode"),
        targets=tuple(str(t) for t in _list(data.get("targets"), f"{path}.targets")),
        started_at=str(data.get("startedAt") or ""),
        requested_at=str(data.get("requestedAt") or ""),
        retry_at=str(data.get("retryAt") or ""),
        replacing_since=str(data.get("replacingSince") or ""),
        evictions=tuple(str(t) for t in _list(data.get("evictions"), f"{path}.evictions")),
        evicting=str(data.get("evicting") or ""),
        outcome=outcome,
        detail=str(data.get("detail") or ""),
        evidence=tuple(evidence),
        kept=tuple(str(t) for t in _list(data.get("kept"), f"{path}.kept")),
    )


class RecordError(ValueError):
    """A stored object that is not a readable DeviceQuarantine; the message names the field."""


def from_object(obj: Any, ladder: Ladder = KNOWN) -> Quarantine:
    """The record in an API object; RecordError names what is wrong (someone edited it by hand).

    `ladder`: the release ladder the reader walks (its rungs are the phases beside `Phase`)."""
    if not isinstance(obj, dict):
        raise RecordError("not an object")
    meta = _mapping(obj.get("metadata"), "metadata")
    spec = _mapping(obj.get("spec"), "spec")
    status = _mapping(obj.get("status") or {}, "status")
    phase = _phase(status.get("phase") or Phase.PENDING.value, "status.phase", ladder)
    return Quarantine(
        name=_text(meta, "name", "metadata"),
        resource_version=str(meta.get("resourceVersion") or ""),
        uid=str(meta.get("uid") or ""),
        spec=QuarantineSpec(
            node=_text(spec, "node", "spec"),
            device=_text(spec, "device", "spec"),
            path=str(spec.get("path") or ""),
            reason=_text(spec, "reason", "spec"),
            actor=_text(spec, "actor", "spec"),
            expires_at=_text(spec, "expiresAt", "spec"),
            action=str(spec.get("action") or "quarantine"),
            uuid=str(spec.get("uuid") or ""),
            driver=str(spec.get("driver") or ""),
            pool=str(spec.get("pool") or ""),
            device_name=str(spec.get("deviceName") or ""),
            partitions=tuple(str(p) for p in _list(spec.get("partitions"), "spec.partitions")),
            profiles=_profiles(spec.get("partitionProfiles")),
            source_alerts=tuple(
                _read_source_alert(a, f"spec.sourceAlerts[{i}]")
                for i, a in enumerate(_list(spec.get("sourceAlerts"), "spec.sourceAlerts"))
            ),
            release_request=_release_request(spec.get("releaseRequest")),
        ),
        status=QuarantineStatus(
            phase=phase,
            phase_reason=str(status.get("phaseReason") or ""),
            phase_since=str(status.get("phaseSince") or ""),
            enforced=str(status.get("enforced") or ""),
            attempt=_count(status.get("attempt"), "status.attempt"),
            failures=_count(status.get("failures"), "status.failures"),
            retry_at=str(status.get("retryAt") or ""),
            episode=_count(status.get("episode"), "status.episode"),
            last_check=_last_check(status.get("lastCheck")),
            history=tuple(
                _history(h, f"status.history[{i}]", ladder)
                for i, h in enumerate(_list(status.get("history"), "status.history"))
            ),
            processed_keys=tuple(str(k) for k in _list(status.get("processedKeys"), "status.processedKeys")),
            migrations=tuple(
                _read_migration(m, f"status.migrations[{i}]")
                for i, m in enumerate(_list(status.get("migrations"), "status.migrations"))
            ),
            conditions=tuple(
                _condition(c, f"status.conditions[{i}]")
                for i, c in enumerate(_list(status.get("conditions"), "status.conditions"))
            ),
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


def _release_request(value: Any) -> ReleaseRequest | None:
    if value is None:
        return None
    data = _mapping(value, "spec.releaseRequest")
    path = "spec.releaseRequest"
    return ReleaseRequest(
        actor=_text(data, "actor", path),
        reason=_text(data, "reason", path),
        requested_at=_text(data, "requestedAt", path),
    )


def _condition(entry: Any, path: str) -> Condition:
    data = _mapping(entry, path)
    return Condition(
        type=_text(data, "type", path),
        status=_text(data, "status", path),
        reason=str(data.get("reason") or ""),
        message=str(data.get("message") or ""),
        last_transition_time=str(data.get("lastTransitionTime") or ""),
    )


def _source_alert(alert: SourceAlert) -> dict[str, str]:
    out = {"alertname": alert.alertname, "fingerprint": alert.fingerprint, "startsAt": alert.starts_at}
    if alert.resolved_at:
        out["resolvedAt"] = alert.resolved_at
    return out


_PHASES: dict[str, Phase] = {p.value: p for p in Phase}
"""By value: `Phase(text)` costs an Enum lookup with an exception on a rung's name, for each of a
record's history entries on every pass (a tenth of a 10,000-record pass, bench/results.md)."""


def _phase(value: Any, path: str, ladder: Ladder) -> str:
    text = str(value)
    known = _PHASES.get(text)
    if known is not None:
        return known
    if ladder.rung(text) is None:
        raise RecordError(f"{path}: {value!r} is not a phase (one of {', '.join(phases_of(ladder))})")
    return text


def _last_check(value: Any) -> CheckOutcome | None:
    if value is None:
        return None
    data = _mapping(value, "status.lastCheck")
    text = data.get("verdict")
    try:
        verdict = Verdict(str(text))
    except ValueError:
        raise RecordError(f"status.lastCheck.verdict: {text!r} is not Passed or Failed") from None
    return CheckOutcome(
        check=_text(data, "check", "status.lastCheck"),
        attempt=_count(data.get("attempt"), "status.lastCheck.attempt"),
        verdict=verdict,
    )


def _history(entry: Any, path: str, ladder: Ladder) -> HistoryEntry:
    data = _mapping(entry, path)
    phase = _phase(data.get("phase"), f"{path}.phase", ladder)
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


def _profiles(value: Any) -> tuple[tuple[str, str], ...]:
    """`spec.partitionProfiles` (MIG UUID -> profile), sorted; anything else: none."""
    if not isinstance(value, dict):
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in value.items() if isinstance(v, str) and v))
