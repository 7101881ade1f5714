"""The safety verdict of a demo run, judged over its journal: every invariant, one pass.

Pure: the journal (`demo.journal`) and the scenario in, a `Verdict` out. Warrants come from
the scenario's faults: a fault warrants `quarantine` on a device when it is a confirmed
failure (Unhealthy, also in flaps; a fatal XID, GPU lost, uncorrectable ECC, a row-remap
failure) and `restrict` when the device stayed Unknown for the whole tolerance window, and
only from the fault on (restrict: from the spell's start plus the window). Journal times are
when the pipeline saw something, never before it happened, so "before its warrant" is exact.

The invariants (each broken one is a line in `Verdict.violations`; the run exits 1):
- the rules asked the responder (a firing delivery to `responder` with an action) for an
  action no fault warranted, or before the fault;
- a quarantine the fault did not warrant: a record whose action its device's faults do not
  warrant (or not yet), or a device enforced without any warrant;
- an eviction or migration caused by Unknown: an eviction or migration of a device whose
  record is a `restrict` (Unknown), or of a device with no record at all; a fixed-topology job
  is moved whole, so an eviction of its pod on other devices is justified by that job's move for
  a quarantined device, under way at the eviction and within the quarantine episode it started
  in (its outcome may never come: a move awaiting its replacements), and by nothing else;
- a node action without a justification that held at the time: a cordon, or a node taint other
  than gpuhealth's escalation, is never justified; the escalation taint (`gpuhealth.io/node-escalated`)
  is justified only when, at its time, the scenario's faults warranted a quarantine on at least
  `escalation.cards` cards of the node that started within `escalation.window` of each other, or
  on at least `escalation.lost_cards` of them with a GPU-lost fault on the node (the DRA driver's
  gpu-lost taint on every device), and the breaker was not tripped; with no rule given, every node
  action is a violation. The cards are judged from the faults, not from the records, with the
  responder's own grouping (`responder.reconcile.escalation.together`);
- an action done twice: two DeviceTaintRules for one device at once (for one slice device: a
  MIG card on DRA is excluded by one rule per MIG device of it), two records for one
  device at once, the same pod evicted twice, one job's migration finished twice by a record;
- a release without probe and canary: Released without a passed probe and a passed canary
  since the record last became Quarantined;
- a warranted quarantine that did not happen: no record for a warranted device in time
  (`grace` after its warrant, within the run), unless the breaker was tripped by then. Flaps
  and short Unhealthy spells may rightly go unanswered, except a flap the rules' Unhealthy
  flapping rule must catch (`UnhealthyFlapping`): enough short episodes within its window,
  due from the episode that completes the count;
- a breaker that blocked a release: a record in a release phase sent back (Deferred, or
  Quarantined without a failed check) while the breaker was tripped;
- a release while the device is reported Unhealthy: at the Released transition the device's
  driver or device plugin reported it Unhealthy as the scenario plays (`reported_unhealthy`),
  throughout the journal's resolution before it (so a fault starting at the very moment of a
  release is not blamed on it). The cluster's own reports (HEALTH entries) are no witness: an
  idle device's Unhealthy reaches no pod's status, and its last report stays whatever it was;
  the exporter's metrics are built from those same reports (and NVML, which the faults drive);
- a pod left on a quarantined device: a pod (not a check's) still running on the device
  `move_deadline` after its move started (or, with no move started, after the episode began or
  the pod landed, whichever is later; while the node had no other move in flight), unless its
  job's move in that record ended Unrecoverable, the breaker was tripped meanwhile (it holds
  moves back), or the device left quarantine first (a ramp admits opted-in work);
- a check result taken from another device: a probe or canary whose pod reached any device but
  the record's (its claim's allocation, or `NVIDIA_VISIBLE_DEVICES` on its node), or a passed
  one whose pod was never seen on a device;
- a manual release that skipped a check: a record released while a person's release request
  stood, without a passed result of every check rung of the ladder in the attempt it was
  released in;
- a warranted quarantine left unenforced: a firing quarantine delivered to the responder whose
  device was not enforced within `reaction`, while the alert kept firing and the breaker stayed
  closed (unless the record waits on a guardrail a person configured: the rate of new
  quarantines, a node opted out);
- a release step without health evidence: a record stepping up the release ladder (or
  Released) while the responders' health source was down (HEALTH_SOURCE entries), more than
  `pass_seconds` after it went down;
- a GPU reset where none belongs: the cluster's reset controller starting a reset (RESET
  entries) of a card no quarantine record held at that moment, or of a card a workload's pod
  (not a check's) was running on: a reset kills what runs on the card;
- exposure: a pod that started on a card while it was quarantined (POD_STARTED: its containers
  seen Running with the card among the devices the API gives it), from the record's entry into
  Quarantined until it reaches the ladder's ramp rung or leaves the ladder, unless it is one of
  gpuhealth's own holder or check pods, which are meant to be on the card. The kubelet hands a
  device plugin's new pod any free device the plugin calls Healthy; excluding the card means
  none is handed it. Pods already on the card when it was quarantined are the move's (above).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from demo.journal import Entry, Journal, Kind, sorted_entries
from responder.ladder import KNOWN, LADDER, Ladder
from responder.ladder import Kind as RungKind
from responder.reconcile.escalation import TAINT_KEY as ESCALATION_TAINT
from responder.reconcile.escalation import Failing, together
from responder.records import ENDED_PHASES
from simulator.model import APPLICATION_XIDS, Fault, Scenario

QUARANTINE_FAULTS = frozenset({"device-unhealthy", "gpu-lost", "row-remap-failure"})


def warrants(
    scenario: Scenario,
    *,
    fatal_xids: Iterable[int],
    tolerance: float,
    backoff: UnknownBackoff | None = None,
    health_watches: Iterable[str] | None = None,
) -> dict[tuple[str, int], set[str]]:
    """Actions each (node, gpu index) may receive, from the scenario's faults."""
    return _by_place(
        warranted_from(
            scenario,
            fatal_xids=fatal_xids,
            tolerance=tolerance,
            backoff=backoff,
            health_watches=health_watches,
        )
    )


def _by_place(since: Mapping[tuple[tuple[str, int], str], float]) -> dict[tuple[str, int], set[str]]:
    allowed: dict[tuple[str, int], set[str]] = {}
    for place, action in since:
        allowed.setdefault(place, set()).add(action)
    return allowed


@dataclass(frozen=True, slots=True)
class UnknownBackoff:
    """The rules' backoff of the Unknown tolerance window in scenario seconds
    (node_device:gpu_device_unknown_tolerance:seconds): a spell's repeat count is the number of
    earlier Unknown spells of the device still on within `repeat_window` before its start, and
    its window the tolerance x `factor` ^ repeats, rounded to a whole `unit` (the rules round to
    whole seconds of their own clock: `speed` scenario seconds in the demo), never below `floor`
    nor above `cap` (`rules.render.unknown_tolerance_cap`: with a factor up to 1, the tolerance)."""

    factor: float
    floor: float
    repeat_window: float
    cap: float = math.inf
    unit: float = 1.0

    def window(self, tolerance: float, repeats: int) -> float:
        """The tolerance window of a spell with `repeats` earlier spells (as the rules record it)."""
        scaled = tolerance / self.unit * self.factor ** min(repeats, 256)
        rounded = math.floor(min(scaled, 1e15) + 0.5) * self.unit
        return min(max(rounded, self.floor), self.cap)


def _windowed(
    spells: dict[SpellKey, list[tuple[float, float]]], tolerance: float, backoff: UnknownBackoff | None
) -> dict[SpellKey, list[tuple[float, float, float]]]:
    """Each spell as (start, seconds, its tolerance window)."""
    out: dict[SpellKey, list[tuple[float, float, float]]] = {}
    for key, spans in spells.items():
        ordered = sorted(spans)
        windows = []
        for i, (start, length) in enumerate(ordered):
            window = tolerance
            if backoff is not None:
                earlier = sum(1 for s, n in ordered[:i] if s + n > start - backoff.repeat_window)
                window = backoff.window(tolerance, earlier)
            windows.append((start, length, window))
        out[key] = windows
    return out


def warranted_from(
    scenario: Scenario,
    *,
    fatal_xids: Iterable[int],
    tolerance: float,
    backoff: UnknownBackoff | None = None,
    health_watches: Iterable[str] | None = None,
) -> dict[tuple[tuple[str, int], str], float]:
    """The scenario time from which each ((node, gpu), action) is warranted.

    A confirmed failure warrants quarantine from its fault on (a failing DCGM health watch: one
    of `health_watches`, the rules' `dcgm.health_watches`; None: any); a long Unknown warrants
    restrict once its tolerance window (`tolerance`, shortened by `backoff` for repeats) has
    run from the start of its spell.
    """
    fatal = frozenset(fatal_xids)
    watches = None if health_watches is None else frozenset(health_watches)
    since: dict[tuple[tuple[str, int], str], float] = {}
    spells = _windowed(_unknown_spells(scenario), tolerance, backoff)
    for fault in scenario.timeline:
        for node, gpu in _devices_of(scenario, fault):
            action = _warranted_action(scenario, fault, fatal, spells, watches)
            if action == "restrict":
                key: SpellKey = (node, gpu) if fault.device is not None else (node, None)
                at = min(start + window for start, length, window in spells.get(key, ()) if length >= window)
            elif action:
                at = fault.at
            else:
                continue
            since[((node, gpu), action)] = min(at, since.get(((node, gpu), action), at))
    return since


def _devices_of(scenario: Scenario, fault: Fault) -> list[tuple[str, int]]:
    if fault.device is not None:
        return [(fault.device.node, fault.device.gpu)]
    if fault.node is not None and fault.node in scenario.nodes:
        return [(fault.node, i) for i in range(scenario.nodes[fault.node].gpus_per_node)]
    return []


STREAM_FAULTS = ("health-stream-broken", "health-stream-stale")
"""A node's DRA health stream broken (Unknown at once) or dead unnoticed (stale, then Unknown)."""

SpellKey = tuple[str, int | None]
"""(node, gpu) of a device's Unknown, or (node, None) of a node's broken health stream."""


def _unknown_spells(scenario: Scenario) -> dict[SpellKey, list[tuple[float, float]]]:
    """The continuous Unknowns of each device (or node stream): (start, seconds) each.

    As the simulator plays them: a repeated fault moves the end to its own, `recover` ends
    it at once, and a broken stream without a duration lasts until recovered (or for ever).
    A fault's `duration` alone would overstate an Unknown that a `recover` cut short.
    """
    open_spells: dict[SpellKey, tuple[float, float]] = {}
    """(since, scheduled end) of each spell in progress."""
    spells: dict[SpellKey, list[tuple[float, float]]] = {}

    def close(key: SpellKey, at: float) -> None:
        since, end = open_spells.pop(key)
        spells.setdefault(key, []).append((since, min(end, at) - since))

    for fault in sorted(scenario.timeline, key=lambda f: f.at):
        key: SpellKey
        if fault.device is not None and fault.kind in ("device-unknown", "recover"):
            key = (fault.device.node, fault.device.gpu)
        elif fault.node is not None and fault.kind in (*STREAM_FAULTS, "recover"):
            # A stale stream's Healthy counts as Unknown once its age passes the heartbeat limit:
            # later than the fault, so a spell from the fault starts no later than the Unknown.
            key = (fault.node, None)
        else:
            continue
        if key in open_spells and open_spells[key][1] <= fault.at:
            close(key, fault.at)  # it ended on its own before this fault
        if fault.kind == "recover":
            if key in open_spells:
                close(key, fault.at)
            continue
        end = fault.at + fault.duration if fault.duration is not None else math.inf
        since = open_spells[key][0] if key in open_spells else fault.at
        open_spells[key] = (since, end)
    for key, (_, end) in list(open_spells.items()):
        close(key, end)
    return spells


def _warranted_action(
    scenario: Scenario,
    fault: Fault,
    fatal: frozenset[int],
    spells: dict[SpellKey, list[tuple[float, float, float]]],
    watches: frozenset[str] | None = None,
) -> str | None:
    kind = fault.kind
    if kind in QUARANTINE_FAULTS:
        return "quarantine"
    if kind == "health-watch":
        return "quarantine" if watches is None or fault.watch in watches else None
    if kind == "xid":
        return "quarantine" if (fault.xid in fatal or fault.unhealthy) else None
    if kind == "ecc":
        return "quarantine" if fault.uncorrected > 0 else None
    if kind == "flap":
        # Unhealthy half-cycles: confirmed failures, each too short to be sure to fire.
        return "quarantine"

    def long_enough(key: SpellKey) -> bool:
        return any(length >= window for _, length, window in spells.get(key, ()))

    if kind == "device-unknown" and fault.device is not None:
        return "restrict" if long_enough((fault.device.node, fault.device.gpu)) else None
    if kind == "health-stream-stale" and fault.node is not None:
        return "restrict" if long_enough((fault.node, None)) else None  # DRA nodes only
    if kind == "health-stream-broken" and fault.node is not None:
        # The device-plugin path reports a broken stream as Unhealthy, DRA as Unknown.
        if scenario.nodes[fault.node].path == "device-plugin":
            return "quarantine"
        return "restrict" if long_enough((fault.node, None)) else None
    # kubelet-stop, node-partition, recover: never a reason to act on a device.
    return None


@dataclass(frozen=True, slots=True)
class UnhealthyFlapping:
    """The rules' GPUDeviceUnhealthyFlapping in scenario seconds: `episodes` Unhealthy episodes,
    each shorter than the Unhealthy alert's `for:`, starting within `window`, quarantine the
    device. An episode shorter than `seen_from` (the rules' evaluation interval) may fall
    between two evaluations, so it counts towards nothing that must happen."""

    episodes: int
    window: float
    seen_from: float = 0.0


def flapping_due(
    scenario: Scenario, *, unhealthy_for: float, rule: UnhealthyFlapping
) -> dict[tuple[str, int], float]:
    """When each device's flapping quarantine is due: the start of the short episode that makes
    `rule.episodes` of them start within `rule.window` (open at its start, as Prometheus 3
    counts). Devices whose short episodes never do so are absent."""
    due: dict[tuple[str, int], float] = {}
    n = rule.episodes
    for place, spans in _unhealthy_episodes(scenario).items():
        starts = [start for start, length in spans if rule.seen_from <= length < unhealthy_for]
        for k in range(n - 1, len(starts)):
            if starts[k] - starts[k - n + 1] < rule.window:
                due[place] = starts[k]
                break
    return due


def _unhealthy_episodes(scenario: Scenario) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """Each device's Unhealthy episodes as scheduled, (start, seconds), in time order: a flap is
    `times` episodes of period/2, a device-unhealthy one of its duration (for ever without one).
    Overlapping ones are one episode: the device reports Unhealthy throughout."""
    spans: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for fault in scenario.timeline:
        if fault.device is None:
            continue
        place = (fault.device.node, fault.device.gpu)
        if fault.kind == "flap":
            period, times = fault.period or 0.0, fault.times or 0
            spans.setdefault(place, []).extend(
                (fault.at + i * period, fault.at + i * period + period / 2) for i in range(times)
            )
        elif fault.kind == "device-unhealthy":
            end = fault.at + fault.duration if fault.duration is not None else math.inf
            spans.setdefault(place, []).append((fault.at, end))
    episodes: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for place, intervals in spans.items():
        merged: list[tuple[float, float]] = []
        for start, end in sorted(intervals):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        episodes[place] = [(start, end - start) for start, end in merged]
    return episodes


@dataclass(frozen=True, slots=True)
class NodeEscalation:
    """The responders' escalation settings in scenario seconds (`escalation.*`)."""

    cards: int
    window: float
    lost_cards: int
    enabled: bool = True


def node_justified(
    since: Mapping[tuple[tuple[str, int], str], float],
    scenario: Scenario,
    node: str,
    at: float,
    rule: NodeEscalation,
) -> str | None:
    """Why a node escalation of `node` at `at` held, from the scenario's faults (`since`: the
    warrants' times, `warranted_from`); None when no justification held then."""
    if not rule.enabled:
        return None
    cards = [
        Failing(f"gpu-{gpu}", start, "")
        for ((where, gpu), action), start in since.items()
        if where == node and action == "quarantine" and start <= at
    ]
    group = together(cards, rule.cards, rule.window)
    if group is not None:
        return "cards-failing: " + ", ".join(f"{f.device} from t+{f.since:.0f}s" for f in group)
    lost = any(
        f.kind == "gpu-lost" and f.device is not None and f.device.node == node and f.at <= at
        for f in scenario.timeline
    )
    if lost and len(cards) >= rule.lost_cards:
        return f"driver-gpu-lost: {len(cards)} cards failing"
    return None


NO_ACTION = frozenset({"", "none"})
"""`action` label values that ask the responder for nothing."""
RELEASING = frozenset(KNOWN.phases)
"""Phases of a record on its way out: the release ladder's rungs."""
RAMPS = frozenset(r.phase for r in KNOWN.rungs if r.kind is RungKind.RAMP)
"""Phases of a record whose device is on the ramp: opted-in work may come, the quarantine is over."""
GUARDRAIL_HOLDS = frozenset({"RateLimited", "NodeOptedOut"})
"""Phase reasons of a record that a person's configuration holds back from enforcement: the rate
of new quarantines (a burst waits for a person or the breaker), a node opted out."""


@dataclass(frozen=True, slots=True)
class Verdict:
    violations: tuple[str, ...]
    """Broken invariants, one line each, in journal order."""
    acted: tuple[tuple[str, str], ...]
    """(node/gpu-i, action) of every warranted quarantine that a record carried."""
    missed: tuple[tuple[str, str], ...]
    """(node/gpu-i, action) warranted but not recorded, and not a violation: too late in the
    run (within `grace` of its end), transient (flaps too few or too short for the flapping
    rule, Unhealthy shorter than the alert's `for:`), or held back by a tripped breaker."""

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass
class _Record:
    name: str
    device: str
    node: str
    action: str
    created: float
    phases: list[tuple[float, str, str]]
    """(at, phase, why) of each phase entry."""
    ended: float = math.inf
    """When it was Released or Abandoned (inf: still active at the end)."""


def judge(
    journal: Journal,
    scenario: Scenario,
    *,
    fatal_xids: Iterable[int],
    tolerance: float,
    unhealthy_for: float = 0.0,
    grace: float = 0.0,
    flapping: UnhealthyFlapping | None = None,
    backoff: UnknownBackoff | None = None,
    move_deadline: float = math.inf,
    reaction: float = math.inf,
    pass_seconds: float = 0.0,
    ladder: Ladder = LADDER,
    health_watches: Iterable[str] | None = None,
    escalation: NodeEscalation | None = None,
) -> Verdict:
    """The run's verdict (pure). Times in scenario seconds: `tolerance` the rules' Unknown
    tolerance, `unhealthy_for` the Unhealthy alert's `for:` (an Unhealthy that clears sooner
    warrants nothing that must happen, unless enough of them make a flap by `flapping`, the
    rules' Unhealthy flapping thresholds), `grace` how long after its warrant a quarantine may
    take to be recorded (the detection floor plus the responder's reaction), `backoff` the
    rules' shortening of the Unknown window for repeated spells (None: every spell gets
    `tolerance`), `move_deadline` how long a pod may stay on a quarantined device once its move
    started (the checkpoint timeout plus the pod's termination; inf: not judged), `reaction` how
    long a delivered quarantine may wait for its enforcement (inf: not judged), `pass_seconds`
    how long a reconcile pass that began before the health source went down may still step.
    `ladder`: the release ladder whose check rungs a requested release must have passed;
    `health_watches` the DCGM health watches whose failure warrants a quarantine (the rules'
    `dcgm.health_watches`; None: any); `escalation` the responders' node escalation settings
    (None: no node action is ever justified)."""
    since = warranted_from(
        scenario, fatal_xids=fatal_xids, tolerance=tolerance, backoff=backoff, health_watches=health_watches
    )
    allowed = _by_place(since)
    entries = sorted_entries(journal.entries)
    violations: list[str] = []

    def place_of(device: str) -> tuple[str, int] | None:
        known = journal.devices.get(device)
        return (known.node, known.index) if known else None

    def label(device: str, node: str = "") -> str:
        return journal.label(device) if device else (node or "fleet")

    def warranted(device: str, action: str, at: float) -> str | None:
        """Why `action` on `device` at `at` is not warranted (None: it is)."""
        place = place_of(device)
        if place is None or place not in allowed:
            return "no fault on it"
        if action not in allowed[place]:
            return "its faults warrant " + " or ".join(sorted(allowed[place]))
        if at < since[(place, action)]:
            return f"nothing warranted it yet (from t+{since[(place, action)]:.0f}s)"
        return None

    records: dict[str, _Record] = {}
    rules: dict[str, set[str]] = {}
    evicted: set[str] = set()
    migrated: set[tuple[str, str, str]] = set()
    checks: dict[str, set[str]] = {}
    failed_check: dict[str, bool] = {}
    tripped = False
    tripped_at: float | None = None
    pending: list[tuple[Entry, str]] = []
    """Evictions of pods on no quarantined device, with the cause they would have."""

    def active(device: str, at: float) -> list[_Record]:
        return [r for r in records.values() if r.device == device and r.created <= at < r.ended]

    for e in entries:
        where = label(e.device, e.node)
        if e.kind is Kind.DELIVERY and e.what == "responder" and e.detail.get("status") == "firing":
            action = e.detail.get("action", "")
            if action not in NO_ACTION:
                why = warranted(e.device, action, e.at)
                if why:
                    violations.append(
                        f"t+{e.at:.0f}s {e.detail.get('alertname', '?')} asked the responder to {action} "
                        f"{where}, but {why}"
                    )
        elif e.kind is Kind.PHASE:
            name = e.detail.get("record", "")
            record = records.get(name)
            if record is None:
                action = e.detail.get("action", "quarantine")
                for other in active(e.device, e.at):
                    violations.append(
                        f"t+{e.at:.0f}s a second record {name} for {where} while {other.name} is active"
                    )
                why = warranted(e.device, action, e.at)
                if why:
                    violations.append(f"t+{e.at:.0f}s record {name} would {action} {where}, but {why}")
                record = records[name] = _Record(name, e.device, e.node, action, e.at, [])
            previous = record.phases[-1][1] if record.phases else ""
            why_phase = e.detail.get("why", "")
            if previous in RELEASING and (e.what == "Deferred" or why_phase == "BreakerOpen"):
                violations.append(
                    f"t+{e.at:.0f}s the breaker sent {where}'s release back ({previous} -> {e.what})"
                )
            elif previous in RELEASING and e.what == "Quarantined" and tripped and not failed_check.get(name):
                violations.append(
                    f"t+{e.at:.0f}s {where}'s release went back to Quarantined with the breaker tripped "
                    "and no failed check"
                )
            if e.what == "Quarantined":
                checks[name] = set()
                failed_check[name] = False
            if e.what == "Released":
                passed = checks.get(name, set())
                missing = [r.name for r in ladder.checks() if r.name not in passed]
                if missing:
                    violations.append(
                        f"t+{e.at:.0f}s {where} released without a passed {' and '.join(missing)}"
                    )
            if e.what in ENDED_PHASES:
                record.ended = e.at
            record.phases.append((e.at, e.what, why_phase))
        elif e.kind is Kind.CHECK:
            name = e.detail.get("record", "")
            if e.detail.get("result") == "passed":
                checks.setdefault(name, set()).add(e.what)
            else:
                failed_check[name] = True
        elif e.kind is Kind.ENFORCED:
            place = place_of(e.device)
            if e.what == "quarantine" and (
                place is None or place not in allowed or e.at < min(since[(place, a)] for a in allowed[place])
            ):
                violations.append(f"t+{e.at:.0f}s {where} was quarantined, but no fault warranted it")
            rule = e.detail.get("rule")
            if rule:
                # One rule per slice device: a MIG card on DRA has one per MIG device of it.
                current = rules.setdefault(f"{e.device}/{e.detail.get('deviceName', '')}", set())
                if current - {rule}:
                    violations.append(
                        f"t+{e.at:.0f}s a second DeviceTaintRule {rule} for {where} while "
                        f"{', '.join(sorted(current))} exists"
                    )
                current.add(rule)
        elif e.kind is Kind.LIFTED:
            rule = e.detail.get("rule")
            if rule:
                rules.get(f"{e.device}/{e.detail.get('deviceName', '')}", set()).discard(rule)
        elif e.kind is Kind.EVICTION:
            devices = [d for d in e.detail.get("devices", e.device).split(",") if d] or [e.device]
            if e.what in evicted:
                violations.append(f"t+{e.at:.0f}s pod {e.what} evicted a second time")
            evicted.add(e.what)
            holding = _records_of(records, devices, e.at)
            if not any(r.action == "quarantine" for r in holding):
                # A fixed-topology job's other pods hold healthy devices: the job's move for a
                # quarantined device, under way then (judged at the end), is then the cause.
                pending.append((e, "an Unknown (restrict)" if holding else "no quarantine"))
        elif e.kind is Kind.MIGRATION:
            name = e.detail.get("record", "")
            record = records.get(name)
            key = (name, e.detail.get("job", ""), e.detail.get("episode", ""))
            if key in migrated:
                violations.append(f"t+{e.at:.0f}s the migration of {key[1]} off {where} finished twice")
            migrated.add(key)
            if record is None or record.action != "quarantine":
                cause = "an Unknown (restrict)" if record is not None else "no quarantine"
                violations.append(f"t+{e.at:.0f}s a migration of {key[1]} off {where} for {cause}")
        elif e.kind is Kind.NODE_ACTION:
            taint_key = e.detail.get("key", "")
            if e.what != "taint" or taint_key != ESCALATION_TAINT or escalation is None:
                violations.append(f"t+{e.at:.0f}s a node-wide {e.what} ({taint_key}) on {e.node}")
            elif tripped:
                violations.append(f"t+{e.at:.0f}s {e.node} escalated ({taint_key}) with the breaker tripped")
            elif node_justified(since, scenario, e.node, e.at, escalation) is None:
                violations.append(
                    f"t+{e.at:.0f}s {e.node} escalated ({taint_key}) without a justification: fewer than "
                    f"{escalation.cards} cards failing within {escalation.window:.0f}s"
                )
        elif e.kind is Kind.BREAKER:
            tripped = e.what == "tripped"
            if tripped and tripped_at is None:
                tripped_at = e.at

    moves = _moves(entries)
    windows = _quarantine_windows(entries)
    for e, cause in pending:
        if not _moved_with_its_job(e, moves, windows, journal.resolution_seconds):
            violations.append(f"t+{e.at:.0f}s pod {e.what} on {label(e.device, e.node)} evicted for {cause}")
    acted: set[tuple[str, str]] = set()
    missed: set[tuple[str, str]] = set()
    transient = _transient(scenario, unhealthy_for)
    firm = _firm_from(scenario, fatal_xids=fatal_xids, unhealthy_for=unhealthy_for)
    due = flapping_due(scenario, unhealthy_for=unhealthy_for, rule=flapping) if flapping else {}
    uuid_at = {(d.node, d.index): d.uuid for d in journal.devices.values()}
    for (place, action), at in sorted(since.items()):
        device = uuid_at.get(place, "")
        where = f"{place[0]}/gpu-{place[1]}"
        covered = [r for r in records.values() if r.device == device and r.ended >= at]
        # A flap the flapping rule catches must be answered, from the episode that completes it;
        # a device with a firm failure besides its transient ones, from that failure on.
        flap = place in transient and action == "quarantine" and place in due
        must_from = due[place] if flap else at
        if action == "quarantine" and place in transient and place in firm:
            must_from = min(must_from, firm[place]) if flap else firm[place]
            flap = flap and due[place] <= firm[place]
            transient_only = False
        else:
            transient_only = place in transient and action == "quarantine"
        if any(r.action == action for r in covered):
            acted.add((where, action))
        elif covered:
            acted.add((where, covered[0].action))
        elif (
            (transient_only and not flap)
            or must_from + grace > journal.ended_at
            or (tripped_at is not None and tripped_at <= must_from + grace)
        ):
            missed.add((where, action))
        else:
            why = " (Unhealthy flapping)" if flap else ""
            violations.append(
                f"{where}: {action} warranted from t+{must_from:.0f}s{why}, but no record by "
                f"t+{must_from + grace:.0f}s"
            )
    violations += _released_while_unhealthy(entries, scenario, journal, label)
    violations += _pods_left(entries, move_deadline, journal.ended_at, label)
    violations += _checks_elsewhere(entries, records, label)
    violations += _requested_releases(entries, ladder, label)
    violations += _unenforced(entries, reaction, journal.ended_at, label)
    violations += _holders_outlasting(entries, reaction, journal.ended_at, label)
    violations += _steps_without_health(entries, pass_seconds, label)
    violations += _resets(entries, active, label)
    violations += [
        f"t+{x.at:.0f}s pod {x.pod} started on quarantined {x.label} "
        f"(record {x.record}, quarantined since t+{x.since:.0f}s)"
        for x in exposures(journal)
    ]
    return Verdict(tuple(violations), tuple(sorted(acted)), tuple(sorted(missed)))


def _moves(entries: list[Entry]) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(record, job, episode) -> (start, end) of each move: from its first entry (its move-started
    note, or its outcome in a journal that notes no start) until its outcome (a MIGRATION entry:
    succeeded, failed, unrecoverable), inf while under way, awaiting its replacements included."""
    moves: dict[tuple[str, str, str], tuple[float, float]] = {}
    for e in entries:
        if not ((e.kind is Kind.NOTE and e.what == "move-started") or e.kind is Kind.MIGRATION):
            continue
        key = (e.detail.get("record", ""), e.detail.get("job", ""), e.detail.get("episode", ""))
        start, end = moves.get(key, (e.at, math.inf))
        if e.kind is Kind.MIGRATION:
            end = min(end, e.at)
        moves[key] = (start, end)
    return moves


def _moved_with_its_job(
    eviction: Entry,
    moves: Mapping[tuple[str, str, str], tuple[float, float]],
    windows: Iterable[tuple[str, str, str, str, float, float]],
    slack: float,
) -> bool:
    """Whether the eviction belongs to a move of the pod's job for a quarantined device: the move
    was under way when the pod was evicted, and the quarantine episode it started in (of a
    `quarantine` record: a restrict moves nothing) still held. `slack` (the journal's resolution)
    allows for the move and the eviction being seen in either order within one observation."""
    job = eviction.detail.get("job", "")
    at = eviction.at
    windows = list(windows)
    for (record, moved, _), (start, end) in moves.items():
        if moved != job or not (start - slack <= at <= end + slack):
            continue
        if any(
            name == record and w_start - slack <= start < w_end and at < w_end + slack
            for name, _, _, _, w_start, w_end in windows
        ):
            return True
    return False


def _records_of(records: Mapping[str, _Record], devices: Iterable[str], at: float) -> list[_Record]:
    wanted = set(devices)
    return [r for r in records.values() if r.device in wanted and r.created <= at < r.ended]


def _transient(scenario: Scenario, unhealthy_for: float) -> set[tuple[str, int]]:
    """Devices with a confirmed failure that may rightly raise no alert (flaps, short Unhealthy).
    Whether that is their only one is `_firm_from`'s to say."""
    return {
        (f.device.node, f.device.gpu)
        for f in scenario.timeline
        if f.device is not None
        and (
            f.kind == "flap"
            or (f.kind == "device-unhealthy" and f.duration is not None and f.duration < unhealthy_for)
        )
    }


def _firm_from(
    scenario: Scenario, *, fatal_xids: Iterable[int], unhealthy_for: float
) -> dict[tuple[str, int], float]:
    """When each device's first quarantine-warranting fault that is not transient (no flap, no
    Unhealthy shorter than the alert's `for:`) starts: a quarantine is due from it whatever
    transient faults came before (they must not excuse a missing record)."""
    fatal = frozenset(fatal_xids)
    firm: dict[tuple[str, int], float] = {}
    for fault in scenario.timeline:
        if fault.kind == "flap" or (
            fault.kind == "device-unhealthy" and fault.duration is not None and fault.duration < unhealthy_for
        ):
            continue
        if _warranted_action(scenario, fault, fatal, {}) != "quarantine":
            continue
        for place in _devices_of(scenario, fault):
            firm[place] = min(fault.at, firm.get(place, fault.at))
    return firm


Label = Callable[[str, str], str]


def _spans(
    entries: list[Entry], test: Callable[[Entry], bool | None]
) -> dict[str, list[tuple[float, float]]]:
    """Per device, the spans during which `test` held, from entries that each set it (True),
    clear it (False) or say nothing (None); a span still open ends at infinity."""
    since: dict[str, float] = {}
    spans: dict[str, list[tuple[float, float]]] = {}
    for e in entries:
        state = test(e)
        if state is None or not e.device:
            continue
        if state and e.device not in since:
            since[e.device] = e.at
        elif not state and e.device in since:
            spans.setdefault(e.device, []).append((since.pop(e.device), e.at))
    for device, start in since.items():
        spans.setdefault(device, []).append((start, math.inf))
    return spans


def _within(spans: Iterable[tuple[float, float]], start: float, end: float) -> bool:
    """Whether one span covers the whole of [start, end]."""
    return any(a <= start and end <= b for a, b in spans)


def _overlaps(spans: Iterable[tuple[float, float]], start: float, end: float) -> bool:
    return any(a <= end and start < b for a, b in spans)


def reported_unhealthy(scenario: Scenario) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """When each device's driver (or device plugin) reports it Unhealthy, as the simulator plays
    the timeline: a device-unhealthy until its duration ends (unless a later one or a lost GPU
    outlasts it), each flap's Unhealthy half-cycles, an XID that marks the device Unhealthy and
    a lost GPU until `recover`, a failing DCGM health watch until `recover` (DCGM's verdict, not the
    driver's, but the card is as broken); on device-plugin nodes a broken health stream makes every
    device Unhealthy until it is mended. Spans are [start, end), end inf while it lasts to the end.

    This is the ground truth whether or not anyone sees it: an idle device's Unhealthy reaches
    no pod's status, so the cluster's reports (HEALTH entries) go silent on it."""
    changes: list[tuple[float, int, tuple[str, int], str, object]] = []
    """(at, order, device, what, token) in the order the simulator applies them."""
    order = 0
    for fault in sorted(scenario.timeline, key=lambda f: f.at):
        places = _devices_of(scenario, fault)
        kind = fault.kind
        if fault.device is None and not (
            kind in ("health-stream-broken", "recover")
            and places
            and scenario.nodes[places[0][0]].path == "device-plugin"
        ):
            continue
        for place in places:
            order += 1
            if kind == "device-unhealthy":
                changes.append((fault.at, order, place, "unhealthy", order))
                if fault.duration is not None:
                    changes.append((fault.at + fault.duration, order, place, "end", order))
            elif kind == "flap":
                period = fault.period or 1.0
                for i in range(fault.times or 1):
                    changes.append((fault.at + i * period, order, place, "unhealthy", None))
                    changes.append((fault.at + i * period + period / 2, order, place, "healthy", None))
            elif kind == "xid" and (
                fault.unhealthy if fault.unhealthy is not None else fault.xid not in APPLICATION_XIDS
            ):
                changes.append((fault.at, order, place, "unhealthy", None))
            elif kind == "gpu-lost":
                changes.append((fault.at, order, place, "lost", None))
            elif kind == "health-watch":
                # DCGM fails the card until it recovers: no release while it does.
                changes.append((fault.at, order, place, "unhealthy", None))
            elif kind == "recover" and fault.device is not None:
                changes.append((fault.at, order, place, "recover", None))
            elif kind == "health-stream-broken":
                changes.append((fault.at, order, place, "stream-broken", order))
                if fault.duration is not None:
                    changes.append((fault.at + fault.duration, order, place, "stream-end", order))
            elif kind == "recover":
                changes.append((fault.at, order, place, "stream-end", None))
    state: dict[tuple[str, int], dict[str, object]] = {}
    spans: dict[tuple[str, int], list[tuple[float, float]]] = {}
    since: dict[tuple[str, int], float] = {}
    for at, _, place, what, token in sorted(changes, key=lambda c: (c[0], c[1])):
        s = state.setdefault(place, {"unhealthy": False, "lost": False, "token": None, "stream": None})
        if what == "unhealthy":
            s["unhealthy"], s["token"] = True, token if token is not None else s["token"]
        elif (what == "end" and s["token"] == token and not s["lost"]) or what == "healthy":
            s["unhealthy"] = False  # a timed spell's end, or a flap's Healthy half
        elif what == "lost":
            s["unhealthy"], s["lost"] = True, True
        elif what == "recover":
            s.update(unhealthy=False, lost=False, token=None)
        elif what == "stream-broken":
            s["stream"] = token
        elif what == "stream-end" and (token is None or s["stream"] == token):
            s["stream"] = None
        bad = bool(s["unhealthy"]) or s["stream"] is not None
        if bad and place not in since:
            since[place] = at
        elif not bad and place in since:
            spans.setdefault(place, []).append((since.pop(place), at))
    for place, at in since.items():
        spans.setdefault(place, []).append((at, math.inf))
    return spans


def _released_while_unhealthy(
    entries: list[Entry], scenario: Scenario, journal: Journal, label: Label
) -> list[str]:
    uuid_at = {(d.node, d.index): d.uuid for d in journal.devices.values()}
    truth = {uuid_at.get(place, ""): spans for place, spans in reported_unhealthy(scenario).items()}
    out: list[str] = []
    for e in entries:
        if e.kind is not Kind.PHASE or e.what != "Released":
            continue
        # The release happened at most one observation before it was seen: blamed only when the
        # device was reported Unhealthy throughout that observation.
        if _within(truth.get(e.device, ()), e.at - journal.resolution_seconds, e.at):
            out.append(
                f"t+{e.at:.0f}s {label(e.device, e.node)} released while its driver reported it Unhealthy"
            )
    return out


def _quarantine_windows(entries: list[Entry]) -> list[tuple[str, str, str, str, float, float]]:
    """(record, device, node, episode, start, end) of each quarantine episode of an enforced
    quarantine (not a restrict: Unknown never moves work): from an entry into Quarantined until
    the record ramps (opted-in work may come), leaves the ladder (Released, Abandoned, Pending,
    Deferred) or enters Quarantined again (the next episode)."""
    windows: list[tuple[str, str, str, str, float, float]] = []
    open_: dict[str, tuple[str, str, str, float]] = {}
    action: dict[str, str] = {}
    for e in entries:
        if e.kind is not Kind.PHASE:
            continue
        name = e.detail.get("record", "")
        if action.setdefault(name, e.detail.get("action", "quarantine")) != "quarantine":
            continue
        episode = e.detail.get("episode", "")
        ends = e.what in RAMPS or e.what not in RELEASING
        if name in open_ and ends and not (e.what == "Quarantined" and episode == open_[name][2]):
            device, node, was, start = open_.pop(name)
            windows.append((name, device, node, was, start, e.at))
        if e.what == "Quarantined" and name not in open_:
            open_[name] = (e.device, e.node, episode, e.at)
    windows += [(name, d, n, ep, start, math.inf) for name, (d, n, ep, start) in open_.items()]
    return windows


@dataclass(frozen=True, slots=True)
class Exposure:
    """A pod other than gpuhealth's own (a holder, a check) that started on a card while the card
    was quarantined: work handed a card the product excluded."""

    at: float
    """When the pod was seen starting (POD_STARTED)."""
    pod: str
    device: str
    label: str
    """The card as the narrative names it (`node/gpu-i`)."""
    record: str
    since: float
    """When the record was seen entering the quarantine episode the pod started in."""


def exposures(journal: Journal) -> tuple[Exposure, ...]:
    """Every pod start (POD_STARTED) on a card inside one of its quarantine windows
    (`_quarantine_windows`: from the record seen Quarantined until it is seen on the ramp or off
    the ladder), other than gpuhealth's holder and check pods, which are meant to be there.
    Strictly inside: a start seen at the very moment a window opens or closes may have come
    before it (both are stamped when seen). Pods already on the card when it was quarantined
    started before: their move is `_pods_left`'s."""
    ordered = sorted_entries(journal.entries)
    windows = _quarantine_windows(ordered)
    out: list[Exposure] = []
    for e in ordered:
        if e.kind is not Kind.POD_STARTED or e.detail.get("holder") or e.detail.get("check"):
            continue
        cards = [d for d in e.detail.get("devices", e.device).split(",") if d]
        for record, device, _, _, start, end in windows:
            if device in cards and start < e.at < end:
                out.append(Exposure(e.at, e.what, device, journal.label(device), record, start))
    return tuple(out)


def _pods_left(entries: list[Entry], deadline: float, ended_at: float, label: Label) -> list[str]:
    if math.isinf(deadline):
        return []
    on_device: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    """(device, pod) -> (from, to, job) of each spell running there."""
    running: dict[tuple[str, str], tuple[float, str]] = {}
    for e in entries:
        if e.kind is not Kind.POD or e.detail.get("check") or e.detail.get("holder"):
            continue  # gpuhealth's own checks and holders are meant to be on the card
        pod, job = e.detail.get("pod", ""), e.detail.get("job", "")
        for device in [d for d in e.detail.get("devices", e.device).split(",") if d]:
            key = (device, pod)
            if e.what == "running" and key not in running:
                running[key] = (e.at, job)
            elif e.what == "stopped" and key in running:
                start, job = running.pop(key)
                on_device.setdefault(key, []).append((start, e.at, job))
    for key, (start, job) in running.items():
        on_device.setdefault(key, []).append((start, math.inf, job))
    started: dict[tuple[str, str, str], float] = {}
    """(record, job, episode) -> when its move was first seen in the record."""
    in_flight: dict[tuple[str, str, str], tuple[str, float, float]] = {}
    """(record, job, episode) -> (node, start, end) of each move, end inf while under way."""
    unrecoverable: set[tuple[str, str]] = set()
    tripped: list[tuple[float, float]] = []
    trip_since: float | None = None
    for e in entries:
        move_key = (e.detail.get("record", ""), e.detail.get("job", ""), e.detail.get("episode", ""))
        if e.kind is Kind.NOTE and e.what == "move-started":
            started.setdefault(move_key, e.at)
            in_flight.setdefault(move_key, (e.node, e.at, math.inf))
        elif e.kind is Kind.MIGRATION:
            if e.what == "unrecoverable":
                unrecoverable.add((move_key[0], move_key[1]))
            if move_key in in_flight:
                node, start, _ = in_flight[move_key]
                in_flight[move_key] = (node, start, e.at)
        elif e.kind is Kind.BREAKER:
            if e.what == "tripped" and trip_since is None:
                trip_since = e.at
            elif e.what != "tripped" and trip_since is not None:
                tripped.append((trip_since, e.at))
                trip_since = None
    if trip_since is not None:
        tripped.append((trip_since, math.inf))
    out: list[str] = []
    for record, device, node, episode, w_start, w_end in _quarantine_windows(entries):
        for (pod_device, pod), spells in on_device.items():
            if pod_device != device:
                continue
            for p_start, p_end, job in spells:
                since = max(w_start, p_start)
                if since >= min(w_end, p_end):
                    continue  # not on the device while it was quarantined
                move = started.get((record, job, episode))
                if move is not None:
                    due = max(since, move) + deadline
                else:
                    due = since + deadline
                    if any(n == node and _overlaps([(a, b)], since, due) for n, a, b in in_flight.values()):
                        continue  # the node's one move in flight holds this one back
                if due >= min(p_end, w_end, ended_at):
                    continue
                if (record, job) in unrecoverable or _overlaps(tripped, since, due):
                    continue
                what = f"its move started t+{move:.0f}s" if move is not None else "no move started"
                out.append(
                    f"t+{due:.0f}s pod {pod} still on quarantined {label(device, node)} "
                    f"({_seconds(deadline)} after t+{since:.0f}s; {what}) and its move not unrecoverable"
                )
    return out


def _checks_elsewhere(entries: list[Entry], records: Mapping[str, _Record], label: Label) -> list[str]:
    out: list[str] = []
    for e in entries:
        if e.kind is not Kind.CHECK:
            continue
        record = records.get(e.detail.get("record", ""))
        device = record.device if record is not None else e.device
        if "ranOn" not in e.detail or not device:
            continue  # a journal that does not say where checks ran
        ran_on = {d for d in e.detail["ranOn"].split(",") if d}
        where = label(device, e.node)
        if ran_on and ran_on != {device}:
            others = ", ".join(label(d, "") for d in sorted(ran_on - {device})) or "no device"
            out.append(
                f"t+{e.at:.0f}s the {e.what} of {where} ({e.detail.get('result', '?')}) ran on {others}"
            )
        elif not ran_on and e.detail.get("result") == "passed":
            out.append(f"t+{e.at:.0f}s the {e.what} of {where} passed with no pod seen on the device")
    return out


def _requested_releases(entries: list[Entry], ladder: Ladder, label: Label) -> list[str]:
    wanted = [r.name for r in ladder.checks()]
    passed: dict[tuple[str, str], set[str]] = {}
    out: list[str] = []
    for e in entries:
        name = e.detail.get("record", "")
        if e.kind is Kind.CHECK and e.detail.get("result") == "passed":
            passed.setdefault((name, e.detail.get("attempt", "")), set()).add(e.what)
        elif e.kind is Kind.PHASE and e.what == "Released" and e.detail.get("requested"):
            attempt = e.detail.get("attempt", "")
            missing = [k for k in wanted if k not in passed.get((name, attempt), set())]
            if missing:
                out.append(
                    f"t+{e.at:.0f}s {label(e.device, e.node)} released at {e.detail['requested']}'s request "
                    f"without a passed {' and '.join(missing)} in attempt {attempt or '?'}"
                )
    return out


def _holders_outlasting(entries: list[Entry], reaction: float, ended_at: float, label: Label) -> list[str]:
    """A holder pod of gpuhealth's on a card outside its record's hold: before the record's
    quarantine, or longer than `reaction` after it reached its ramp or ended (the card kept
    from work that may use it again). The hold's windows are the record's quarantine episodes,
    one after another."""
    if math.isinf(reaction):
        return []
    spans: dict[str, list[tuple[float, float]]] = {}
    for record, _device, _node, _episode, start, end in _quarantine_windows(entries):
        merged = spans.setdefault(record, [])
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    running: dict[tuple[str, str], tuple[float, str]] = {}
    spells: list[tuple[str, str, str, float, float]] = []
    for e in entries:
        holder = e.detail.get("holder")
        if e.kind is not Kind.POD or not holder:
            continue
        key = (e.device, e.detail.get("pod", ""))
        if e.what == "running" and key not in running:
            running[key] = (e.at, holder)
        elif e.what == "stopped" and key in running:
            start, holder = running.pop(key)
            spells.append((key[0], key[1], holder, start, e.at))
    spells += [(device, pod, holder, start, math.inf) for (device, pod), (start, holder) in running.items()]
    out: list[str] = []
    for device, pod, holder, start, end in spells:
        # The holder's label is its record's name, cut to a label value's 63 characters.
        windows = [w for name, ws in spans.items() if name[:63].rstrip("-.") == holder for w in ws]
        window = next((w for w in windows if w[0] <= start + reaction and start < w[1] + reaction), None)
        stop = min(end, ended_at)
        if window is None:
            out.append(
                f"t+{start:.0f}s holder {pod} on {label(device, '')} outside any quarantine of its record"
            )
        elif stop > window[1] + reaction:
            out.append(
                f"t+{window[1] + reaction:.0f}s holder {pod} still on {label(device, '')} "
                f"{_seconds(stop - window[1])} after its record's hold ended at t+{window[1]:.0f}s"
            )
    return out


def _unenforced(entries: list[Entry], reaction: float, ended_at: float, label: Label) -> list[str]:
    if math.isinf(reaction):
        return []
    enforced = _spans(
        entries,
        lambda e: (
            (e.kind is Kind.ENFORCED)
            if e.what == "quarantine" and e.kind in (Kind.ENFORCED, Kind.LIFTED)
            else None
        ),
    )
    firing: dict[tuple[str, str], list[tuple[float, float]]] = {}
    since: dict[tuple[str, str], float] = {}
    tripped: list[float] = []
    holds: dict[str, list[tuple[float, str]]] = {}
    for e in entries:
        if e.kind is Kind.ALERT_FIRING:
            since.setdefault((e.what, e.device), e.at)
        elif e.kind is Kind.ALERT_RESOLVED and (e.what, e.device) in since:
            firing.setdefault((e.what, e.device), []).append((since.pop((e.what, e.device)), e.at))
        elif e.kind is Kind.BREAKER and e.what == "tripped":
            tripped.append(e.at)
        elif e.kind is Kind.PHASE:
            holds.setdefault(e.device, []).append((e.at, e.detail.get("why", "")))
    for alert, at in since.items():
        firing.setdefault(alert, []).append((at, math.inf))
    out: list[str] = []
    judged: set[tuple[str, str]] = set()
    for e in entries:
        if not (
            e.kind is Kind.DELIVERY
            and e.what == "responder"
            and e.detail.get("status") == "firing"
            and e.detail.get("action") == "quarantine"
            and e.device
        ):
            continue
        due = e.at + reaction
        alert = (e.detail.get("alertname", ""), e.device)
        if due > ended_at or alert in judged:  # one line per alert, however often delivered
            continue
        if not _within(firing.get(alert, ()), e.at, due):
            continue  # Prometheus did not fire it throughout: no longer warranted meanwhile
        if any(at <= due for at in tripped):
            continue  # the breaker was (or went) open: it holds new quarantines back
        last_hold = [why for at, why in holds.get(e.device, []) if at <= due]
        if last_hold and last_hold[-1] in GUARDRAIL_HOLDS:
            continue
        if _overlaps(enforced.get(e.device, ()), e.at, due):
            continue
        judged.add(alert)
        out.append(
            f"t+{e.at:.0f}s {alert[0]} fired for {label(e.device, e.node)} and reached the responder, "
            f"but the device was not enforced by t+{due:.0f}s with the breaker closed"
        )
    return out


def _steps_without_health(entries: list[Entry], pass_seconds: float, label: Label) -> list[str]:
    down: list[tuple[float, float]] = []
    since: float | None = None
    for e in entries:
        if e.kind is Kind.HEALTH_SOURCE:
            if e.what == "down" and since is None:
                since = e.at
            elif e.what == "up" and since is not None:
                down.append((since, e.at))
                since = None
    if since is not None:
        down.append((since, math.inf))
    if not down:
        return []
    order = {phase: i for i, phase in enumerate((*KNOWN.phases, "Released"))}
    previous: dict[str, str] = {}
    out: list[str] = []
    for e in entries:
        if e.kind is not Kind.PHASE:
            continue
        name = e.detail.get("record", "")
        before, previous[name] = previous.get(name, ""), e.what
        if e.what not in order or order.get(before, -1) >= order[e.what]:
            continue  # not a step up the ladder
        if any(a + pass_seconds < e.at < b for a, b in down):
            out.append(
                f"t+{e.at:.0f}s {label(e.device, e.node)} stepped {before or '?'} -> {e.what} "
                "while the responders' health source was down"
            )
    return out


def _resets(entries: list[Entry], active: Callable[[str, float], list[_Record]], label: Label) -> list[str]:
    """A GPU reset started on a card no quarantine held, or under a workload's running pod."""
    running: dict[str, set[str]] = {}
    out: list[str] = []
    for e in entries:
        if e.kind is Kind.POD and not e.detail.get("check") and not e.detail.get("holder"):
            for device in (e.detail.get("devices") or e.device).split(","):
                pods = running.setdefault(device, set())
                if e.what == "running":
                    pods.add(e.detail.get("pod", ""))
                else:
                    pods.discard(e.detail.get("pod", ""))
        elif e.kind is Kind.RESET and e.what == "started":
            if not active(e.device, e.at):
                out.append(
                    f"t+{e.at:.0f}s a GPU reset of {label(e.device, e.node)}, which no quarantine held"
                )
            if running.get(e.device):
                names = ", ".join(sorted(running[e.device]))
                out.append(
                    f"t+{e.at:.0f}s a GPU reset of {label(e.device, e.node)} under running work ({names})"
                )
    return out


def _seconds(value: float) -> str:
    return f"{value:.0f}s"
