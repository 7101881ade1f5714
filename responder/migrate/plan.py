"""Moving running work off a quarantined device: a pure plan per job, one step at a time.

The workload contract (`docs/workloads.md`): a pod declares `gpuhealth.io/checkpoint:
annotation|none` and `gpuhealth.io/topology: fixed|shardable`; the responder writes
`gpuhealth.io/checkpoint-requested: <key>`, and the workload answers
`gpuhealth.io/checkpoint-committed: <key>` once its idempotent commit is done. Only then is
the pod evicted through the Eviction API (which honours disruption budgets); its owner
recreates it, and the quarantine keeps the new pod off the device.

`plan(job, context)` returns the next effects for one job, given what was observed. Pure: no
I/O, time passed in. By construction, and property-tested:
- only `quarantine` records migrate; a `restrict` (Unknown) never evicts anything, whatever
  the configuration;
- in `checkpoint` mode nothing is evicted before the commit of this key is seen; work that
  declares no checkpoint, or whose commit does not come in time, is unrecoverable: evidence is
  kept and the tenant told, nothing evicted;
- `allow-completion` never evicts; `immediate` (opt-in per namespace) evicts without a
  checkpoint;
- no move begins (takes its lease) while the circuit breaker is open; one under way ends;
- nothing happens without the job's migration lease held by this flow (exactly one flow owns
  a job, also when two of its devices fail together), and the per-node and per-namespace
  limits hold;
- fixed topology moves the whole job; shardable only the pods on the failed device;
- a move that outlives the lease cap stops (Failed: the tenant told, the lease released),
  and an eviction the apiserver refuses for good (`judge_eviction`: 403, a pod under several
  disruption budgets) fails the move once, never in a loop; a budget's 429 waits.
Which jobs a step moves is decided here too (`moves_for`): every job holding the device gets one
move per quarantine episode of its record (`QuarantineStatus.episode`), keyed by (device, job,
episode), so the device's second or nth quarantine moves whatever runs on it again, and a job
already moving (whatever the episode) is never given a second flow.
The caps a move counts against (`node_slot_free`, `evictions_left`) are counted here too, from
the moves the records hold, so a new leader rebuilds them. The outcome of a move is the
record's `MigrationOutcome`: one enum for the plan and the record.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from gpuhealth.kube.meta import parse_rfc3339
from responder.records import Migration, MigrationOutcome

CHECKPOINT = "gpuhealth.io/checkpoint"
TOPOLOGY = "gpuhealth.io/topology"
REQUESTED = "gpuhealth.io/checkpoint-requested"
COMMITTED = "gpuhealth.io/checkpoint-committed"
CHECKPOINT_FAILED = "gpuhealth.io/checkpoint-failed"
"""The workload's answer when its checkpoint cannot be taken: `<key>` or `<key>: <reason>`."""
SERVING = "gpuhealth.io/serving"
"""The pod condition (and readiness gate) the responder sets False to stop new requests."""


class Mode(StrEnum):
    """What a namespace allows (configuration, per namespace)."""

    CHECKPOINT = "checkpoint"
    """Default: checkpoint, then evict."""
    ALLOW_COMPLETION = "allow-completion"
    """Never evict: wait for the pods to finish on their own."""
    IMMEDIATE = "immediate"
    """Opt-in: evict without waiting for a checkpoint."""


@dataclass(frozen=True, slots=True)
class PodView:
    namespace: str
    name: str
    uid: str
    annotations: dict[str, str]
    on_device: bool
    """The pod holds the quarantined device (others belong to the same job)."""
    finished: bool = False
    """Succeeded or Failed: nothing to move."""
    terminating: bool = False
    """Being deleted already (an eviction that landed, or someone else)."""
    serving_stopped: bool = False
    """Its `gpuhealth.io/serving` condition is False: new requests were stopped."""
    gated: bool = False
    """It declares the readiness gate `gpuhealth.io/serving`: the condition takes it out of its
    Services' endpoints, once the kubelet has turned its Ready condition False."""
    ready: bool = False
    """Its Ready condition is True."""
    running_healthy: bool = False
    """Running, off the quarantined device, and no device it holds reported Unhealthy
    (`allocatedResourcesStatus`; Unknown is no verdict): a replacement that runs again."""


@dataclass(frozen=True, slots=True)
class JobView:
    """One job (the pods' owner) with pods on the quarantined device."""

    namespace: str
    owner: str
    """`<kind>/<name>` of the pods' controller (the job that is migrated as a whole or in shards)."""
    owner_uid: str
    pods: tuple[PodView, ...]
    lease_holder: str | None
    """Holder of the job's migration Lease now (None: free or expired)."""


@dataclass(frozen=True, slots=True)
class MigrationSettings:
    checkpoint_timeout_seconds: float = 600.0
    """How long to wait for `checkpoint-committed` before the work counts as unrecoverable."""
    lease_margin_seconds: float = 60.0
    """Added to the step timeout for the migration Lease's duration."""
    lease_cap_seconds: float = 3600.0
    """No migration Lease is held longer than this, whatever happens (no ghost locks)."""
    replacement_timeout_seconds: float = 900.0
    """From the first eviction: how long the job's replacement pods may take to run on healthy
    devices before the move counts as failed (scheduling, image pulls, a restore)."""

    def __post_init__(self) -> None:
        for name in (
            "checkpoint_timeout_seconds",
            "lease_margin_seconds",
            "lease_cap_seconds",
            "replacement_timeout_seconds",
        ):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ValueError(f"{name} must be finite and greater than zero, not {value!r}")

    @property
    def lease_seconds(self) -> float:
        return min(self.checkpoint_timeout_seconds + self.lease_margin_seconds, self.lease_cap_seconds)


@dataclass(frozen=True, slots=True)
class Context:
    now: float
    action: str
    """The record's action: only `quarantine` migrates."""
    mode: Mode
    identity: str
    """This flow's lease holder identity: `<record name>`."""
    key: str
    """The idempotency key of this migration (device, job, quarantine)."""
    requested_at: float | None
    """When this flow first requested the checkpoint (from the record), None before."""
    targets: tuple[str, ...] | None
    """UIDs of the pods this flow moves, fixed when it starts (from the record; None before):
    the pods the owner recreates elsewhere are never targets, so a move ends."""
    node_slot_free: bool
    """The node has no other migration in flight and is under its hourly cap."""
    namespace_evictions_left: int
    """Evictions the namespace's cap still allows now."""
    settings: MigrationSettings
    may_start: bool = True
    """A new move may begin (take its lease): False while the circuit breaker is open."""
    started_at: float | None = None
    """When this flow first took the job's lease (from the record; None before): a move under
    way, which goes on to its end whatever the breaker, rather than hold the job, the node's
    slot and the device (and with it the device's release) half-way, until the lease cap."""
    evicted_at: float | None = None
    """When this flow's first eviction landed (from the record; None before): from then the move
    waits for the job's replacement pods, and the replacement timeout counts."""
    evicting_at: float | None = None
    """When this flow first decided to evict, as stored before any eviction was sent (None:
    not yet): pods gone after it may have gone by an eviction whose landing a lost write did not
    record."""
    kept: tuple[str, ...] | None = None
    """UIDs of the job's live pods that are not targets, fixed when the move starts (a shardable
    job's other shards): never counted as replacements. None before the first plan."""


# ----- effects --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TakeLease:
    namespace: str
    owner: str
    owner_uid: str
    holder: str
    seconds: float


@dataclass(frozen=True, slots=True)
class ReleaseLease:
    namespace: str
    owner: str


@dataclass(frozen=True, slots=True)
class StopRequests:
    """Set the pod's `gpuhealth.io/serving` condition False (pods/status), before its checkpoint
    is requested: a pod that declares the readiness gate leaves its Services' endpoints."""

    namespace: str
    pod: str
    key: str


@dataclass(frozen=True, slots=True)
class RequestCheckpoint:
    namespace: str
    pod: str
    key: str


@dataclass(frozen=True, slots=True)
class Evict:
    """Through `policy/v1` Eviction, after a dry-run preflight; 429 waits >= 10 s, 500/403 stop."""

    namespace: str
    pod: str
    uid: str


@dataclass(frozen=True, slots=True)
class KeepEvidence:
    """Unrecoverable: keep the pod's status, the device entry and NVML readings in the record."""

    namespace: str
    pod: str
    reason: str


@dataclass(frozen=True, slots=True)
class TellTenant:
    """A Kubernetes Event on the pod, for the tenant."""

    namespace: str
    pod: str
    reason: str
    message: str


Effect = TakeLease | ReleaseLease | StopRequests | RequestCheckpoint | Evict | KeepEvidence | TellTenant


@dataclass(frozen=True, slots=True)
class Plan:
    outcome: MigrationOutcome
    effects: tuple[Effect, ...] = ()
    detail: str = ""
    recheck_seconds: float | None = None
    targets: tuple[str, ...] | None = None
    """The pods to move, chosen by the first plan of a flow; the caller records them."""
    kept: tuple[str, ...] | None = None
    """The job's other live pods, fixed with the targets; the caller records them."""
    recovered: bool = False
    """Succeeded because the job's replacements run on healthy devices (after an eviction)."""
    replacing: bool = False
    """Every pod of the move has gone; the job's replacements are awaited (the caller records
    since when: such a move holds no node's in-flight slot, its disruption is over)."""


UNRECOVERABLE_REASON = "GPUQuarantineUnrecoverable"
FAILED_REASON = "GPUQuarantineMigrationFailed"
HOUR = 3600.0
EVICTION_RETRY_FLOOR_SECONDS = 10.0
"""The least wait after a 429: a disruption budget frees a slot only when a pod becomes ready again."""
SEVERAL_BUDGETS = "more than one PodDisruptionBudget"
"""What the apiserver's 500 to an eviction says when the pod is under several budgets, which the
eviction subresource refuses for good; any other 500 is a server error, retried like a 503."""
CHECKPOINT_POLL_SECONDS = 5.0
"""How often a flow waiting for checkpoint commits (or replacements) looks again (as for terminating pods)."""
STOP_POLL_SECONDS = 1.0
"""How soon a flow looks again after stopping a pod's requests: the kubelet turns the pod not
Ready within a sync, and the checkpoint request waits for it."""


def migration_key(device: str, owner_uid: str, episode: int) -> str:
    """The idempotency key of one job's migration off one device in one quarantine episode (the
    design's device, job and status version: the episode is the record's version of the device's
    failure)."""
    digest = hashlib.sha256(f"{device}\x00{owner_uid}\x00{episode}".encode()).hexdigest()
    return digest[:16]


@dataclass(frozen=True, slots=True)
class Holder:
    """A job with pods on the quarantined device, as the executor found it."""

    namespace: str
    owner: str
    owner_uid: str


def moves_for(
    migrations: Iterable[Migration], holders: Iterable[Holder], *, device: str, episode: int
) -> tuple[Migration, ...]:
    """The record's moves with one begun for each job holding the device that has no move in
    this `episode` and none unfinished (a move under way from an earlier episode goes on to its
    end: one flow per job). Appended in the order `holders` are given; the rest kept as they are."""
    entries = list(migrations)
    covered = {m.owner_uid for m in entries if m.episode == episode or not m.outcome.finished}
    for job in holders:
        if job.owner_uid in covered:
            continue
        covered.add(job.owner_uid)
        key = migration_key(device, job.owner_uid, episode)
        entries.append(Migration(job.namespace, job.owner, job.owner_uid, key, episode=episode))
    return tuple(entries)


def plan(job: JobView, ctx: Context) -> Plan:
    decided = _next(job, ctx)
    if decided.targets is not None and decided.kept is None:
        kept = ctx.kept if ctx.kept is not None else kept_pods(job, decided.targets)
        decided = replace(decided, kept=kept)
    cap = ctx.settings.lease_cap_seconds
    if (
        decided.outcome is MigrationOutcome.WAITING
        and ctx.started_at is not None
        and ctx.now - ctx.started_at >= cap
    ):
        # The hard cap: a move that outlives it (a budget that never allows, a pod that never
        # ends, a namespace switched to allow-completion) stops holding the node's slot and the
        # job's lock, and a person is told.
        reason = f"the move did not end within the lease cap ({cap:.0f} s)"
        return replace(failed(job, ctx, reason, decided.targets or ()), kept=decided.kept)
    return decided


def _next(job: JobView, ctx: Context) -> Plan:
    if ctx.action != "quarantine":
        return Plan(MigrationOutcome.SUCCEEDED, detail="restrict: running work is left where it is")
    targets = ctx.targets if ctx.targets is not None else choose_targets(job)
    movers = [p for p in job.pods if p.uid in targets and not p.finished]
    if not movers:
        finished = any(p.finished for p in job.pods if p.uid in targets)
        if ctx.evicted_at is None and (ctx.evicting_at is None or finished):
            # Nothing of ours was evicted: the pods finished or were deleted by someone else.
            return _done(job, ctx, "every pod of the move has gone", targets)
        # Evicted, or deleted once an eviction was decided: its landing may have been sent and
        # its record lost (a 409, a crash), so the job's replacements are awaited as after one.
        since = ctx.evicted_at if ctx.evicted_at is not None else ctx.evicting_at
        return _replaced(job, replace(ctx, evicted_at=since), targets)
    if ctx.mode == Mode.ALLOW_COMPLETION:
        return Plan(
            MigrationOutcome.WAITING,
            detail="allow-completion: waiting for the pods to finish",
            targets=targets,
        )
    if ctx.mode == Mode.CHECKPOINT and any(p.annotations.get(CHECKPOINT) != "annotation" for p in movers):
        return _unrecoverable(
            job, ctx, movers, "no checkpoint declared (gpuhealth.io/checkpoint: annotation)", targets
        )
    if job.lease_holder not in (None, ctx.identity):
        detail = f"another flow ({job.lease_holder}) owns this job"
        return Plan(MigrationOutcome.WAITING, detail=detail, recheck_seconds=10.0, targets=targets)
    if job.lease_holder is None:
        if not (ctx.may_start or ctx.started_at is not None):
            detail = "the circuit breaker is open: no move starts"
            return Plan(MigrationOutcome.WAITING, detail=detail, recheck_seconds=60.0, targets=targets)
        if not ctx.node_slot_free:
            detail = "the node has a migration in flight or reached its hourly cap"
            return Plan(MigrationOutcome.WAITING, detail=detail, recheck_seconds=60.0, targets=targets)
        take = TakeLease(job.namespace, job.owner, job.owner_uid, ctx.identity, ctx.settings.lease_seconds)
        return Plan(
            MigrationOutcome.WAITING,
            (take,),
            detail="migration lease requested",
            recheck_seconds=0.0,
            targets=targets,
        )
    running = [p for p in movers if not p.terminating]
    if not running:
        return Plan(
            MigrationOutcome.WAITING,
            detail="evicted pods are terminating",
            recheck_seconds=5.0,
            targets=targets,
        )
    if ctx.mode == Mode.CHECKPOINT:
        refused = [(p, why) for p in running if (why := checkpoint_failure(p, ctx.key)) is not None]
        if refused:
            # The workload said its checkpoint cannot be taken: waiting out the timeout would
            # only keep the job on the failed device longer.
            pod, why = refused[0]
            reason = f"the checkpoint of {pod.name} failed" + (f": {why}" if why else "")
            return _unrecoverable(job, ctx, movers, reason, targets)
        pending = [p for p in running if p.annotations.get(COMMITTED) != ctx.key]
        if pending:
            waited = 0.0 if ctx.requested_at is None else ctx.now - ctx.requested_at
            if waited >= ctx.settings.checkpoint_timeout_seconds:
                reason = f"no checkpoint committed within {waited:.0f} s"
                return _unrecoverable(job, ctx, movers, reason, targets)
            # Stop new requests first: a pod is asked for its checkpoint only once it is out of
            # its Services' endpoints. Behind the readiness gate that is when the kubelet has
            # turned its Ready condition False (what the EndpointSlice controller reads), a
            # later pass; without the gate the condition changes no endpoints, so its request
            # follows in the same pass, after the stop.
            stops = tuple(
                StopRequests(p.namespace, p.name, ctx.key) for p in pending if not p.serving_stopped
            )
            requests = tuple(
                RequestCheckpoint(p.namespace, p.name, ctx.key)
                for p in pending
                if not _leaving(p) and p.annotations.get(REQUESTED) != ctx.key
            )
            left = ctx.settings.checkpoint_timeout_seconds - waited
            leaving = sum(1 for p in pending if _leaving(p))
            detail = f"waiting for {len(pending)} checkpoint(s)"
            if leaving:
                detail += f"; {leaving} pod(s) leaving their Services' endpoints first"
            # A commit is a pod annotation, which the reconciler does not watch: look again
            # soon, not only at the timeout (a 10-minute wait for a 20-second commit).
            recheck = min(left, STOP_POLL_SECONDS if leaving else CHECKPOINT_POLL_SECONDS)
            return Plan(
                MigrationOutcome.WAITING,
                (*stops, *requests),
                detail=detail,
                recheck_seconds=recheck,
                targets=targets,
            )
    allowed = running[: max(0, ctx.namespace_evictions_left)]
    if not allowed:
        return Plan(
            MigrationOutcome.WAITING,
            detail="the namespace's eviction cap is reached",
            recheck_seconds=60.0,
            targets=targets,
        )
    return Plan(
        MigrationOutcome.WAITING,
        tuple(Evict(p.namespace, p.name, p.uid) for p in allowed),
        detail=f"evicting {len(allowed)} pod(s)",
        recheck_seconds=5.0,
        targets=targets,
    )


def _leaving(pod: PodView) -> bool:
    """The pod declares the readiness gate and is still in its Services' endpoints."""
    return pod.gated and (pod.ready or not pod.serving_stopped)


def checkpoint_failure(pod: PodView, key: str) -> str | None:
    """The reason the pod's workload gave for failing this move's checkpoint (`""`: none given),
    or None when it reported no failure of this key (an earlier episode's failure is not this one's)."""
    value = pod.annotations.get(CHECKPOINT_FAILED)
    if value is None:
        return None
    if value.strip() == key:
        return ""
    if value.startswith(key + ":"):
        return value[len(key) + 1 :].strip()
    return None


def kept_pods(job: JobView, targets: tuple[str, ...]) -> tuple[str, ...]:
    """The job's live pods that the move leaves where they are: never replacements."""
    return tuple(
        sorted(p.uid for p in job.pods if p.uid not in targets and not p.finished and not p.terminating)
    )


def _replaced(job: JobView, ctx: Context, targets: tuple[str, ...]) -> Plan:
    """After the evictions: the move has succeeded once as many new pods of the job run on
    healthy devices as were moved; until then it awaits them, up to the replacement timeout."""
    kept = set(ctx.kept or ())
    fresh = [p for p in job.pods if p.uid not in targets and p.uid not in kept and not p.terminating]
    landed = tuple(sorted(p.uid for p in fresh if p.on_device and not p.finished))
    if landed:
        # A replacement was handed the quarantined device itself (a device-plugin node's kubelet
        # may hand out any device its plugin reports Healthy): it is moved too, by this move.
        # Those running elsewhere already are kept, so the moved pods' own replacements count.
        others = tuple(sorted(kept | {p.uid for p in fresh if p.uid not in landed}))
        again = _next(job, replace(ctx, targets=landed, kept=others))
        return replace(again, kept=others)
    running = sum(1 for p in fresh if p.running_healthy)
    needed = len(targets)
    if running >= needed:
        effects = (ReleaseLease(job.namespace, job.owner),) if job.lease_holder == ctx.identity else ()
        detail = f"{running} replacement pod(s) run on healthy devices"
        return Plan(MigrationOutcome.SUCCEEDED, effects, detail=detail, targets=targets, recovered=True)
    evicted_at = ctx.evicted_at if ctx.evicted_at is not None else ctx.now
    waited = ctx.now - evicted_at
    limit = ctx.settings.replacement_timeout_seconds
    if waited >= limit:
        reason = (
            f"the job's replacement pods did not run on healthy devices within {limit:.0f} s "
            f"({running} of {needed})"
        )
        return failed(job, ctx, reason, targets)
    detail = f"awaiting replacement: {running} of {needed} pod(s) run on healthy devices"
    # The job's lease is let go: nothing of it is being moved now, and another device's move of
    # the same job (a shardable job's other shard) may begin.
    effects = (ReleaseLease(job.namespace, job.owner),) if job.lease_holder == ctx.identity else ()
    return Plan(
        MigrationOutcome.WAITING,
        effects,
        detail=detail,
        recheck_seconds=min(limit - waited, CHECKPOINT_POLL_SECONDS),
        targets=targets,
        replacing=True,
    )


def choose_targets(job: JobView) -> tuple[str, ...]:
    """The pods to move: the whole job for a fixed topology, only the device's shard when every
    pod on the device declares `gpuhealth.io/topology: shardable`."""
    live = [p for p in job.pods if not p.finished and not p.terminating]
    on_device = [p for p in live if p.on_device]
    shardable = bool(on_device) and all(p.annotations.get(TOPOLOGY) == "shardable" for p in on_device)
    return tuple(sorted(p.uid for p in (on_device if shardable else live)))


def _done(job: JobView, ctx: Context, detail: str, targets: tuple[str, ...]) -> Plan:
    effects = (ReleaseLease(job.namespace, job.owner),) if job.lease_holder == ctx.identity else ()
    return Plan(MigrationOutcome.SUCCEEDED, effects, detail=detail, targets=targets)


def _unrecoverable(
    job: JobView, ctx: Context, pods: list[PodView], reason: str, targets: tuple[str, ...]
) -> Plan:
    effects: list[Effect] = []
    for p in pods:
        if p.on_device:
            effects.append(KeepEvidence(p.namespace, p.name, reason))
            effects.append(
                TellTenant(
                    p.namespace,
                    p.name,
                    UNRECOVERABLE_REASON,
                    f"the GPU this pod uses is quarantined and the pod could not be migrated: {reason}; "
                    "it keeps running until it ends or its owner moves it",
                )
            )
    if job.lease_holder == ctx.identity:
        effects.append(ReleaseLease(job.namespace, job.owner))
    return Plan(MigrationOutcome.UNRECOVERABLE, tuple(effects), detail=reason, targets=targets)


def failed(job: JobView, ctx: Context, reason: str, targets: tuple[str, ...]) -> Plan:
    """The move stops for good: the tenant of every pod on the device told, the lease released."""
    message = f"the GPU this pod uses is quarantined and moving the pod failed: {reason}"
    effects: list[Effect] = [
        TellTenant(p.namespace, p.name, FAILED_REASON, message) for p in job.pods if p.on_device
    ]
    if job.lease_holder == ctx.identity:
        effects.append(ReleaseLease(job.namespace, job.owner))
    return Plan(MigrationOutcome.FAILED, tuple(effects), detail=reason, targets=targets)


# ----- an eviction's answer --------------------------------------------------------------------------


class Answer(StrEnum):
    """What the Eviction API's answer means for the move."""

    EVICTED = "Evicted"
    WAIT = "Wait"
    """A disruption budget allows none now (429): wait `seconds`, then try again."""
    GONE = "Gone"
    """The pod is gone or was replaced (404, 409): nothing left to evict."""
    RETRY = "Retry"
    """A server error (a 503, a 500 that is not the budgets' refusal, no answer): try again."""
    FAILED = "Failed"
    """Refused for good (403, a pod under several budgets): retrying unchanged cannot help."""


@dataclass(frozen=True, slots=True)
class EvictionVerdict:
    answer: Answer
    seconds: float = 0.0
    """WAIT: how long."""


def judge_eviction(
    status: int | None, *, temporary: bool, message: str = "", retry_after: float | None = None
) -> EvictionVerdict:
    """The meaning of the Eviction API's answer (`status`: the HTTP status, None: no answer;
    `temporary`: the client's judgement of the status as a server-side, passing error)."""
    if status is not None and 200 <= status < 300:
        return EvictionVerdict(Answer.EVICTED)
    if status == 429:
        return EvictionVerdict(Answer.WAIT, max(EVICTION_RETRY_FLOOR_SECONDS, retry_after or 0.0))
    if status in (404, 409):
        return EvictionVerdict(Answer.GONE)
    several = status == 500 and SEVERAL_BUDGETS in message
    if status is None or (temporary and not several):
        # Found by `gpuhealth chaos`: an injected 500 used to fail a move for good. The lease
        # cap still ends a move that never gets through.
        return EvictionVerdict(Answer.RETRY)
    # A loop of evictions is what a person must never find.
    return EvictionVerdict(Answer.FAILED)


# ----- the caps, from the records -----------------------------------------------------------------


def node_slot_free(
    on_node: Iterable[Migration], now: float, *, in_flight_limit: int, per_hour_limit: int
) -> bool:
    """Whether a move may start on a node whose other moves (every record's on that node, this
    job's own excepted) are `on_node`: fewer than `in_flight_limit` in flight (their lease
    taken, no outcome yet, not merely awaiting their job's replacements elsewhere: their pods
    have left the node) and fewer than `per_hour_limit` started within the hour."""
    moves = list(on_node)
    in_flight = sum(1 for m in moves if m.started_at and not m.outcome.finished and not m.replacing_since)
    started = [parse_rfc3339(m.started_at) for m in moves if m.started_at]
    this_hour = sum(1 for t in started if t is not None and now - t < HOUR)
    return in_flight < in_flight_limit and this_hour < per_hour_limit


def evictions_left(namespace: str, moves: Iterable[Migration], now: float, *, per_hour_limit: int) -> int:
    """Evictions the namespace's hourly cap still allows, counted from every record's moves."""
    times = [parse_rfc3339(t) for m in moves if m.namespace == namespace for t in m.evictions]
    recent = sum(1 for t in times if t is not None and now - t < HOUR)
    return max(0, per_hour_limit - recent)
