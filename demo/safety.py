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
  record is a `restrict` (Unknown), or of a device with no record at all;
- a node-wide action (cordon, node taint) for a device fault: any NODE_ACTION entry;
- an action done twice: two DeviceTaintRules for one device at once, two records for one
  device at once, the same pod evicted twice, one job's migration finished twice by a record;
- a release without probe and canary: Released without a passed probe and a passed canary
  since the record last became Quarantined;
- a warranted quarantine that did not happen: no record for a warranted device in time
  (`grace` after its warrant, within the run), unless the breaker was tripped by then. Flaps
  and short Unhealthy spells may rightly go unanswered, except a flap the rules' Unhealthy
  flapping rule must catch (`UnhealthyFlapping`): enough short episodes within its window,
  due from the episode that completes the count;
- a breaker that blocked a release: a record in a release phase sent back (Deferred, or
  Quarantined without a failed check) while the breaker was tripped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from demo.journal import Entry, Journal, Kind, sorted_entries
from responder.ladder import LADDER
from simulator.model import Fault, Scenario

QUARANTINE_FAULTS = frozenset({"device-unhealthy", "gpu-lost", "row-remap-failure"})


def warrants(
    scenario: Scenario,
    *,
    fatal_xids: Iterable[int],
    tolerance: float,
    backoff: UnknownBackoff | None = None,
) -> dict[tuple[str, int], set[str]]:
    """Actions each (node, gpu index) may receive, from the scenario's faults."""
    return _by_place(warranted_from(scenario, fatal_xids=fatal_xids, tolerance=tolerance, backoff=backoff))


def _by_place(since: Mapping[tuple[tuple[str, int], str], float]) -> dict[tuple[str, int], set[str]]:
    allowed: dict[tuple[str, int], set[str]] = {}
    for place, action in since:
        allowed.setdefault(place, set()).add(action)
    return allowed


@dataclass(frozen=True, slots=True)
class UnknownBackoff:
    """The rules' backoff of the Unknown tolerance window in scenario seconds: each earlier Unknown
    spell of the device that was still on within `repeat_window` before a spell's start halves
    that spell's window, never below `floor` (node_device:gpu_device_unknown_tolerance:seconds)."""

    floor: float
    repeat_window: float


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
                window = max(backoff.floor, tolerance / 2 ** min(earlier, 64))
            windows.append((start, length, window))
        out[key] = windows
    return out


def warranted_from(
    scenario: Scenario,
    *,
    fatal_xids: Iterable[int],
    tolerance: float,
    backoff: UnknownBackoff | None = None,
) -> dict[tuple[tuple[str, int], str], float]:
    """The scenario time from which each ((node, gpu), action) is warranted.

    A confirmed failure warrants quarantine from its fault on; a long Unknown warrants
    restrict once its tolerance window (`tolerance`, shortened by `backoff` for repeats) has
    run from the start of its spell.
    """
    fatal = frozenset(fatal_xids)
    since: dict[tuple[tuple[str, int], str], float] = {}
    spells = _windowed(_unknown_spells(scenario), tolerance, backoff)
    for fault in scenario.timeline:
        for node, gpu in _devices_of(scenario, fault):
            action = _warranted_action(scenario, fault, fatal, spells)
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
) -> str | None:
    kind = fault.kind
    if kind in QUARANTINE_FAULTS:
        return "quarantine"
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


NO_ACTION = frozenset({"", "none"})
"""`action` label values that ask the responder for nothing."""
RELEASING = frozenset(LADDER.phases)
"""Phases of a record on its way out: the release ladder's rungs."""


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
) -> Verdict:
    """The run's verdict (pure). Times in scenario seconds: `tolerance` the rules' Unknown
    tolerance, `unhealthy_for` the Unhealthy alert's `for:` (an Unhealthy that clears sooner
    warrants nothing that must happen, unless enough of them make a flap by `flapping`, the
    rules' Unhealthy flapping thresholds), `grace` how long after its warrant a quarantine may
    take to be recorded (the detection floor plus the responder's reaction), `backoff` the
    rules' shortening of the Unknown window for repeated spells (None: every spell gets
    `tolerance`)."""
    since = warranted_from(scenario, fatal_xids=fatal_xids, tolerance=tolerance, backoff=backoff)
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
    migrated: set[tuple[str, str]] = set()
    checks: dict[str, set[str]] = {}
    failed_check: dict[str, bool] = {}
    tripped = False
    tripped_at: float | None = None
    pending: list[tuple[Entry, str]] = []
    """Evictions of pods on no quarantined device, with the cause they would have."""
    moved_by_quarantine: set[str] = set()

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
                missing = [k for k in ("probe", "canary") if k not in passed]
                if missing:
                    violations.append(
                        f"t+{e.at:.0f}s {where} released without a passed {' and '.join(missing)}"
                    )
            if e.what in ("Released", "Abandoned"):
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
                current = rules.setdefault(e.device, set())
                if current - {rule}:
                    violations.append(
                        f"t+{e.at:.0f}s a second DeviceTaintRule {rule} for {where} while "
                        f"{', '.join(sorted(current))} exists"
                    )
                current.add(rule)
        elif e.kind is Kind.LIFTED:
            rule = e.detail.get("rule")
            if rule:
                rules.get(e.device, set()).discard(rule)
        elif e.kind is Kind.EVICTION:
            devices = [d for d in e.detail.get("devices", e.device).split(",") if d] or [e.device]
            if e.what in evicted:
                violations.append(f"t+{e.at:.0f}s pod {e.what} evicted a second time")
            evicted.add(e.what)
            holding = _records_of(records, devices, e.at)
            if not any(r.action == "quarantine" for r in holding):
                # A fixed-topology job's other pods hold healthy devices: the job's migration
                # by a quarantine record (judged at the end) is then the cause.
                pending.append((e, "an Unknown (restrict)" if holding else "no quarantine"))
        elif e.kind is Kind.MIGRATION:
            name = e.detail.get("record", "")
            record = records.get(name)
            key = (name, e.detail.get("job", ""))
            if key in migrated:
                violations.append(f"t+{e.at:.0f}s the migration of {key[1]} off {where} finished twice")
            migrated.add(key)
            if record is not None and record.action == "quarantine":
                moved_by_quarantine.add(key[1])
            if record is None or record.action != "quarantine":
                cause = "an Unknown (restrict)" if record is not None else "no quarantine"
                violations.append(f"t+{e.at:.0f}s a migration of {key[1]} off {where} for {cause}")
        elif e.kind is Kind.NODE_ACTION:
            violations.append(f"t+{e.at:.0f}s a node-wide {e.what} ({e.detail.get('key', '')}) on {e.node}")
        elif e.kind is Kind.BREAKER:
            tripped = e.what == "tripped"
            if tripped and tripped_at is None:
                tripped_at = e.at

    for e, cause in pending:
        if e.detail.get("job") not in moved_by_quarantine:
            violations.append(f"t+{e.at:.0f}s pod {e.what} on {label(e.device, e.node)} evicted for {cause}")
    acted: set[tuple[str, str]] = set()
    missed: set[tuple[str, str]] = set()
    transient = _transient(scenario, unhealthy_for)
    due = flapping_due(scenario, unhealthy_for=unhealthy_for, rule=flapping) if flapping else {}
    uuid_at = {(d.node, d.index): d.uuid for d in journal.devices.values()}
    for (place, action), at in sorted(since.items()):
        device = uuid_at.get(place, "")
        where = f"{place[0]}/gpu-{place[1]}"
        covered = [r for r in records.values() if r.device == device and r.ended >= at]
        # A flap the flapping rule catches must be answered, from the episode that completes it.
        flap = place in transient and action == "quarantine" and place in due
        must_from = due[place] if flap else at
        if any(r.action == action for r in covered):
            acted.add((where, action))
        elif covered:
            acted.add((where, covered[0].action))
        elif (
            (place in transient and not flap)
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
    return Verdict(tuple(violations), tuple(sorted(acted)), tuple(sorted(missed)))


def _records_of(records: Mapping[str, _Record], devices: Iterable[str], at: float) -> list[_Record]:
    wanted = set(devices)
    return [r for r in records.values() if r.device in wanted and r.created <= at < r.ended]


def _transient(scenario: Scenario, unhealthy_for: float) -> set[tuple[str, int]]:
    """Devices whose only confirmed failure may rightly raise no alert (flaps, short Unhealthy)."""
    return {
        (f.device.node, f.device.gpu)
        for f in scenario.timeline
        if f.device is not None
        and (
            f.kind == "flap"
            or (f.kind == "device-unhealthy" and f.duration is not None and f.duration < unhealthy_for)
        )
    }
