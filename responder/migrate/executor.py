"""Moves checkpointed work off a quarantined device: the executor of `responder.migrate.plan`'s plans.

Every decision is the plan's (`migration.plan`: what to do next, the lease cap; `judge_eviction`:
what an eviction's answer means; `node_slot_free`, `evictions_left`: the caps); this observes,
carries the effects out and keeps what happened in the record's entry.

`Migrator.step(record, now)` is called by the reconciler for a `quarantine` record in phase
Quarantined whose enforcement is present. It observes the jobs with pods on the device, plans
each with `migration.plan`, carries the effects out, and returns the record with its
`status.migrations` updated; it never writes the record (the reconciler does, conditionally,
so a step whose record write loses a race is simply decided again from what is stored).

Which jobs get a move is the plan's too (`moves_for`): one per job holding the device and
quarantine episode of the record, so a device quarantined again moves its work again.

Thin and idempotent, every exception of one job an outcome (a cluster it cannot read at all
raises, for the caller to retry the record):
- Observe: the pods that hold the device (`responder.enforce.holders`, shared with the reconciler,
  which starts no probe on a device a pod holds). Pods are grouped into jobs by their
  controller (a ReplicaSet's Deployment, a Job, a StatefulSet; a bare pod is its own job),
  with all the job's pods.
- Its collaborators carry the other effects out: the job's migration Lease
  (`responder.migrate.leases`), the requests and Events on the tenant's pods
  (`responder.migrate.tenant_pods`), the evidence of unrecoverable pods
  (`responder.migrate.evidence_store`). This keeps the move's state machine: the plan's inputs,
  the order of its effects, the eviction and the caps.
- The caps are counted by the plan's functions from the records themselves, never from counters
  in memory, so a new leader rebuilds them; this hands them every record's moves.
- Evictions go through `policy/v1` Eviction, a dry run first; the answer is judged by
  `judge_eviction` (a 429's wait kept in the entry's `retryAt`; a refusal for good ends the
  job's move as Failed, escalated with an Event and a log line, never retried in a loop).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import CollectorRegistry

from gpuhealth import instruments
from gpuhealth.clock import Clock
from gpuhealth.kube.api import Api
from gpuhealth.kube.errors import ApiError, NotFound
from gpuhealth.kube.meta import metadata, parse_rfc3339, rfc3339
from gpuhealth.kube.resources import POD, Resource
from responder import metrics
from responder.enforce.backends import Backends
from responder.enforce.hold import CHECK_LABEL
from responder.enforce.hold_plan import HOLDER_LABEL
from responder.enforce.holders import pods_on_device
from responder.ladder import KNOWN, Kind
from responder.migrate.evidence import DeviceReadings
from responder.migrate.evidence_store import EvidenceStore
from responder.migrate.leases import JobLeases
from responder.migrate.plan import (
    FAILED_REASON,
    SERVING,
    Answer,
    Context,
    Effect,
    Evict,
    Holder,
    JobView,
    KeepEvidence,
    MigrationSettings,
    Mode,
    PodView,
    ReleaseLease,
    RequestCheckpoint,
    StopRequests,
    TakeLease,
    TellTenant,
    evictions_left,
    judge_eviction,
    moves_for,
    node_slot_free,
    plan,
)
from responder.migrate.tenant_pods import TenantPods
from responder.reconcile.accounting import WorkLostMeter
from responder.records import (
    QUARANTINES,
    Migration,
    MigrationOutcome,
    Quarantine,
    RecordError,
    from_object,
)

log = logging.getLogger(__name__)

REPLICA_SET = Resource("apps", "v1", "replicasets", namespaced=True)
_OUTCOME_LABEL = {
    MigrationOutcome.SUCCEEDED: "succeeded",
    MigrationOutcome.FAILED: "failed",
    MigrationOutcome.UNRECOVERABLE: "unrecoverable",
}


@dataclass(frozen=True, slots=True)
class MigratorSettings:
    """What the responder's configuration says about moving work."""

    migration: MigrationSettings = field(default_factory=MigrationSettings)
    """Checkpoint timeout and the migration Lease's duration and cap."""
    modes: Mapping[str, Mode] = field(default_factory=dict)
    """Mode per namespace; namespaces not named use `default_mode`."""
    default_mode: Mode = Mode.CHECKPOINT
    """Checkpoint, then evict: the only mode that moves work without a namespace opting in."""
    node_in_flight: int = 1
    """Migrations in flight at once per node: one, so a node's healthy GPUs keep their work
    while a second device's failure waits."""
    node_per_hour: int = 4
    """Migrations started per node within an hour: more means the node itself is failing."""
    namespace_evictions_per_hour: int = 20
    """Evictions per namespace within an hour, so a bad rule cannot empty a tenant."""

    def __post_init__(self) -> None:
        for name in ("node_in_flight", "node_per_hour", "namespace_evictions_per_hour"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")

    def mode(self, namespace: str) -> Mode:
        return self.modes.get(namespace, self.default_mode)


_COUNTED_KEYS = 10_000
"""Moves remembered as counted: far more than end between two passes."""


class MigratorMetrics:
    """`gpuhealth_migrations_total{outcome}`: one count per job whose move ended;
    `gpuhealth_migration_recovery_seconds{path}`: from a move's first eviction to its job's
    replacements running on healthy devices; `gpuhealth_migration_work_lost_seconds{since}`: per
    evicted pod, the work since its last reported checkpoint (or its start)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.migrations = instruments.counter(metrics.MIGRATIONS, registry)
        self.durations = instruments.histogram(metrics.MIGRATION_SECONDS, registry, metrics.MIGRATION_BUCKETS)
        self.recovery = instruments.histogram(
            metrics.MIGRATION_RECOVERY_SECONDS, registry, metrics.MIGRATION_RECOVERY_BUCKETS
        )
        for outcome in metrics.MIGRATION_OUTCOMES:
            self.migrations.labels(outcome)
            self.durations.labels(outcome)
        self.work_lost = WorkLostMeter(registry)


# ----- what was observed ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Job:
    namespace: str
    owner: str
    owner_uid: str
    pods: list[dict[str, Any]]
    on_device: set[str]
    """UIDs of the pods that hold the device."""


class _DeviceReads:
    """One step's reads, each made at most once (pods per namespace, ReplicaSets)."""

    def __init__(self, client: Api, backends: Backends) -> None:
        self._client = client
        self._backends = backends
        self._pods: dict[str, list[dict[str, Any]]] = {}
        self._replica_sets: dict[tuple[str, str], tuple[str, str] | None] = {}

    def jobs_on_device(self, record: Quarantine) -> dict[str, _Job]:
        on_device = pods_on_device(self._client, self._backends, record)
        jobs: dict[str, _Job] = {}
        for pod in on_device:
            labels = metadata(pod).get("labels") or {}
            if CHECK_LABEL in labels or HOLDER_LABEL in labels:
                continue  # gpuhealth's own check or holder pod: no tenant's work to move
            namespace = metadata(pod).get("namespace") or ""
            owner, owner_uid = self.owner(pod)
            job = jobs.get(owner_uid) or self.job(namespace, owner, owner_uid)
            job.on_device.add(str(metadata(pod).get("uid") or ""))
            jobs[owner_uid] = job
        return jobs

    def job(self, namespace: str, owner: str, owner_uid: str) -> _Job:
        pods = [p for p in self.pods(namespace) if self.owner(p)[1] == owner_uid]
        return _Job(namespace, owner, owner_uid, pods, set())

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        if namespace not in self._pods:
            self._pods[namespace] = self._client.list(POD, namespace=namespace).items
        return self._pods[namespace]

    def owner(self, pod: dict[str, Any]) -> tuple[str, str]:
        """(`<kind>/<name>`, uid) of the job a pod belongs to: its controller, a ReplicaSet's Deployment."""
        meta = metadata(pod)
        ref = _controller(meta)
        if ref is None:
            return f"Pod/{meta.get('name')}", str(meta.get("uid") or "")
        kind, name, uid = str(ref.get("kind")), str(ref.get("name")), str(ref.get("uid") or "")
        if kind == "ReplicaSet":
            above = self._replica_set_owner(str(meta.get("namespace") or ""), name)
            if above is not None:
                return above
        return f"{kind}/{name}", uid

    def _replica_set_owner(self, namespace: str, name: str) -> tuple[str, str] | None:
        key = (namespace, name)
        if key not in self._replica_sets:
            try:
                ref = _controller(metadata(self._client.get(REPLICA_SET, name, namespace=namespace)))
            except NotFound:
                ref = None
            self._replica_sets[key] = (
                (f"{ref.get('kind')}/{ref.get('name')}", str(ref.get("uid") or "")) if ref else None
            )
        return self._replica_sets[key]


def _ramping(record: Quarantine) -> bool:
    rung = KNOWN.rung(record.status.phase)
    return rung is not None and rung.kind == Kind.RAMP


def _pod_view(pod: dict[str, Any], on_device: set[str]) -> PodView:
    meta = metadata(pod)
    uid = str(meta.get("uid") or "")
    status = pod.get("status") or {}
    phase = status.get("phase")
    conditions = {
        str(c.get("type")): str(c.get("status"))
        for c in status.get("conditions") or ()
        if isinstance(c, dict)
    }
    gates = (pod.get("spec") or {}).get("readinessGates") or ()
    terminating = bool(meta.get("deletionTimestamp"))
    return PodView(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=uid,
        annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
        on_device=uid in on_device,
        finished=phase in ("Succeeded", "Failed"),
        terminating=terminating,
        serving_stopped=conditions.get(SERVING) == "False",
        gated=any(isinstance(g, dict) and g.get("conditionType") == SERVING for g in gates),
        ready=conditions.get("Ready") == "True",
        running_healthy=(
            phase in ("Running", "Succeeded")
            and not terminating
            and uid not in on_device
            # Unknown is no verdict on the replacement's device: the kubelet writes it for every
            # device of a DRA driver that streams no health (the NVIDIA DRA driver), and a device
            # whose Unknown lasts is restricted on its own. Unhealthy is a failure: not yet moved.
            and all(health != "Unhealthy" for health in _device_health(status))
        ),
    )


def _device_health(status: Mapping[str, Any]) -> list[str]:
    """The health the kubelet reports for every device the pod holds (`allocatedResourcesStatus`)."""
    return [
        str(resource.get("health"))
        for c in status.get("containerStatuses") or ()
        if isinstance(c, dict)
        for entry in c.get("allocatedResourcesStatus") or ()
        if isinstance(entry, dict)
        for resource in entry.get("resources") or ()
        if isinstance(resource, dict)
    ]


# ----- the executor ---------------------------------------------------------------------------------


class Migrator:
    def __init__(
        self,
        client: Api,
        settings: MigratorSettings,
        clock: Clock,
        *,
        metrics: MigratorMetrics | None = None,
        records: Callable[[], Iterable[Quarantine]] | None = None,
        backends: Backends,
        namespace: str = "gpuhealth-system",
        readings: DeviceReadings | None = None,
    ) -> None:
        """`records`: every stored record (the caps are counted from them); by default listed
        through `client`. A reconciler with a cache passes its own. `backends`: who says which
        pods hold a device (the responder's one set: `responder.service`). `namespace`: the responder's, where
        evidence ConfigMaps are kept. `readings`: the device's series (its directory entry and
        NVML readings, from Prometheus) for the evidence; None: the evidence says none were read."""
        self._client = client
        self._backends = backends
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._counted: dict[str, None] = {}
        self._recovered: set[str] = set()
        """Keys of the moves whose plan said, this step, that the job recovered (`Plan.recovered`)."""
        """Keys of moves already counted (insertion-ordered, bounded)."""
        self._records = records or self._list_records
        if metrics is not None:
            for path in backends.paths:  # every backend's series, from the start
                metrics.recovery.labels(path)
        self._leases = JobLeases(client, clock)
        self._evidence = EvidenceStore(client, namespace, readings)
        self._tenant = TenantPods(client, clock)

    def step(self, record: Quarantine, now: float, *, start: bool = True) -> Quarantine:
        """`record` with the migration of every job on its device advanced by one pass.

        `start=False` (the circuit breaker is open): moves under way go on, none begins."""
        if record.spec.action != "quarantine":
            return record  # restrict (Unknown) never moves anything
        observer = _DeviceReads(self._client, self._backends)
        self._recovered.clear()
        # A cluster it cannot read raises: the caller (the reconciler) retries this record on
        # its backoff; swallowed here, a device whose moves had not begun would wait a whole
        # recheck, as nothing in the record would say a move is due.
        climbing = KNOWN.rung(record.status.phase) is not None
        # On a rung of the release ladder only the moves awaiting replacements go on: nothing new
        # begins (on the ramp, the pods on the device are the opted-in work it was opened to).
        jobs = {} if climbing else observer.jobs_on_device(record)
        # The other records (for the per-node and per-namespace caps) cost a list of every
        # record; a device with nothing to move needs none, and most quarantined devices
        # have nothing to move: listing anyway made a pass quadratic in the records.
        moving = bool(jobs) or any(not m.outcome.finished for m in record.status.migrations)
        others = [r for r in self._records() if r.name != record.name] if moving else []
        holders = [Holder(job.namespace, job.owner, uid) for uid, job in jobs.items()]
        moves, episode = record.status.migrations, record.status.episode
        before = len(moves)
        entries = list(
            moves if climbing else moves_for(moves, holders, device=record.spec.device, episode=episode)
        )
        for i, entry in enumerate(entries):
            if entry.outcome.finished:
                continue
            # Begun by this step, or by one whose plan never got to choose the pods (it raised):
            # this plan chooses them. Read as "none" instead, the move would count as done.
            fresh = i >= before or not entry.targets
            try:
                job = jobs.get(entry.owner_uid) or observer.job(entry.namespace, entry.owner, entry.owner_uid)
                entries[i] = self._advance(record, entry, job, fresh, others, entries, now, start)
            except Exception as error:  # each failure is this job's outcome, not the pass's
                log.warning("migration of %s in %s: %s", entry.owner, record.name, error)
                entries[i] = replace(entry, detail=f"will retry: {error}"[:512])
            if (
                entries[i].outcome.finished
                and self._metrics is not None
                and entries[i].key not in self._counted
            ):
                # Counted once per move even when the record's write loses a 409 and the next
                # pass decides the same end again (a restart may count such a move twice, as
                # any counter restarts).
                self._counted[entries[i].key] = None
                while len(self._counted) > _COUNTED_KEYS:
                    self._counted.pop(next(iter(self._counted)))
                outcome = _OUTCOME_LABEL[entries[i].outcome]
                self._metrics.migrations.labels(outcome).inc()
                started = parse_rfc3339(entries[i].started_at) if entries[i].started_at else None
                if started is not None:
                    self._metrics.durations.labels(outcome).observe(max(0.0, now - started))
                first = entries[i].evictions[0] if entries[i].evictions else entries[i].evicting
                evicted = parse_rfc3339(first) if first else None
                if entries[i].key in self._recovered and evicted is not None:
                    # The plan's word: the move evicted and saw its replacements run again.
                    # `path`: the record's backend (a move follows its enforcement: never empty).
                    self._metrics.recovery.labels(record.spec.path).observe(max(0.0, now - evicted))
        return record.with_migrations(entries)

    # ----- one job ---------------------------------------------------------------------------------

    def _advance(
        self,
        record: Quarantine,
        entry: Migration,
        job: _Job,
        fresh: bool,
        others: Sequence[Quarantine],
        entries: Sequence[Migration],
        now: float,
        start: bool = True,
    ) -> Migration:
        identity = record.name
        lease, holder = self._leases.read(job.namespace, job.owner)
        view = JobView(
            namespace=job.namespace,
            owner=job.owner,
            owner_uid=job.owner_uid,
            # On the ramp the device is open to opted-in work: a replacement running there runs
            # on a device that passed its checks, not on a quarantined one.
            pods=tuple(_pod_view(p, set() if _ramping(record) else job.on_device) for p in job.pods),
            lease_holder=holder,
        )
        ctx = Context(
            now=now,
            action=record.spec.action,
            mode=self._settings.mode(job.namespace),
            identity=identity,
            key=entry.key,
            requested_at=parse_rfc3339(entry.requested_at) if entry.requested_at else None,
            targets=None if fresh else entry.targets,
            kept=None if fresh else entry.kept,
            evicted_at=parse_rfc3339(entry.evictions[0]) if entry.evictions else None,
            evicting_at=parse_rfc3339(entry.evicting) if entry.evicting else None,
            node_slot_free=self._node_slot_free(record, entry, others, entries, now),
            namespace_evictions_left=self._evictions_left(job.namespace, others, entries, now),
            settings=self._settings.migration,
            may_start=start,
            started_at=parse_rfc3339(entry.started_at) if entry.started_at else None,
        )
        decided = plan(view, ctx)
        if decided.recovered:
            self._recovered.add(entry.key)
        entry = replace(
            entry,
            targets=decided.targets if decided.targets is not None else entry.targets,
            kept=decided.kept if decided.kept is not None else entry.kept,
        )
        entry = replace(entry, outcome=decided.outcome, detail=decided.detail)
        if decided.replacing and not entry.replacing_since:
            entry = replace(entry, replacing_since=rfc3339(now))
        elif not decided.replacing and entry.replacing_since and not decided.outcome.finished:
            entry = replace(entry, replacing_since="")  # a replacement on the device: moving again
        if decided.outcome is MigrationOutcome.FAILED:
            log.warning(
                "migration of %s/%s off %s failed: %s", job.namespace, job.owner, record.name, decided.detail
            )
        pods = {p.name: p for p in view.pods}
        objects = {str(metadata(p).get("name") or ""): p for p in job.pods}
        refused = False
        unstopped: set[str] = set()
        # The first eviction is sent only once the record says it was decided (`evicting`,
        # written by this pass, read back by the next): should the write that records its
        # landing be lost, the pods' absence is still read as evicted, not as gone by themselves.
        stored = bool(entry.evicting or entry.evictions)
        for effect in decided.effects:
            if isinstance(effect, Evict) and not stored:
                entry = replace(
                    entry,
                    evicting=entry.evicting or rfc3339(now),
                    detail=f"{decided.detail}: sent once the decision is recorded",
                )
                continue
            if isinstance(effect, StopRequests):
                entry, stopped = self._tenant.stop_requests(effect, entry, objects.get(effect.pod), now)
                if not stopped:
                    unstopped.add(effect.pod)
                continue
            if isinstance(effect, RequestCheckpoint) and effect.pod in unstopped:
                continue  # never asked for a checkpoint before its requests stopped: next pass
            entry = self._apply(effect, entry, record, lease, pods, objects, now)
            refused = (
                entry.outcome is MigrationOutcome.FAILED and decided.outcome is not MigrationOutcome.FAILED
            )
            if refused:
                break  # an eviction refused for good (`judge_eviction`): the rest of the plan is moot
        if refused and holder == identity:
            release = ReleaseLease(job.namespace, job.owner)
            entry = self._apply(release, entry, record, lease, pods, objects, now)
        if decided.outcome is not MigrationOutcome.WAITING or entry.outcome.finished:
            log.info(
                "migration of %s/%s off %s: %s (%s)",
                *(job.namespace, job.owner, record.name, entry.outcome.value, entry.detail),
            )
        return entry

    def _apply(
        self,
        effect: Effect,
        entry: Migration,
        record: Quarantine,
        lease: dict[str, Any] | None,
        pods: Mapping[str, PodView],
        objects: Mapping[str, dict[str, Any]],
        now: float,
    ) -> Migration:
        if isinstance(effect, TakeLease):
            return self._leases.take(effect, entry, record, lease, now)
        if isinstance(effect, ReleaseLease):
            return self._leases.release(effect, entry, record.name, lease)
        if isinstance(effect, StopRequests):
            return self._tenant.stop_requests(effect, entry, objects.get(effect.pod), now)[0]
        if isinstance(effect, RequestCheckpoint):
            return self._tenant.request_checkpoint(effect, entry, now)
        if isinstance(effect, Evict):
            evicted = self._evict(effect, entry, record, now)
            pod_object = objects.get(effect.pod)
            if (
                self._metrics is not None
                and pod_object is not None
                and len(evicted.evictions) > len(entry.evictions)
            ):
                # The pod as read before its eviction: its last checkpoint (or start) to now.
                self._metrics.work_lost.evicted(pod_object, now)
            return evicted
        if isinstance(effect, KeepEvidence):
            return self._evidence.keep(effect, entry, record, objects.get(effect.pod), now)
        pod = pods.get(effect.pod)
        self._tenant.tell(
            effect.namespace, effect.pod, pod.uid if pod else "", entry.key, effect, record.name
        )
        return entry

    # ----- the eviction ------------------------------------------------------------------------------

    def _evict(self, effect: Evict, entry: Migration, record: Quarantine, now: float) -> Migration:
        retry_at = parse_rfc3339(entry.retry_at) if entry.retry_at else None
        if retry_at is not None and now < retry_at:
            return replace(entry, detail=f"a disruption budget allows no eviction before {entry.retry_at}")
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": effect.pod, "namespace": effect.namespace},
            # The pod meant, not a replacement that took its name (StatefulSets).
            "deleteOptions": {"preconditions": {"uid": effect.uid}},
        }
        try:
            for dry_run in (True, False):
                self._client.create(
                    POD, eviction, namespace=effect.namespace, subresource="eviction", dry_run=dry_run
                )
        except ApiError as error:
            verdict = judge_eviction(
                error.status, temporary=error.temporary, message=str(error), retry_after=error.retry_after
            )
            if verdict.answer is Answer.WAIT:
                return replace(
                    entry,
                    retry_at=rfc3339(now + verdict.seconds),
                    detail=f"eviction of {effect.pod} refused by a budget (429), "
                    f"again in {verdict.seconds:.0f} s",
                )
            if verdict.answer is Answer.GONE:
                return entry  # gone or replaced already: nothing left to evict
            if verdict.answer is Answer.RETRY:
                return replace(entry, detail=f"eviction of {effect.pod} will be retried: {error}"[:512])
            detail = f"eviction of {effect.pod} refused: {error}"[:512]
            log.warning(
                "migration of %s/%s off %s failed: %s", effect.namespace, entry.owner, record.name, detail
            )
            message = f"the GPU this pod uses is quarantined and moving the pod failed: {detail}"
            failed = TellTenant(effect.namespace, effect.pod, FAILED_REASON, message)
            self._tenant.tell(effect.namespace, effect.pod, effect.uid, entry.key, failed, record.name)
            return replace(entry, outcome=MigrationOutcome.FAILED, detail=detail)
        return replace(entry, evictions=(*entry.evictions, rfc3339(now)), retry_at="")

    # ----- caps, from the records ---------------------------------------------------------------------

    def _node_slot_free(
        self,
        record: Quarantine,
        entry: Migration,
        others: Sequence[Quarantine],
        entries: Sequence[Migration],
        now: float,
    ) -> bool:
        on_node = [m for r in others if r.spec.node == record.spec.node for m in r.status.migrations]
        on_node += [m for m in entries if m.owner_uid != entry.owner_uid]
        s = self._settings
        return node_slot_free(on_node, now, in_flight_limit=s.node_in_flight, per_hour_limit=s.node_per_hour)

    def _evictions_left(
        self, namespace: str, others: Sequence[Quarantine], entries: Sequence[Migration], now: float
    ) -> int:
        moves = [m for r in others for m in r.status.migrations] + list(entries)
        return evictions_left(
            namespace, moves, now, per_hour_limit=self._settings.namespace_evictions_per_hour
        )

    def finish(self, record: Quarantine, now: float) -> Quarantine:
        """`step` while the circuit breaker is open: moves under way go on to their end (their
        device's release waits for them), none begins."""
        return self.step(record, now, start=False)

    def _list_records(self) -> list[Quarantine]:
        records = []
        for obj in self._client.list(QUARANTINES).items:
            try:
                records.append(from_object(obj))
            except RecordError:
                continue  # a hand-edited record limits nothing; the reconciler reports it
        return records


def _controller(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None
