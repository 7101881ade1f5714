"""The replay engine: deliveries through the webhook's intake, records through the reconciler's
policy, breaker and rate limit, on a virtual clock.

Pure: time is the timeline's, randomness is seeded per check (its verdict does not depend on the
order in which other checks were decided). What is the product's and what is modelled:
- the product's own functions decide: `responder.webhook.intake.decide` for every delivery,
  `responder.reconcile.policy.step` for every record, `responder.reconcile.breaker` and the
  `responder.reconcile.limits.Bucket` through the step's context, the release ladder of the
  given `PolicySettings`;
- the reconciler's executor is modelled: an effect is applied at once and always lands
  (`Enforce`, `Unenforce`), a check's verdict is the card's truth (`timeline.CheckTruth`), a record
  is stepped at the moments its step asks for, at its expiry and its backoff's end, when its
  device's health changes, when its check ends and when a delivery changes it (the real
  reconciler passes at least every 30 s: that latency is left out);
- a move of work off a quarantined device begins when a `quarantine` record's episode begins on a
  device that may have run work (it was open to all, or on the ramp; with the workload's pods
  placed: a pod holds it, a restriction the intake upgraded to quarantine included):
  `responder.migrate.plan.moves_for` adds it to the record (one job per device, once per
  episode, never for a `restrict`), and it succeeds `move_seconds` later, so the policy's wait
  for an unfinished move is the product's; the move's own steps (lease, checkpoint, evictions,
  their caps) are not walked;
- nobody resets a tripped breaker: the backlog stays Deferred until the timeline ends.

The pods holding each device (`holders`) are optional. In a recorded run they are what the run
saw. In a modelled replay they are where the workload would place its pods, and the engine keeps
the product's effects on them: a move of the device's work that succeeds ends the holdings current
then (its pods were evicted), and a pod the workload would place while the device is excluded
lands elsewhere (the scheduler skips an excluded device), so it never holds it. A release attempt
waits for the device to be free (DeviceInUse) either way.

`replay_recorded` plays what a run recorded instead of what the alerting model and the check truth
derive: the notifications the responder received and the verdicts its checks reached, at their
recorded times (the timeline then gives only the devices' health, and the move time).
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import count

from gpuhealth.kube.meta import parse_rfc3339
from responder.ladder import Kind
from responder.migrate.plan import Holder, moves_for
from responder.reconcile import breaker
from responder.reconcile.breaker import BreakerState
from responder.reconcile.limits import Bucket, BucketSettings
from responder.reconcile.policy import (
    CheckResult,
    Context,
    DeviceView,
    Enforce,
    PolicySettings,
    SaveBreaker,
    StartCheck,
    StartReset,
    Step,
    Unenforce,
    step,
)
from responder.records import ENDED_PHASES, MigrationOutcome, Phase, Quarantine
from responder.replay.alerting import AlertEpisode, RuleTimings, episodes
from responder.replay.outcomes import DeviceKey, Ledger, Replay
from responder.replay.readings import Readings
from responder.replay.timeline import Frame, Timeline
from responder.webhook.alerts import FIRING, QUARANTINE, RESOLVED, Alert
from responder.webhook.intake import IntakeSettings, Write, decide

RECORDED_ONLY = frozenset({Phase.PENDING, Phase.DEFERRED, *ENDED_PHASES})
"""Phases in which gpuhealth has nothing enforced for a record (the breaker's capacity counts the rest)."""
MAX_IMMEDIATE = 32
"""Steps asking to be looked at again at once (recheck 0) that are taken in a row for one record:
a ladder has a handful of rungs, so more means a step that never settles (a defect, not a wait)."""


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """The responder's settings a replay decides with (`responder.settings.ResponderSettings`'s
    `reconciler.policy`, `reconciler.bucket` and `intake`)."""

    policy: PolicySettings
    bucket: BucketSettings
    intake: IntakeSettings


@dataclass(frozen=True, slots=True)
class Delivery:
    """One alert of a notification as the responder received it."""

    at: float
    status: str
    """`firing` or `resolved`."""
    labels: Mapping[str, str]
    """The alert's labels (the intake reads `alertname`, `action`, `node`, `device`, ...)."""
    starts_at: float
    """When its firing episode began: with the fingerprint, what tells a re-delivery from a new episode."""
    fingerprint: str


CheckKey = tuple[DeviceKey, str, int]
"""(device, the check's name: `probe`, `canary` or `reset`, the release attempt it belongs to)."""
Holding = tuple[float, float, str]
"""(from, until, pod): a pod (`namespace/name`) held the device over [from, until)."""


def replay(
    timeline: Timeline,
    rules: RuleTimings,
    settings: ReplaySettings,
    holders: Mapping[DeviceKey, Sequence[Holding]] | None = None,
) -> Replay:
    """Play `timeline` through gpuhealth's decisions, the workload placing its pods as `holders`
    says (none: no device is ever held); what it did, accounted."""
    readings = Readings.of(timeline, heartbeat_limit=rules.heartbeat_limit)
    return replay_deliveries(timeline.frame, episodes(timeline, rules), readings, settings, holders)


def replay_deliveries(
    frame: Frame,
    episodes: Iterable[AlertEpisode],
    readings: Readings,
    settings: ReplaySettings,
    holders: Mapping[DeviceKey, Sequence[Holding]] | None = None,
) -> Replay:
    """Play alert `episodes` (from the alerting model or from a recorded alert history, each a
    firing and a resolved delivery) through gpuhealth's decisions, the devices reading
    `readings` and the workload placing its pods as `holders` says (a modelled placement: see
    the module's docstring); what it did, accounted. `holders` is read only for the devices that
    get a record, so it may compute a device's holdings when asked."""
    deliveries = [d for e in episodes for d in _deliveries(e)]
    return _Engine(frame, deliveries, readings, settings, holders=holders, placed=True).run()


def replay_recorded(
    timeline: Timeline,
    deliveries: Iterable[Delivery],
    verdicts: Mapping[CheckKey, tuple[float, CheckResult]],
    settings: ReplaySettings,
    holders: Mapping[DeviceKey, Sequence[Holding]] | None = None,
) -> Replay:
    """Play a recorded run through gpuhealth's decisions: the `deliveries` the responder received,
    the `verdicts` its checks reached (how long each ran, and how it ended: a check's Job runs as
    long wherever the reconciler started it), the pods that held each device (`holders`: a
    release attempt waits for the device to be free, as the product's does); `timeline` gives the
    devices' health (its faults and Unknown spells) and the move time. A check the run never saw
    end runs until the timeline's end."""
    if timeline.lost:
        raise ValueError("a recorded timeline gives Unknown device by device: it names no lost node")
    readings = Readings.of(timeline, heartbeat_limit=math.inf)
    return _Engine(timeline.frame, deliveries, readings, settings, verdicts, holders).run()


def _deliveries(episode: AlertEpisode) -> tuple[Delivery, Delivery]:
    labels = {
        **dict(episode.labels),
        "alertname": episode.name,
        "action": episode.action,
        "node": episode.node,
        "device": episode.device,
    }
    fingerprint = f"{episode.name}:{episode.node}:{episode.device}"
    return (
        Delivery(episode.fires, FIRING, labels, episode.fires, fingerprint),
        Delivery(episode.resolves, RESOLVED, labels, episode.fires, fingerprint),
    )


_DELIVER, _STEP, _MOVED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class _Holdings:
    """One device's holdings, indexed: a modelled workload gives hundreds per device."""

    spans: tuple[Holding, ...]
    """Sorted by start."""
    starts: tuple[float, ...]
    edges: tuple[float, ...]
    """Every start and end, sorted: the moments the device's holders may change."""
    longest: float

    @classmethod
    def of(cls, holdings: Iterable[Holding]) -> _Holdings:
        spans = tuple(sorted(holdings))
        return cls(
            spans,
            tuple(s for s, _, _ in spans),
            tuple(sorted({edge for s, e, _ in spans for edge in (s, e)})),
            max((e - s for s, e, _ in spans), default=0.0),
        )


class _Engine:
    def __init__(
        self,
        frame: Frame,
        deliveries: Iterable[Delivery],
        readings: Readings,
        settings: ReplaySettings,
        verdicts: Mapping[CheckKey, tuple[float, CheckResult]] | None = None,
        holders: Mapping[DeviceKey, Sequence[Holding]] | None = None,
        placed: bool = False,
    ) -> None:
        self.frame, self.settings, self.readings = frame, settings, readings
        self.verdicts, self.holders, self.placed = verdicts, holders or {}, placed
        self.holdings: dict[DeviceKey, _Holdings] = {}
        self.excluded: dict[DeviceKey, list[list[float]]] = {}
        """Per device, the [from, until) spans gpuhealth's exclusion was present (modelled placement)."""
        self.vacated: dict[DeviceKey, list[float]] = {}
        """Per device, when a move of its work succeeded (modelled placement)."""
        self.records: dict[DeviceKey, Quarantine] = {}
        self.present: set[DeviceKey] = set()
        self.active: set[DeviceKey] = set()
        self.checks: dict[tuple[DeviceKey, str, int], tuple[float, CheckResult]] = {}
        self.breaker = BreakerState()
        self.bucket = Bucket.full(settings.bucket, frame.start)
        self.starts: deque[tuple[str, float]] = deque()
        self.ledger = Ledger(frame.start)
        self.queue: list[tuple[float, int, int, DeviceKey, object]] = []
        self.due: set[tuple[DeviceKey, float]] = set()
        self.order = count()
        for delivery in deliveries:
            key = (delivery.labels.get("node", ""), delivery.labels.get("device", ""))
            self._push(delivery.at, _DELIVER, key, delivery)

    def run(self) -> Replay:
        while self.queue:
            now, _, kind, key, payload = heapq.heappop(self.queue)
            if now > self.frame.end:
                break
            if kind == _DELIVER:
                assert isinstance(payload, Delivery)
                self._deliver(key, payload, now)
            elif kind == _MOVED:
                assert isinstance(payload, str)
                self._moved(key, payload, now)
            else:
                self.due.discard((key, now))
                self._step(key, now)
        return self.ledger.closed(self.frame.end, self.records, self._occupied())

    def _push(self, at: float, kind: int, key: DeviceKey, payload: object = None) -> None:
        if kind == _STEP:
            if (key, at) in self.due:
                return
            self.due.add((key, at))
        heapq.heappush(self.queue, (at, next(self.order), kind, key, payload))

    def _deliver(self, key: DeviceKey, delivery: Delivery, now: float) -> None:
        alert = Alert(
            status=delivery.status,
            labels=delivery.labels,
            annotations={},
            starts_at=delivery.starts_at,
            ends_at=None,
            fingerprint=delivery.fingerprint,
        )
        decision = decide(self.records.get(key), alert, now=now, settings=self.settings.intake)
        if isinstance(decision, Write):
            self.records[key] = decision.record
            self._push(now, _STEP, key)

    def _step(self, key: DeviceKey, now: float) -> None:
        for _ in range(MAX_IMMEDIATE):
            record = self.records[key]
            if record.status.phase in ENDED_PHASES:
                return
            decided = step(record, self._view(key, record, now), self._context(now))
            self._apply(key, record, decided, now)
            if decided.recheck_seconds != 0.0:
                break
        else:
            raise RuntimeError(f"{key}: the policy asked to step again at once {MAX_IMMEDIATE} times")
        if decided.recheck_seconds is not None:
            self._push(now + decided.recheck_seconds, _STEP, key)
        else:
            # The reconciler passes every record at least every `max_recheck_seconds` whatever
            # the step asked: what changes with time alone in a record that asked for nothing is
            # its expiry and its backoff's end, so the replay looks again at those.
            status = self.records[key]
            for stamp in (status.spec.expires_at, status.status.retry_at):
                at = parse_rfc3339(stamp)
                if at is not None and at > now:
                    self._push(at, _STEP, key)
        change = self.readings.next_change(*key, now)
        if change is not None:
            self._push(change, _STEP, key)
        edges = self._holdings(key).edges
        after = bisect.bisect_right(edges, now)
        # A holding that runs to the timeline's end was not left: the timeline just ends there.
        if after < len(edges) and edges[after] < self.frame.end:
            self._push(edges[after], _STEP, key)

    def _holdings(self, key: DeviceKey) -> _Holdings:
        if key not in self.holdings:
            self.holdings[key] = _Holdings.of(self.holders.get(key, ()))
        return self.holdings[key]

    def _held_by(self, key: DeviceKey, now: float) -> tuple[str, ...]:
        """The pods holding the device at `now`."""
        held = self._holdings(key)
        # Only a holding that began within the longest one's length before `now` can hold it now.
        first = bisect.bisect_right(held.starts, now - held.longest)
        last = bisect.bisect_right(held.starts, now)
        current = self._effective(key, held.spans[first:last])
        return tuple(sorted(pod for start, end, pod in current if start <= now < end))

    def _effective(self, key: DeviceKey, holdings: Iterable[Holding]) -> list[Holding]:
        """`holdings` of the device that began by now, as the product's effects so far left them:
        in a modelled placement, none that began while the device was excluded (the scheduler
        placed that pod on another device), each ended by the first move off the device that
        succeeded after it began (its pods were evicted)."""
        kept = []
        for start, end, pod in holdings:
            if self.placed:
                if any(a <= start < b for a, b in self.excluded.get(key, ())):
                    continue
                end = min([end, *(moved for moved in self.vacated.get(key, ()) if moved >= start)])
            kept.append((start, end, pod))
        return kept

    def _occupied(self) -> dict[DeviceKey, tuple[tuple[float, float], ...]]:
        """Per device that gpuhealth held, the spans a pod held it, for the accounting."""
        end = self.frame.end
        return {
            key: tuple(
                (s, min(e, end))
                for s, e, _ in self._effective(key, self._holdings(key).spans)
                if s < min(e, end)
            )
            for key in self.excluded
            if self._holdings(key).spans
        }

    def _view(self, key: DeviceKey, record: Quarantine, now: float) -> DeviceView:
        health, since = self.readings.health(*key, now)
        return DeviceView(
            health=health,
            healthy_since=since if since is not None else self.frame.start,
            enforcement_present=key in self.present,
            enforced_as=f"Replay/{record.name}",
            check=self._check(key, record, now),
            holders=self._held_by(key, now),
        )

    def _check(self, key: DeviceKey, record: Quarantine, now: float) -> CheckResult:
        rung = self.settings.policy.rungs.rung(record.status.phase)
        if rung is None:
            return CheckResult.ABSENT
        started = self.checks.get((key, rung.name, record.status.attempt))
        if started is None:
            return CheckResult.ABSENT
        done_at, verdict = started
        return verdict if now >= done_at else CheckResult.RUNNING

    def _context(self, now: float) -> Context:
        window = self.settings.policy.breaker.window_seconds
        while self.starts and self.starts[0][1] < now - window:
            self.starts.popleft()
        counts = breaker.count(
            self.frame.eligible,
            self.starts,
            (f"{n}\x00{d}" for n, d in self.active),
            now=now,
            settings=self.settings.policy.breaker,
        )
        return Context(now, self.settings.policy, self.breaker, counts, self.bucket)

    def _apply(self, key: DeviceKey, before: Quarantine, decided: Step, now: float) -> None:
        after = decided.record
        for effect in decided.effects:
            self.ledger.actions[type(effect).__name__] += 1
            if isinstance(effect, Enforce):
                if key not in self.present:
                    self.excluded.setdefault(key, []).append([now, math.inf])
                self.present.add(key)
                self.ledger.held(key, after.spec.action, after.spec.reason, now)
            elif isinstance(effect, Unenforce):
                if key in self.present:
                    self.excluded[key][-1][1] = now
                self.present.discard(key)
                self.ledger.freed(key, now)
            elif isinstance(effect, StartCheck | StartReset):
                name = effect.kind if isinstance(effect, StartCheck) else "reset"
                self._start_check(key, name, effect.attempt, now)
            elif isinstance(effect, SaveBreaker):
                if effect.state.tripped and not self.breaker.tripped:
                    self.ledger.breaker_trips += 1
                self.breaker = effect.state
        if decided.took_token:
            _, self.bucket = self.bucket.take(now)
        entered = after.status.phase == Phase.QUARANTINED and before.status.phase in (
            Phase.PENDING,
            Phase.DEFERRED,
        )
        if entered and after.spec.actor.startswith("alert/"):
            self.starts.append((f"{key[0]}\x00{key[1]}", now))
        if after.status.phase in RECORDED_ONLY:
            self.active.discard(key)
        else:
            self.active.add(key)
        # With the workload's pods placed, a quarantine moves whatever pod holds the device, a new
        # episode's or a restriction's turned quarantine in the same episode (the intake's
        # upgrade); `moves_for` keeps it to one move per job and episode.
        placed = self.placed and bool(self.holders)
        if (
            after.spec.action == QUARANTINE
            and (placed or after.status.episode > before.status.episode)
            and self._had_work(key, before, now)
        ):
            after = self._begin_move(key, after, now)
        self.records[key] = after

    def _begin_move(self, key: DeviceKey, record: Quarantine, now: float) -> Quarantine:
        """The device's work starts moving: one job per device (whatever pods `holders` names), its move
        kept in the record as the migrator keeps it, finished `move_seconds` later."""
        job = Holder("replay", f"Job/{key[1]}", f"job-{record.name}")
        moves = moves_for(
            record.status.migrations, (job,), device=record.spec.device, episode=record.status.episode
        )
        if len(moves) == len(record.status.migrations):
            return record  # a move of this job is under way: one flow per job
        self.ledger.moved(key, record.spec.reason, now)
        self._push(now + self.frame.move_seconds, _MOVED, key, moves[-1].key)
        return record.with_migrations(moves)

    def _moved(self, key: DeviceKey, move: str, now: float) -> None:
        record = self.records[key]
        done = tuple(
            replace(m, outcome=MigrationOutcome.SUCCEEDED) if m.key == move else m
            for m in record.status.migrations
        )
        self.records[key] = record.with_migrations(done)
        self.vacated.setdefault(key, []).append(now)
        self._step(key, now)

    def _had_work(self, key: DeviceKey, before: Quarantine, now: float) -> bool:
        """Whether work may have run on the device before this episode: with the workload's pods
        placed, whether one holds it (a restricted device keeps its tenant's pod, which a
        quarantine then moves); else whether it was open to all (recorded only) or on the ramp
        (opted-in work); a check rung's device runs only the check."""
        if self.placed and self.holders:
            return bool(self._held_by(key, now))
        if before.status.phase in RECORDED_ONLY:
            return True
        rung = self.settings.policy.rungs.rung(before.status.phase)
        return rung is not None and rung.kind == Kind.RAMP

    def _start_check(self, key: DeviceKey, name: str, attempt: int, now: float) -> None:
        if (key, name, attempt) in self.checks:
            return
        if self.verdicts is not None:
            # A recorded run: the verdict the run saw, as long after the check began as there.
            ran, verdict = self.verdicts.get((key, name, attempt), (math.inf, CheckResult.RUNNING))
            self.checks[(key, name, attempt)] = (now + ran, verdict)
            if ran != math.inf:
                self._push(now + ran, _STEP, key)
            return
        truth = self.frame.checks
        seconds = truth.probe_seconds if name in ("probe", "reset") else truth.canary_seconds
        done_at = now + seconds
        failed = self.readings.broken(*key, now, done_at)
        if not failed and key in truth.flaky and truth.flaky_failure > 0:
            draw = random.Random(f"{self.frame.seed}/{key[0]}/{key[1]}/{name}/{attempt}").random()
            failed = draw < truth.flaky_failure
        self.checks[(key, name, attempt)] = (done_at, CheckResult.FAILED if failed else CheckResult.SUCCEEDED)
        self._push(done_at, _STEP, key)
