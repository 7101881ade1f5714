"""The reconciler: the level-triggered loop that drives every DeviceQuarantine through its phases.

An executor. Every decision is `responder.reconcile.policy.step`'s; this observes, applies the effects
and writes the records, one pass over all of them at a time:

1. Observe: list every record (a fresh list each pass, see below); the breaker's state (its
   ConfigMap, so a person's reset is seen at the next pass); every device's health from the
   `HealthSource` (one snapshot per pass; when it fails, a snapshot in which every device is
   Unavailable, so the pass still enforces and moves, and only releases wait); per record,
   what it needs: whether gpuhealth's enforcement is present, the node's opt-out label
   (Pending only), the Job of the current attempt's check (on a check rung of the release ladder
   only), or its reset request (on the reset rung, `responder.reset`).
2. Rebuild the guardrails from the records, never from memory: the breaker's counts
   (eligible = devices the health source knows; automatic quarantine starts from the records'
   history; devices under enforcement now) and the new-quarantine bucket (`Bucket.replay` of
   automatic quarantines' enforcement times). A restarted or new leader therefore hands out
   no second burst and trips no later than the one before it.
3. Per record, the waiting ones (Pending, Deferred) first, then the others, each oldest first
   (the rate limit serves waiting records in their order, and a new quarantine never waits
   behind the moves and checks of records already enforced): `step`, apply its effects
   (enforcement, checks, the breaker's state with an audit entry), then write the record:
   spec through the resource if it changed, status through the status subresource, both
   conditional on the resourceVersion read (409: the next pass decides again from what is
   stored; effects are idempotent). An admission (Pending or Deferred to
   Quarantined) is the exception: its record is written first and enforced after, so that
   no exclusion exists that the counts do not see. The bucket and the counts change within
   the pass at each admission, so a storm in one pass trips the breaker.
   The Events of the records stored are emitted once every record is decided, so that no
   Event's round trip holds back the next record's enforcement.
   Any exception of one record is that record's outcome (logged, counted) and never stops
   the pass: the record is decided again after its own backoff (`retry_backoff`, at least a
   server's Retry-After), not after the recheck cap; a pass whose own reads failed likewise.
4. Sleep until the smallest `recheck_seconds` (capped), or until a watched record changes.

Why a fresh list per pass plus a watch that only wakes the loop, rather than a cache kept
by the watch: every pass needs every record anyway (counts, bucket), and the conditional
writes need the resourceVersion of the latest object. A cache lags the pass's own writes, so
the next pass would decide on stale objects and get 409s; one list per pass (a few hundred
records, paged) costs less than those retries and cannot be stale.

Leadership: `run(term)` is what the responder runs inside `LeaderElector.run`. A pass runs in
a thread of its own (never the event loop's default executor, where webhook deliveries queue);
when the term is fenced (the task cancelled), the pass is told to stop
before its next record or write, and the task returns only after the thread has finished, so
nothing acts for a leader that has stopped leading (at most the one request in flight lands).

The migration hook: `migrate(record, now) -> Quarantine` (`responder.migrate.executor`) is called for
`quarantine` records (never `restrict`) that stay Quarantined with their enforcement present,
also after their alerts resolved (the policy starts no release attempt while a move has not
evicted what it moves, so a move is carried to its end, never dropped), and on a rung of the
release ladder while a move awaits its job's replacements (it only advances those moves there);
while the breaker is tripped `finish` is called instead (moves under way go on, none begins);
its record is written like the policy's.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from gpuhealth import instruments
from gpuhealth.clock import Clock, SystemClock
from gpuhealth.kube.api import Api
from gpuhealth.kube.backoff import Backoff, WatchBackoff
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.elector import Term
from gpuhealth.kube.errors import ApiError, Conflict
from gpuhealth.kube.meta import parse_rfc3339, rfc3339
from gpuhealth.kube.resources import NODE, STATUS
from responder import metrics
from responder.checks.jobs import CheckRunner, JobChecks
from responder.enforce.hold import DeviceHold
from responder.enforce.hold_plan import HoldState
from responder.enforce.observed import Observed
from responder.ladder import KNOWN, Kind, Ladder, Rung, with_reset
from responder.reconcile import breaker
from responder.reconcile.accounting import QuarantineAccounting
from responder.reconcile.breaker import BreakerState, Counts
from responder.reconcile.breaker_store import AuditEntry, Stored
from responder.reconcile.card_hold import CardHolding
from responder.reconcile.escalation import EscalationSettings
from responder.reconcile.escalator import Escalator
from responder.reconcile.events import EventSink
from responder.reconcile.health import HealthSnapshot, HealthSource, HealthUnavailable
from responder.reconcile.identification import Enforcement, Identification
from responder.reconcile.limits import Bucket, BucketSettings
from responder.reconcile.loop import run_passes
from responder.reconcile.policy import (
    ACTOR,
    CheckResult,
    Context,
    DeviceView,
    Enforce,
    Notify,
    PolicySettings,
    SaveBreaker,
    StartCheck,
    StartReset,
    Step,
    Unenforce,
    holding,
    needs_holders,
)
from responder.reconcile.policy import step as policy_step
from responder.records import (
    ENDED_PHASES,
    HELD,
    QUARANTINES,
    Phase,
    Quarantine,
    RecordError,
    from_object,
    quarantine_starts,
    to_object,
)

log = logging.getLogger(__name__)

OPT_OUT_LABEL = "gpuhealth.io/remediation"
OPT_OUT_VALUE = "disabled"
DONE_PHASES = frozenset(ENDED_PHASES)

Migrate = Callable[[Quarantine, float], Quarantine]


class Holders(Protocol):
    def of(self, record: Quarantine) -> tuple[str, ...]:
        """Pods (`namespace/name`) holding the record's device, gpuhealth's own checks aside."""
        ...


class BreakerStorage(Protocol):
    def read(self) -> Stored: ...

    def write(self, state: BreakerState, entry: AuditEntry) -> Stored: ...


def _default_bucket() -> BucketSettings:
    return BucketSettings(burst=20, per_hour=120.0)


UNWATCHED_RECHECK_SECONDS = 5.0
"""Longest sleep between passes while a record waits on what no watch reports: a probe or
canary Job running, or a migration in flight."""
WAITS_ON_EXECUTOR = frozenset({Kind.CHECK, Kind.RESET})
"""Rungs whose result an executor reports (a check's Job, a reset request): read each pass."""


@dataclass(frozen=True, slots=True)
class ReconcilerSettings:
    policy: PolicySettings = field(default_factory=PolicySettings)
    bucket: BucketSettings = field(default_factory=_default_bucket)
    escalation: EscalationSettings = field(default_factory=EscalationSettings)
    """When a node's failing cards are the node's (`responder.reconcile.escalation`)."""
    """New automatic quarantines: 20 at once, 120 an hour sustained. Below the breaker's rate
    trigger on a large fleet, so a slow trickle of real failures is served while a burst waits
    (Pending, RateLimited) for a person or the breaker to judge it."""
    max_recheck_seconds: float = 30.0
    """Longest sleep between passes: bounds how late an unwatched change (health, a Job's
    status, a node's label) is acted on."""
    page_size: int = 500
    """Objects per list page (records, DeviceTaintRules, nodes)."""
    list_nodes_from: int = 50
    """Distinct nodes under active records from which a pass lists the nodes (paged, keeping
    those) rather than reading each one: at 50 a read of each is 50 round trips, a list of a
    12,500-node cluster 25 pages. Below it, a few reads move less than a list of every node."""
    watch_timeout_seconds: int = 60
    """Server-side length of one watch of the records (the reflector resumes at once)."""
    watch_backoff: WatchBackoff = field(default_factory=WatchBackoff)
    retry_backoff: WatchBackoff = field(default_factory=WatchBackoff)
    """When a record whose read or write failed (or a pass whose list of the records failed)
    is decided again: 1 s, doubling per consecutive failure of that record up to 30 s, at least
    a server's Retry-After. Not `max_recheck_seconds`: at a quarter of requests failing, most
    records would otherwise wait a whole recheck for a retry."""


@dataclass(frozen=True, slots=True)
class PassReport:
    """What one pass came to: each record's outcome and when the next pass is due."""

    outcomes: dict[str, str]
    next_seconds: float
    skipped: str = ""
    """Why the pass decided nothing (the API or the breaker's ConfigMap unreadable, fenced);
    empty when it ran."""


class Fenced(Exception):
    """The term ended during the pass: stop before acting again."""


@dataclass(slots=True)
class _PassState:
    now: float
    breaker: BreakerState
    counts: Counts
    bucket: Bucket
    seen: Observed
    """What the pass read once for every record (slices, DeviceTaintRules, nodes), its writes applied."""
    notices: list[tuple[Quarantine, Notify]] = field(default_factory=list)
    """Events of records stored this pass, emitted once every record is decided."""


class ReconcilerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.quarantined = instruments.gauge(metrics.DEVICE_QUARANTINED, registry)
        self.created = instruments.gauge(metrics.QUARANTINE_CREATED, registry)
        self.breaker_tripped = instruments.gauge(metrics.BREAKER_TRIPPED, registry)
        self.releases = instruments.counter(metrics.RELEASES, registry)
        self.rate_limited = instruments.gauge(metrics.RATE_LIMITED, registry)
        self.decision = instruments.histogram(metrics.DECISION_SECONDS, registry)
        self.passes = instruments.counter(metrics.RECONCILE_PASSES, registry)
        self.records = instruments.counter(metrics.RECONCILE_RECORDS, registry)
        self.health_source_up = instruments.gauge(metrics.HEALTH_SOURCE_UP, registry)
        self.checks = instruments.counter(metrics.RELEASE_CHECKS, registry)
        self.hold = instruments.gauge(metrics.DEVICE_HOLD, registry)
        self.holder_pods = instruments.gauge(metrics.HOLDER_PODS, registry)
        self._holds: set[tuple[str, str, str]] = set()
        # Every outcome from zero, so increase() counts the first release or record of each.
        for outcome in metrics.RELEASE_OUTCOMES:
            self.releases.labels(outcome)
        for outcome in metrics.RECORD_OUTCOMES:
            self.records.labels(outcome)
        for rung in KNOWN.rungs:
            if rung.kind in WAITS_ON_EXECUTOR:
                for verdict in metrics.CHECK_VERDICTS:
                    self.checks.labels(rung.name, verdict)
        self._series: set[tuple[str, str, str, str]] = set()
        self._created: set[tuple[str, str]] = set()

    def clear(self) -> None:
        self.publish((), tripped=False)
        self.health_source_up.set(0)

    def publish(self, records: Iterable[tuple[Quarantine, float | None]], tripped: bool) -> None:
        """One series per active record (removed once released or abandoned)."""
        series: set[tuple[str, str, str, str]] = set()
        created: dict[tuple[str, str], float] = {}
        holds: set[tuple[str, str, str]] = set()
        waiting = 0
        for record, created_at in records:
            held = record.status.condition(HELD)
            if held is not None:
                holds.add((record.spec.node, record.spec.device, held.reason))
            if record.status.phase in DONE_PHASES:
                continue
            spec = record.spec
            series.add((spec.node, spec.device, spec.reason, str(record.status.phase)))
            if created_at is not None:
                created[(spec.node, spec.device)] = created_at
            if record.status.phase == Phase.PENDING and record.status.phase_reason == "RateLimited":
                waiting += 1
        for gone in self._series - series:
            self.quarantined.remove(*gone)
        for labels in series:
            self.quarantined.labels(*labels).set(1)
        for gone_device in self._created - set(created):
            self.created.remove(*gone_device)
        for device, at in created.items():
            self.created.labels(*device).set(at)
        for gone_hold in self._holds - holds:
            self.hold.remove(*gone_hold)
        for hold in holds:
            self.hold.labels(*hold).set(1)
        self._series, self._created, self._holds = series, set(created), holds
        self.rate_limited.set(waiting)
        self.breaker_tripped.set(1 if tripped else 0)


def node_opted_out(node: Mapping[str, Any]) -> bool:
    """Whether a Node is opted out of remediation (its `gpuhealth.io/remediation` label)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(OPT_OUT_LABEL) == OPT_OUT_VALUE)


def enforced(record: Quarantine) -> bool:
    """Whether the record's phase has gpuhealth's enforcement in place (Quarantined, or any rung
    of the release ladder): what the breaker's capacity counts. Pending and Deferred records are
    recorded only; counting them would let the record being admitted count against itself."""
    return record.status.phase not in (Phase.PENDING, Phase.DEFERRED, *DONE_PHASES)


def opened_at(record: Quarantine, created: float | None) -> float | None:
    """When the record's current quarantine was opened: its first history entry after the last
    release or abandonment (the object is reused for the device's next quarantine, so its
    creationTimestamp can be weeks older); `created` when the history says nothing."""
    opened: float | None = None
    previous_done = True
    for entry in record.status.history:
        if previous_done and entry.phase not in DONE_PHASES:
            opened = parse_rfc3339(entry.time)
        previous_done = entry.phase in DONE_PHASES
    return opened if opened is not None else created


def automatic(record: Quarantine) -> bool:
    return record.spec.actor.startswith("alert/")


def guardrails(
    records: Sequence[Quarantine],
    eligible: int | None,
    state: BreakerState,
    *,
    now: float,
    settings: ReconcilerSettings,
    escalated: Sequence[tuple[float, int]] = (),
) -> tuple[Counts, Bucket]:
    """The breaker's counts and the new-quarantine bucket, rebuilt from the records (pure) and
    the standing node escalations (`escalated`: when each was made, the GPUs it takes out)."""
    starts = [
        (f"{r.spec.node}\x00{r.spec.device}", at)
        for r in records
        if automatic(r)
        for at in quarantine_starts(r)
    ]
    active = [f"{r.spec.node}\x00{r.spec.device}" for r in records if enforced(r)]
    # A node escalated counts as the GPUs its taint takes out beyond its failing cards.
    for i, (at, gpus) in enumerate(escalated):
        starts.extend((f"escalated\x00{i}\x00{n}", at) for n in range(gpus))
        active.extend(f"escalated\x00{i}\x00{n}" for n in range(gpus))
    counts = breaker.count(eligible, starts, active, now=now, settings=settings.policy.breaker)
    bucket = Bucket.replay(settings.bucket, (at for _, at in starts), now)
    return counts, bucket


def _pass_order(entry: tuple[dict[str, Any], Quarantine]) -> tuple[bool, str, str]:
    """Waiting records (Pending, Deferred) first, then the others, each oldest first: the rate
    limit serves waiting records in their order, and a new quarantine never waits behind the
    moves and checks of records already enforced (a migration's reads of one record's pods are
    tens of milliseconds against a real apiserver)."""
    obj, record = entry
    created = str((obj.get("metadata") or {}).get("creationTimestamp") or "")
    return record.status.phase not in (Phase.PENDING, Phase.DEFERRED), created, record.name


def _decoded(
    items: Iterable[dict[str, Any]], ladder: Ladder
) -> tuple[list[tuple[dict[str, Any], Quarantine]], list[str]]:
    """The listed objects with their records, and the names of those that are unreadable (logged)."""
    entries: list[tuple[dict[str, Any], Quarantine]] = []
    unreadable: list[str] = []
    for obj in items:
        try:
            entries.append((obj, from_object(obj, ladder)))
        except RecordError as exc:
            name = str((obj.get("metadata") or {}).get("name") or "?")
            log.error("record %s is unreadable, left alone: %s", name, exc)
            unreadable.append(name)
    return entries, unreadable


class Reconciler:
    def __init__(
        self,
        client: Api,
        *,
        enforcer: Enforcement,
        health: HealthSource,
        checks: CheckRunner,
        events: EventSink,
        breaker_store: BreakerStorage,
        settings: ReconcilerSettings | None = None,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        migrate: Migrate | None = None,
        watch_client: KubeClient | None = None,
        holders: Holders,
        finish: Migrate | None = None,
        resets: CheckRunner | None = None,
        hold: DeviceHold | None = None,
        hold_aside: Callable[[Quarantine], bool] | None = None,
        escalator: Escalator | None = None,
    ) -> None:
        """`watch_client`: a client for the records' watch that wakes the loop (None: passes
        come only every recheck); give it its own client, closed by the caller at shutdown.
        `holders`: who holds a device (`responder.enforce.holders` over the same backends).
        `finish`: the migration hook while the breaker is open (`Migrator.finish`: moves under
        way go on, none begins); None: no move is advanced while it is open.
        `resets`: the reset hand-off (`responder.reset`), required when the ladder has the reset rung.
        `hold`: the holder pods of device-plugin cards (`responder.enforce.hold`); None: the
        extender's count alone keeps new pods off them. `hold_aside`: whether a record's checks
        get its card through the kubelet, so that the hold steps aside for them (the check
        route, `responder.enforce.node_annotation.NodeAnnotation.through_kubelet`); None: never.
        `escalator`: node escalations (`responder.reconcile.escalator`); None: none."""
        self._client = client
        self._enforcer = enforcer
        self._health = health
        self._checks = checks
        self._resets = resets
        self._events = events
        self._store = breaker_store
        self.settings = settings or ReconcilerSettings()
        self._identification = Identification(enforcer, self.settings.policy)
        if self.settings.policy.ladder.resets() and resets is None:
            raise ValueError("the release ladder has a reset rung: the reconciler needs its reset hand-off")
        self._clock = clock or SystemClock()
        registry = registry if registry is not None else CollectorRegistry()
        self.metrics = ReconcilerMetrics(registry)
        self.accounting = QuarantineAccounting(
            registry, ladder=self.settings.policy.ladder, dry_run=self.settings.policy.dry_run
        )
        self._migrate = migrate
        self._finish = finish
        self._escalator = escalator
        self._watch_client = watch_client
        self._holders = holders
        self._hold = hold
        self._holding = (
            None
            if hold is None
            else CardHolding(hold, self.settings.policy, hold_aside or (lambda _record: False))
        )
        self._eligible: int | None = None
        """Devices the health source knew at its last answer: what the breaker counts against
        while it gives none (None before the first: the breaker's floors are its limits)."""
        self._retries: dict[str, Backoff] = {}
        """Per record name (and "" for the pass's own reads): the backoff of its consecutive
        failures. In memory only: it times retries, it decides nothing."""

    # ----- the loop -----------------------------------------------------------------------------

    async def run(self, term: Term | None = None) -> None:
        """Pass after pass until cancelled (the term fenced); acts only inside a pass
        (`responder.reconcile.loop`: the watches that wake it, the passes' own thread)."""
        try:
            await run_passes(
                lambda fence: self.reconcile_once(fence).next_seconds,
                term,
                watch_client=self._watch_client,
                settings=self.settings,
                holders_namespace=None if self._hold is None else self._hold.namespace,
                checks_namespace=self._checks.settings.namespace
                if isinstance(self._checks, JobChecks)
                else None,
            )
        finally:
            # A replica that no longer leads exposes nothing about the records: the rules take
            # max() over replicas, and a stale series would keep a released device counted.
            self.metrics.clear()
            self.accounting.term_ended()
            if self._escalator is not None:
                self._escalator.clear()

    # ----- one pass -----------------------------------------------------------------------------

    def reconcile_once(self, fence: threading.Event | None = None) -> PassReport:
        """One pass over every record (blocking; `run` calls it in a thread)."""
        fence = fence or threading.Event()
        cap = self.settings.max_recheck_seconds
        now = self._clock.now()
        try:
            listed = self._client.list(QUARANTINES, page_size=self.settings.page_size)
            stored = self._store.read()
            # Once a pass, not per record: a Ladder validates its rungs when built (about 0.1 ms
            # each under the profiler; bench/results.md, responder_pass).
            ladder = with_reset(self.settings.policy.ladder)
            entries, unreadable = _decoded(listed.items, ladder)
            # One read of what every record's enforcement is judged by, not a GET per record
            # (68 % of a 10,000-record pass was one GET of each record's rule).
            nodes = {r.spec.node for _, r in entries if r.status.phase not in DONE_PHASES}
            seen = self._enforcer.observe(
                nodes,
                list_nodes=len(nodes) >= self.settings.list_nodes_from,
                page_size=self.settings.page_size,
            )
        except Exception as exc:  # an API outage decides nothing: the pass is tried again soon
            retry = self._retry_after("", exc)
            log.warning("reconcile pass skipped: %s; again in %.1f s", exc, retry)
            return PassReport({}, min(cap, retry), skipped=str(exc))
        self._retries.pop("", None)
        standing = self._standing_escalations()
        outcomes = dict.fromkeys(unreadable, "error")
        for _ in unreadable:
            self.metrics.records.labels("error").inc()
        snapshot = self._read_health(now)
        eligible = snapshot.eligible if snapshot.available else self._eligible
        entries.sort(key=_pass_order)
        records = [record for _, record in entries]
        load = (
            []
            if self._escalator is None or standing is None
            else self._escalator.load(standing, records, seen)
        )
        counts, bucket = guardrails(
            records, eligible, stored.state, now=now, settings=self.settings, escalated=load
        )
        state = _PassState(now=now, breaker=stored.state, counts=counts, bucket=bucket, seen=seen)
        rechecks: list[float] = []
        final: list[tuple[Quarantine, float | None]] = []
        try:
            fenced = self._decide_all(entries, snapshot, state, fence, outcomes, rechecks, final)
        finally:
            self._emit_notices(state, fence)
        if fenced:
            return PassReport(outcomes, 0.0, skipped="fenced")
        if self._escalator is not None and standing is not None:
            # After every record is decided: the node is judged on the pass's records as stored.
            state.bucket = self._escalator.pass_over(
                [record for record, _ in final],
                standing,
                seen,
                state=state.breaker,
                counts=state.counts,
                bucket=state.bucket,
                now=now,
                fence=fence,
            )
        for gone in self._retries.keys() - outcomes.keys() - {""}:
            del self._retries[gone]  # deleted records keep no backoff
        self.metrics.publish(final, state.breaker.tripped)
        if self._hold is not None:
            for gone in self._hold.pods.keys() - outcomes.keys():
                del self._hold.pods[gone]  # a deleted record's holders went with it
            self.metrics.holder_pods.set(sum(self._hold.pods.values()))
        self.accounting.passed(now, records, (record for record, _ in final))
        self.metrics.passes.inc()
        wait = min([cap, *rechecks])
        return PassReport(outcomes, max(0.0, wait) if math.isfinite(wait) else cap)

    def _decide_all(
        self,
        entries: Sequence[tuple[dict[str, Any], Quarantine]],
        snapshot: HealthSnapshot,
        state: _PassState,
        fence: threading.Event,
        outcomes: dict[str, str],
        rechecks: list[float],
        final: list[tuple[Quarantine, float | None]],
    ) -> bool:
        """Each record decided, applied and written in turn (`outcomes`, `rechecks` and `final`
        filled); True when the term was fenced before the last."""
        for obj, record in entries:
            if fence.is_set():
                return True
            started = time.perf_counter()
            try:
                outcome, after, recheck = self._one(obj, record, snapshot, state, fence)
            except Fenced:
                return True
            except Conflict as exc:
                # Someone wrote meanwhile: decide again from what is stored, soon but not in a
                # tight loop should the conflicts go on.
                outcome, after, recheck = "conflict", record, self._retry_after(record.name, exc)
            except Exception as exc:
                # This record's failure, never the pass's: the others are decided as usual,
                # and this one again after its own backoff.
                retry = self._retry_after(record.name, exc)
                if isinstance(exc, ApiError):
                    log.warning("record %s: %s; again in %.1f s", record.name, exc, retry)
                else:
                    log.exception("record %s: %s", record.name, exc)
                outcome, after, recheck = "error", record, retry
            else:
                if outcome != "error":
                    self._retries.pop(record.name, None)
            self.metrics.decision.observe(time.perf_counter() - started)
            self.metrics.records.labels(outcome).inc()
            outcomes[record.name] = outcome
            if recheck is not None:
                rechecks.append(recheck)
            created = parse_rfc3339(str(obj.get("metadata", {}).get("creationTimestamp") or ""))
            final.append((after, opened_at(after, created)))
        return False

    def _standing_escalations(self) -> dict[str, dict[str, Any]] | None:
        """The escalated Nodes; None when there is no escalator or they cannot be listed: the
        pass then judges no node (its records are decided as ever), and the next one does."""
        if self._escalator is None:
            return None
        try:
            return self._escalator.standing(self.settings.page_size)
        except Exception as exc:
            log.warning("escalated nodes not listed (%s): no node judged this pass", exc)
            return None

    def _read_health(self, now: float) -> HealthSnapshot:
        """This pass's device health; `HealthSnapshot.unavailable()` when the source fails, so
        that an outage of Prometheus holds back only what needs Healthy evidence (releases),
        never the enforcement a firing alert warrants nor a move."""
        try:
            snapshot = self._health.snapshot(now)
        except Exception as exc:
            if not isinstance(exc, HealthUnavailable):
                log.exception("health source failed: %s", exc)
            log.warning("device health unavailable (%s): quarantines and moves go on, releases wait", exc)
            self.metrics.health_source_up.set(0)
            return HealthSnapshot.unavailable()
        self.metrics.health_source_up.set(1)
        self._eligible = snapshot.eligible
        return snapshot

    def _one(
        self,
        obj: dict[str, Any],
        record: Quarantine,
        snapshot: HealthSnapshot,
        state: _PassState,
        fence: threading.Event,
    ) -> tuple[str, Quarantine, float | None]:
        """(outcome, the record as it now stands, recheck seconds) for one record."""
        phase = record.status.phase
        if phase in DONE_PHASES:
            if record.status.condition(HELD) is None or self._holding is None:
                return "unchanged", record, None
            # The pass that ended the quarantine could not let its card go: let it go now.
            after, _ = self._holding.held(record, state.now)
            return ("written" if self._write(obj, record, after, fence) else "unchanged"), after, None
        moved: Exception | None = None
        partitions = snapshot.partitions_of(record.spec.node, record.spec.device)
        current = self._identification.resolve(
            record, state.seen, partitions, snapshot.profiles_of(partitions), state.now
        )
        if not current.spec.path:
            # No backend claims the device yet: nothing is decided or enforced on a guess, and
            # it is looked at again soon (a slice being republished, a node being registered).
            written = current is not record and self._write(obj, record, current, fence)
            return ("written" if written else "unchanged"), current, UNWATCHED_RECHECK_SECONDS
        view = self._observe(current, snapshot, state)
        ctx = Context(
            now=state.now,
            settings=self.settings.policy,
            breaker=state.breaker,
            counts=state.counts,
            bucket=state.bucket,
        )
        decided = policy_step(current, view, ctx)
        if self._holding is not None and self._enforcer.holds_card(current):
            decided = self._holding.step(decided, state.now)
        after = decided.record
        admitted = phase in (Phase.PENDING, Phase.DEFERRED) and enforced(after)
        if admitted:
            # An admission writes its record first, then enforces: a write that loses a
            # conflict leaves nothing enforced (decided again next pass, against counts that
            # never saw it), and an enforcement that fails after the write is put back by the
            # Quarantined record's restore. Enforcing first let a lost write hide an exclusion
            # from the counts, so the same pass admitted one more device over the breaker's limit.
            self._write(obj, record, after, fence)
            self._count_admission(decided, state)
        self._apply(current, decided, state, fence)
        hook = self._finish if state.breaker.tripped else self._migrate
        awaiting = any(m.replacing_since and not m.outcome.finished for m in after.status.migrations)
        if (
            hook is not None
            and after.spec.action == "quarantine"
            and phase == after.status.phase
            and (
                phase == Phase.QUARANTINED
                or (awaiting and self.settings.policy.rungs.rung(phase) is not None)
            )
            and view.enforcement_present
        ):
            # Also once the alerts resolved: the policy holds the release attempt back until
            # every move has ended (MigrationInFlight), and only this call ends them.
            try:
                after = hook(after, state.now)
            except Fenced:
                raise
            except Exception as exc:
                # The device's pods could not be read: the policy's decision is still written,
                # and the move is tried again on this record's backoff (not at the recheck cap).
                moved = exc
        recheck = decided.recheck_seconds
        rungs = self.settings.policy.rungs
        on_check = rungs.rung(after.status.phase)
        held = after.status.condition(HELD)
        if (
            (on_check is not None and on_check.kind in WAITS_ON_EXECUTOR)
            or any(not m.outcome.finished for m in after.status.migrations)
            or (
                held is not None
                and held.reason in (HoldState.FILLING, HoldState.CARD_BUSY, HoldState.NOT_ALLOCATABLE)
            )
        ):
            # A check Job, a move or a hold waits on objects the reconciler does not watch (the
            # Job's status; checkpoint commits, terminations; the holders' devices; a card its
            # plugin let back, which the extender keeps new pods from until a fill holds it):
            # look again soon rather than at the policy's deadline (a 2-minute probe read only at
            # its 10-minute timeout).
            recheck = min(recheck if recheck is not None else math.inf, UNWATCHED_RECHECK_SECONDS)
        written = admitted or self._write(obj, record, after, fence)
        # Notices only once the record is stored: a failed write is decided again next pass,
        # its notice with it, and an Event per attempt would tell of one failure twice.
        state.notices.extend((record, e) for e in decided.effects if isinstance(e, Notify))
        judged = after.status.last_check
        if written and judged is not None and judged != record.status.last_check:
            self.metrics.checks.labels(judged.check, judged.verdict.value.lower()).inc()
        left = rungs.rung(phase)
        if written and left is not None and left.kind in WAITS_ON_EXECUTOR and after.status.phase != phase:
            # Only once the record says it moved on: a 409 leaves the result to be read again.
            self._runner(left).finish(record, left.name, record.status.attempt)
        if phase != after.status.phase and after.status.phase in DONE_PHASES:
            self.metrics.releases.labels("dismissed" if phase == Phase.DEFERRED else "released").inc()
            self.accounting.quarantine_ended(after)
        if moved is not None:
            retry = self._retry_after(record.name, moved)
            log.warning(
                "record %s: its work could not be moved: %s; again in %.1f s", record.name, moved, retry
            )
            return "error", after, retry
        return ("written" if written else "unchanged"), after, recheck

    @staticmethod
    def _count_admission(decided: Step, state: _PassState) -> None:
        """The pass's counts and bucket after an admission, so that a storm in one pass trips."""
        state.counts = replace(state.counts, quarantined=state.counts.quarantined + 1)
        if decided.took_token:
            _, state.bucket = state.bucket.take(state.now)
            state.counts = replace(state.counts, started_in_window=state.counts.started_in_window + 1)

    def _observe(self, record: Quarantine, snapshot: HealthSnapshot, state: _PassState) -> DeviceView:
        phase = record.status.phase
        device = snapshot.of(record.spec.node, record.spec.device)
        rung = self.settings.policy.rungs.rung(phase)
        return DeviceView(
            health=device.health,
            healthy_since=device.healthy_since,
            # Asked in every phase: a Pending or Deferred record may find an enforcement left
            # by an older responder that enforced before writing (policy removes it when deferring).
            # An active record's must be what its phase holds: a quarantine taint turned canary
            # by hand, or an edited ramp bound, is put back like a deleted one.
            enforcement_present=self._enforcer.present(
                record,
                None if phase in (Phase.PENDING, Phase.DEFERRED) else holding(record, self.settings.policy),
                state.seen,
            ),
            enforced_as=self._enforcer.enforced_as(record),
            node_opted_out=phase == Phase.PENDING and self._opted_out(record.spec.node, state),
            check=(
                self._runner(rung).result(record, rung.name, record.status.attempt)
                if rung is not None and rung.kind in WAITS_ON_EXECUTOR
                else CheckResult.ABSENT
            ),
            # Only when a release attempt would start: a list of the node's pods (and claims).
            holders=self._holders.of(record) if needs_holders(record, state.now) else (),
        )

    def _runner(self, rung: Rung) -> CheckRunner:
        """The executor of a rung that waits on one: a check's Jobs, or the reset hand-off."""
        if rung.kind == Kind.RESET:
            if self._resets is None:  # refused at construction; a ladder cannot gain it later
                raise ValueError("no reset hand-off for the reset rung")
            return self._resets
        return self._checks

    def _retry_after(self, key: str, error: Exception) -> float:
        """The pause before `key` (a record, or "" for the pass) is tried again, its backoff grown."""
        backoff = self._retries.get(key)
        if backoff is None:
            backoff = self._retries[key] = Backoff(self.settings.retry_backoff)
        server = error.retry_after if isinstance(error, ApiError) else None
        return backoff.next_delay(server or 0.0)

    def _opted_out(self, node: str, state: _PassState) -> bool:
        return node_opted_out(state.seen.get(NODE, node) or {})

    def _apply(self, record: Quarantine, decided: Step, state: _PassState, fence: threading.Event) -> None:
        for effect in decided.effects:
            if fence.is_set():
                raise Fenced
            if isinstance(effect, Enforce):
                self._enforcer.enforce(record, effect, state.seen)
            elif isinstance(effect, Unenforce):
                self._enforcer.unenforce(record, state.seen)
            elif isinstance(effect, StartCheck):
                self._checks.start(record, effect.kind, effect.attempt)
            elif isinstance(effect, StartReset):
                for rung in self.settings.policy.ladder.resets():
                    self._runner(rung).start(record, rung.name, effect.attempt)
            elif isinstance(effect, SaveBreaker):
                if effect.state.tripped and not state.breaker.tripped:
                    entry = AuditEntry(
                        time=rfc3339(state.now),
                        action="trip",
                        actor=ACTOR,
                        reason=f"{effect.state.trigger}: {effect.state.detail}",
                    )
                    self._store.write(effect.state, entry)
                    log.warning("circuit breaker tripped (%s): %s", effect.state.trigger, effect.state.detail)
                state.breaker = effect.state

    def _emit_notices(self, state: _PassState, fence: threading.Event) -> None:
        """The pass's Events, after its records: an Event's round trip never holds back the next
        record's enforcement (a sixth of each admission against a real apiserver, `bench/results.md`,
        "responder_cluster"). Dropped once the term is fenced: nothing acts for a leader that has
        stopped leading, and the records' history keeps the account."""
        if fence.is_set() and state.notices:
            log.warning("term ended: %d Event(s) of the pass not recorded", len(state.notices))
            return
        for record, notice in state.notices:
            try:
                self._events.emit(
                    record, notice.reason, notice.message, warning=notice.warning, now=state.now
                )
            except Exception as exc:
                # Best effort: the record's history is the durable account; a lost Event
                # must not hold the device's phase back.
                log.warning("%s: event %s not recorded: %s", record.name, notice.reason, exc)

    def _write(
        self, obj: dict[str, Any], before: Quarantine, after: Quarantine, fence: threading.Event
    ) -> bool:
        """Write what changed, conditionally; False when nothing did. Conflict propagates."""
        if after.spec == before.spec and after.status == before.status:
            return False
        if fence.is_set():
            raise Fenced
        wanted = to_object(after)
        current = obj
        if after.spec != before.spec:
            current = self._client.update(QUARANTINES, {**current, "spec": wanted["spec"]})
        if after.status != before.status:
            self._client.update(QUARANTINES, {**current, "status": wanted["status"]}, subresource=STATUS)
        return True
