"""What a demo run did, read from its journal: the figures a person checks after a run.

Pure: `summarize` turns a `Journal` into a `Summary` (frozen data, no I/O), `write_text` prints
it. The HTML report (`demo.report`) and the end-to-end latency bench
(`bench/bench_e2e_latency.py`) read the same `Summary`, so the terminal, the report and the
bench never disagree about a latency.

Detection latency of a fault is a chain of journal stamps on its device:

    onset -> alert firing -> delivery to the responder -> enforced (DeviceTaintRule or annotation)

The onset is the moment the fault became visible to the pipeline: the NVML event itself for
faults NVML reports (XIDs, ECC, row remapping, a lost GPU: the FAULT entry), and the kubelet's
own report for the others (the first HEALTH entry after the fault saying Unhealthy, or Unknown
for a silent device). Journal entries are stamped when the pipeline saw them, so two stages
observed by different watchers can come out of order by up to `Journal.resolution_seconds`;
each stage is therefore taken no later than the next one (which proves it had happened) and no
earlier than the one before it, which keeps every component non-negative and makes the
components add up to the total exactly. The floor the total is held against is the
pipeline's own: scrape + evaluation interval + the alert's `for:` + group_wait (`floors` per
alert name when the caller knows them, from `demo.floors`; `Journal.floor_seconds` otherwise).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TextIO

from demo.journal import Entry, Journal, Kind, sorted_entries
from demo.safety import Exposure, exposures
from gpuhealth.tables import write_table
from responder.ladder import LADDER
from responder.reconcile.measures import measured_phases
from responder.records import ENDED_PHASES, RELEASE_PHASES, Phase
from responder.verdicts import QuarantineVerdict
from simulator.model import APPLICATION_XIDS

RESPONDER = "responder"
"""The DELIVERY receiver that is the responder's webhook."""
ACTIONS = frozenset({"quarantine", "restrict"})
"""Alert `action` labels that ask the responder to act on a device."""
NVML_FAULTS = frozenset({"xid", "ecc", "row-remap-failure", "gpu-lost", "health-watch"})
"""Faults NVML (or DCGM, for a health watch) reports as an event of its own: the onset is the fault
itself."""
KUBELET_ONSET = {"device-unknown": "Unknown", "health-stream-broken": "Unknown"}
"""Faults the pipeline first sees as a kubelet report of this health (default: Unhealthy)."""
QUARANTINE_PHASES = frozenset({Phase.PENDING, Phase.QUARANTINED, Phase.DEFERRED})
EXCLUDING_PHASES = frozenset(measured_phases())
"""Phases whose time counts as GPU time lost (`responder.reconcile.measures`). The journal keeps
a phase, not its reason, so a device waiting in Quarantined while a pod holds it (DeviceInUse)
counts under Quarantined here."""
JUDGED = {QuarantineVerdict.CONFIRMED.value: True, QuarantineVerdict.UNCONFIRMED.value: False}
"""The verdicts that claim something the ground truth can check: confirmed says a fault warranted
the quarantine, unconfirmed that none is known to have. restricted-unknown claims no failure."""


@dataclass(frozen=True, slots=True)
class Detection:
    """One fault's way through the pipeline to enforcement; times are scenario seconds."""

    fault: str
    """The fault's kind (`xid`, `device-unknown`, ...)."""
    device: str
    label: str
    fault_at: float
    onset_at: float
    """When the pipeline could first see it (NVML event, or the kubelet's report)."""
    alert: str = ""
    """The first alert with an action that fired for the device after the onset ('' if none)."""
    action: str = ""
    alert_at: float | None = None
    delivered_at: float | None = None
    enforced_at: float | None = None
    recorded_at: float | None = None
    """When the device's DeviceQuarantine record entered its first phase after the onset."""
    floor: float = 0.0

    @property
    def detect(self) -> float | None:
        """Onset -> alert firing."""
        return _span(self.onset_at, self.alert_at)

    @property
    def deliver(self) -> float | None:
        """Alert firing -> the responder's webhook received it."""
        return _span(self.alert_at, self.delivered_at)

    @property
    def enforce(self) -> float | None:
        """Webhook delivery -> the device excluded from allocation."""
        return _span(self.delivered_at, self.enforced_at)

    @property
    def total(self) -> float | None:
        """Onset -> enforced: the end-to-end detection latency."""
        return _span(self.onset_at, self.enforced_at)

    @property
    def over_floor(self) -> float | None:
        """How far the total is above the pipeline's floor (negative: below it)."""
        return None if self.total is None else self.total - self.floor


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


@dataclass(frozen=True, slots=True)
class FaultStory:
    """An injected fault and what followed it on its device (up to the next fault there)."""

    at: float
    fault: str
    target: str
    """`node/gpu-i`, or the node for node-wide faults."""
    detail: str
    detection: Detection | None
    """None for node-wide faults; a Detection without an alert when nothing acted."""
    done: tuple[str, ...]
    """What gpuhealth did for it, in order, as short sentences with their times."""


@dataclass(frozen=True, slots=True)
class Quarantine:
    """One DeviceQuarantine record as the journal saw it."""

    record: str
    device: str
    label: str
    reason: str
    started_at: float
    phases: tuple[tuple[str, float], ...]
    """Every phase it entered, in order, with its time."""
    warranted: bool
    """An injected fault on the device (or its node) preceded it; application XIDs do not count."""
    checks: tuple[tuple[str, str, float], ...] = ()
    """(probe|canary, passed|failed, at)."""
    verdict: str = ""
    """The responder's verdict on its evidence once it ended enforced (`responder.verdicts`); ''
    while open or when nothing was enforced."""
    lost_seconds: float = 0.0
    """Scenario seconds it kept its device out of service (Quarantined and the release ladder's
    rungs; an open one up to the end of the run)."""

    @property
    def agrees(self) -> bool | None:
        """Whether the verdict matches the ground truth; None for a verdict that claims neither."""
        claim = JUDGED.get(self.verdict)
        return None if claim is None else claim == self.warranted

    @property
    def released(self) -> bool:
        return any(phase == "Released" for phase, _ in self.phases)

    @property
    def false(self) -> bool:
        """A false quarantine: no fault warranted it."""
        return not self.warranted

    def reached(self, phase: str) -> float | None:
        return next((at for p, at in self.phases if p == phase), None)


@dataclass(frozen=True, slots=True)
class Migration:
    at: float
    device: str
    label: str
    job: str
    outcome: str
    """succeeded|failed|unrecoverable."""
    reason: str
    evictions: int
    """Pods of the job evicted for it (through the Eviction API)."""
    placed: tuple[str, ...] = ()
    """Devices the job's pods run on again after their eviction (re-placed by their owner)."""


@dataclass(frozen=True, slots=True)
class Event:
    """A breaker change or a process kill, for the record."""

    at: float
    what: str
    detail: str


@dataclass(frozen=True, slots=True)
class Summary:
    scenario: str
    speed: float
    ended_at: float
    floor: float
    resolution: float
    faults: tuple[FaultStory, ...]
    quarantines: tuple[Quarantine, ...]
    migrations: tuple[Migration, ...]
    breaker: tuple[Event, ...]
    processes: tuple[Event, ...]
    alerts_fired: tuple[tuple[str, int], ...]
    """(alertname, times it started firing), by name."""
    evictions: int
    tenant_events: int
    exposures: tuple[Exposure, ...] = ()
    """Pods other than gpuhealth's own that started on a card while it was quarantined (the safety
    verdict's exposure, `demo.safety.exposures`: each one breaks it)."""

    @property
    def detections(self) -> tuple[Detection, ...]:
        """The detections that reached an alert with an action, in fault order."""
        return tuple(f.detection for f in self.faults if f.detection is not None and f.detection.alert)

    @property
    def releases(self) -> tuple[Quarantine, ...]:
        """Quarantines that entered the release walk."""
        return tuple(q for q in self.quarantines if q.reached(LADDER.first.phase) is not None or q.released)

    @property
    def false_quarantines(self) -> tuple[Quarantine, ...]:
        return tuple(q for q in self.quarantines if q.false)

    @property
    def gpu_hours_lost(self) -> float:
        """GPU-hours of simulated time the quarantines kept devices out of service."""
        return sum(q.lost_seconds for q in self.quarantines) / 3600.0

    @property
    def judged(self) -> tuple[Quarantine, ...]:
        """Quarantines whose verdict the ground truth can check (confirmed or unconfirmed)."""
        return tuple(q for q in self.quarantines if q.agrees is not None)

    @property
    def agreement(self) -> str:
        """How often the verdicts agree with the ground truth, in words."""
        judged = self.judged
        restricted = sum(1 for q in self.quarantines if q.verdict == QuarantineVerdict.RESTRICTED_UNKNOWN)
        open_ = sum(1 for q in self.quarantines if not q.verdict)
        head = (
            f"verdicts agree with the ground truth on {sum(1 for q in judged if q.agrees)} of {len(judged)} "
            "confirmed or unconfirmed quarantines"
            if judged
            else "no confirmed or unconfirmed quarantine to compare with the ground truth"
        )
        return f"{head}; {restricted} restricted-unknown (no failure claimed); {open_} without a verdict"


def summarize(journal: Journal, *, floors: Mapping[str, float] | None = None) -> Summary:
    """The summary of `journal`; `floors` gives the floor per alert name (scenario seconds).

    Works on any journal, whatever the order of its entries (they are taken by time) and
    whatever is missing from it (a stage never seen is None, not an error).
    """
    entries = sorted_entries(journal.entries)
    faults = [e for e in entries if e.kind is Kind.FAULT]
    stories = tuple(
        _story(journal, entries, fault, _next_fault_at(faults, i), floors or {})
        for i, fault in enumerate(faults)
    )
    quarantines = _quarantines(journal, entries, faults)
    return Summary(
        scenario=journal.scenario,
        speed=journal.speed,
        ended_at=journal.ended_at,
        floor=journal.floor_seconds,
        resolution=journal.resolution_seconds,
        faults=stories,
        quarantines=quarantines,
        migrations=_migrations(journal, entries),
        breaker=tuple(
            Event(e.at, e.what, _pairs(e.detail, "trigger", "actor"))
            for e in entries
            if e.kind is Kind.BREAKER
        ),
        processes=tuple(
            Event(e.at, e.what, _pairs(e.detail, "name", "role")) for e in entries if e.kind is Kind.PROCESS
        ),
        alerts_fired=_count(e.what for e in entries if e.kind is Kind.ALERT_FIRING),
        evictions=sum(1 for e in entries if e.kind is Kind.EVICTION),
        tenant_events=sum(1 for e in entries if e.kind is Kind.TENANT_EVENT),
        exposures=exposures(journal),
    )


def concerns(entry: Entry, device: str) -> bool:
    """Whether an entry is about `device`: its own, or one of the `devices` it lists (an
    eviction names the pod's first device and lists them all)."""
    if entry.device == device:
        return True
    listed = entry.detail.get("devices", "")
    return bool(listed) and device in listed.split(",")


def _next_fault_at(faults: Sequence[Entry], index: int) -> float:
    """When the next fault on the same device (or node, for node faults) was injected."""
    fault = faults[index]
    for later in faults[index + 1 :]:
        if (later.device, later.node) == (fault.device, fault.node) and later.at > fault.at:
            return later.at
    return math.inf


def _story(
    journal: Journal, entries: Sequence[Entry], fault: Entry, until: float, floors: Mapping[str, float]
) -> FaultStory:
    target = journal.label(fault.device) if fault.device else fault.node or "fleet"
    detail = _pairs(fault.detail, "xid", "duration")
    if not fault.device:
        done = tuple(
            _sentence(journal, e)
            for e in entries
            if fault.at <= e.at < until and e.node == fault.node and e.kind in _DONE_KINDS
        )
        return FaultStory(fault.at, fault.what, target, detail, None, done)
    window = [e for e in entries if fault.at <= e.at < until]
    # A fixed-topology job moves whole: its pods on other devices are evicted for this fault too.
    jobs = {e.detail.get("job") for e in window if e.kind is Kind.MIGRATION and concerns(e, fault.device)} - {
        None,
        "",
    }
    mine = [
        e
        for e in window
        if concerns(e, fault.device) or (e.kind is Kind.EVICTION and e.detail.get("job") in jobs)
    ]
    detection = _detect(journal, fault, mine, floors)
    done = tuple(_sentence(journal, e) for e in mine if e.kind in _DONE_KINDS)
    return FaultStory(fault.at, fault.what, target, detail, detection, done)


def _detect(journal: Journal, fault: Entry, mine: Sequence[Entry], floors: Mapping[str, float]) -> Detection:
    onset = fault.at
    if fault.what not in NVML_FAULTS:
        health = KUBELET_ONSET.get(fault.what, "Unhealthy")
        seen = _first(mine, Kind.HEALTH, lambda e: e.what == health)
        if seen is not None:
            onset = seen.at
    alert = _first(mine, Kind.ALERT_FIRING, lambda e: e.at >= onset and e.detail.get("action", "") in ACTIONS)
    base = Detection(
        fault=fault.what,
        device=fault.device,
        label=journal.label(fault.device),
        fault_at=fault.at,
        onset_at=onset,
        floor=journal.floor_seconds,
    )
    record = _first(mine, Kind.PHASE, lambda e: e.at >= onset)
    recorded_at = None if record is None else record.at
    if alert is None:
        return replace(base, recorded_at=recorded_at)
    alertname = alert.what
    delivery = _first(
        mine,
        Kind.DELIVERY,
        lambda e: (
            e.what == RESPONDER
            and e.detail.get("alertname") == alertname
            and e.detail.get("status", "firing") == "firing"
            and e.at >= onset
        ),
    )
    enforced = _first(mine, Kind.ENFORCED, lambda e: e.what == "quarantine" and e.at >= onset)
    alert_at, delivered_at, enforced_at = _ordered(
        onset, [alert.at, delivery.at if delivery else None, enforced.at if enforced and delivery else None]
    )
    return replace(
        base,
        alert=alertname,
        action=alert.detail.get("action", ""),
        alert_at=alert_at,
        delivered_at=delivered_at,
        enforced_at=enforced_at,
        recorded_at=recorded_at,
        floor=floors.get(alertname, journal.floor_seconds),
    )


def _ordered(onset: float, stamps: list[float | None]) -> list[float | None]:
    """Stage times in chain order, each no later than the next (which proves it had happened by
    then: watchers stamp what they see, some later than others) and no earlier than the one before."""
    times = list(stamps)
    for i in reversed(range(len(times) - 1)):
        later = times[i + 1]
        current = times[i]
        if later is not None and current is not None:
            times[i] = min(current, later)
    previous = onset
    for i, current in enumerate(times):
        if current is None:
            break
        times[i] = previous = max(current, previous)
    return times


def _first(entries: Iterable[Entry], kind: Kind, test: Any) -> Entry | None:
    return next((e for e in entries if e.kind is kind and test(e)), None)


_DONE_KINDS = frozenset(
    {
        Kind.PHASE,
        Kind.ENFORCED,
        Kind.LIFTED,
        Kind.EVICTION,
        Kind.MIGRATION,
        Kind.CHECK,
        Kind.NODE_ACTION,
        Kind.TENANT_EVENT,
    }
)


def _sentence(journal: Journal, entry: Entry) -> str:
    """One short line for something gpuhealth did (its device is the story's), with its time."""
    return f"t+{entry.at:.0f}s {describe(journal, entry, where=False)}"


def describe(journal: Journal, entry: Entry, *, where: bool = True) -> str:
    """What an entry says, in a few words: the one wording of the narration, summary and report.

    `where`: name the device (or node) the entry is about; off where the reader knows it.
    """
    d = entry.detail
    place = (journal.label(entry.device) if entry.device else entry.node) if where else ""
    at = f" {place}" if place else ""
    match entry.kind:
        case Kind.FAULT:
            # The pipeline's `message` retells the fault (kind, target, xid): not repeated here.
            extra = _pairs(d, "xid", "duration")
            text = f"{entry.what}{at}" + (f" ({extra})" if extra else "")
        case Kind.HEALTH:
            text = f"{place or 'device'} -> {entry.what}"
        case Kind.ALERT_FIRING:
            text = f"FIRING {entry.what}{at}" + (f" {_pairs(d, 'action', 'severity')}" if d else "")
        case Kind.ALERT_RESOLVED:
            text = f"resolved {entry.what}{at}"
        case Kind.DELIVERY:
            text = f"{entry.what} <- {d.get('status', '?')} {d.get('alertname', '?')}{at}"
        case Kind.PHASE:
            text = f"record{at} {entry.what}" + (f" ({d['reason']})" if d.get("reason") else "")
        case Kind.ENFORCED:
            how = "DeviceTaintRule" if d.get("rule") else "node annotation" if d.get("annotation") else "?"
            text = f"{entry.what} enforced{at} ({how})"
        case Kind.LIFTED:
            text = f"{entry.what} lifted{at}"
        case Kind.EVICTION:
            text = (
                f"evicted {entry.what}"
                + (f" (job {d['job']})" if d.get("job") else "")
                + (f" from{at}" if at else "")
            )
        case Kind.MIGRATION:
            text = f"migration {entry.what}" + (f" (job {d['job']})" if d.get("job") else "")
            if d.get("reason"):
                text += f": {d['reason']}"
        case Kind.CHECK:
            text = f"{entry.what} {d.get('result', '?')}{at}"
        case Kind.BREAKER:
            extra = _pairs(d, "trigger", "actor")
            text = f"breaker {entry.what}" + (f" ({extra})" if extra else "")
        case Kind.NODE_ACTION:
            text = f"NODE-WIDE {entry.what} on {entry.node}" + (f" ({d['key']})" if d.get("key") else "")
        case Kind.TENANT_EVENT:
            text = f"tenant Event {entry.what}" + (f" on {d['pod']}" if d.get("pod") else "")
        case Kind.PROCESS:
            text = f"{d.get('name', 'process')} {entry.what}" + (f" ({d['role']})" if d.get("role") else "")
        case Kind.POD:
            what = f"{d['check']} pod" if d.get("check") else "pod"
            text = f"{what} {d.get('pod', '?')} {entry.what}" + (f" on{at}" if at else "")
        case Kind.POD_STARTED:
            what = f"{d['check']} pod" if d.get("check") else "holder pod" if d.get("holder") else "pod"
            text = f"{what} {entry.what} started" + (f" on{at}" if at else "")
        case Kind.REQUEST:
            who = d.get("actor", "a person")
            if entry.what == "requested":
                text = f"release of{at} requested by {who}"
            else:
                by = " by the command" if d.get("by") == "command" else ""
                text = f"release request{at} {entry.what}{by}" + (
                    f": {d['message']}" if d.get("message") else ""
                )
        case Kind.HEALTH_SOURCE:
            text = f"responders' health source {entry.what}"
        case _:
            text = d.get("detail") or f"{entry.what}{at}"
    return text


def _warranting(fault: Entry) -> bool:
    """Whether an injected fault is a real device or node problem (application XIDs are not)."""
    if fault.what == "recover":
        return False
    if fault.what == "xid":
        xid = fault.detail.get("xid", "")
        if fault.detail.get("unhealthy", "").lower() == "false":
            return False
        return not (xid.isdigit() and int(xid) in APPLICATION_XIDS)
    return True


def _quarantines(
    journal: Journal, entries: Sequence[Entry], faults: Sequence[Entry]
) -> tuple[Quarantine, ...]:
    """One Quarantine per record; a record entering a quarantine phase again after Released is a new one."""
    open_: dict[str, list[Entry]] = {}
    done: list[list[Entry]] = []
    for entry in entries:
        if entry.kind is not Kind.PHASE:
            continue
        key = entry.detail.get("record") or entry.device
        phases = open_.get(key)
        if phases is not None and phases[-1].what in ENDED_PHASES and entry.what in QUARANTINE_PHASES:
            done.append(open_.pop(key))
            phases = None
        if phases is None:
            open_[key] = [entry]
        else:
            phases.append(entry)
    done.extend(open_.values())
    result = []
    for phases in sorted(done, key=lambda p: p[0].at):
        first, last = phases[0], phases[-1]
        device = first.device
        node = first.node or (journal.devices[device].node if device in journal.devices else "")
        warranted = any(
            f.at <= first.at and _warranting(f) and (f.device == device if f.device else f.node == node)
            for f in faults
        )
        end = math.inf if last.what not in ENDED_PHASES else last.at
        checks = tuple(
            (e.what, e.detail.get("result", "?"), e.at)
            for e in entries
            if e.kind is Kind.CHECK and e.device == device and first.at <= e.at <= end
        )
        reason = next((p.detail["reason"] for p in phases if p.detail.get("reason")), "")
        stops = [*(p.at for p in phases[1:]), max(journal.ended_at, last.at)]
        lost = sum(
            max(0.0, stop - p.at) for p, stop in zip(phases, stops, strict=True) if p.what in EXCLUDING_PHASES
        )
        result.append(
            Quarantine(
                record=first.detail.get("record", ""),
                device=device,
                label=journal.label(device) if device else first.node,
                reason=reason,
                started_at=first.at,
                phases=tuple((p.what, p.at) for p in phases),
                warranted=warranted,
                checks=checks,
                verdict=last.detail.get("verdict", "") if last.what in ENDED_PHASES else "",
                lost_seconds=lost,
            )
        )
    return tuple(result)


def _migrations(journal: Journal, entries: Sequence[Entry]) -> tuple[Migration, ...]:
    evicted: dict[str, int] = {}
    first_eviction: dict[str, float] = {}
    result = []
    for entry in entries:
        if entry.kind is Kind.EVICTION:
            job = entry.detail.get("job", "")
            evicted[job] = evicted.get(job, 0) + 1
            first_eviction.setdefault(job, entry.at)
        elif entry.kind is Kind.MIGRATION:
            job = entry.detail.get("job", "")
            count = entry.detail.get("evictions", "")
            placed = tuple(
                journal.label(device)
                for e in entries
                if e.kind is Kind.NOTE
                and e.what == "placed"
                and e.detail.get("job") == job
                and e.at >= first_eviction.get(job, math.inf)
                for device in (e.detail.get("devices") or e.device).split(",")
                if device
            )
            result.append(
                Migration(
                    at=entry.at,
                    device=entry.device,
                    label=journal.label(entry.device) if entry.device else entry.node,
                    job=job,
                    outcome=entry.what,
                    reason=entry.detail.get("reason", ""),
                    evictions=int(count) if count.isdigit() else evicted.get(job, 0),
                    placed=tuple(dict.fromkeys(placed)),
                )
            )
    return tuple(result)


def _count(names: Iterable[str]) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return tuple(sorted(counts.items()))


def _pairs(detail: Mapping[str, str], *keys: str) -> str:
    return " ".join(f"{k}={detail[k]}" for k in keys if detail.get(k))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def percentile(values: Sequence[float], fraction: float) -> float:
    """The `fraction` quantile (0..1) of `values`, linearly interpolated; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def write_text(summary: Summary, verdict: object, out: TextIO) -> None:
    """The summary as plain text; `verdict` is `demo.safety.Verdict` (only `violations` is required)."""
    w = out.write
    w(
        f"\nsummary of {summary.scenario}: {len(summary.faults)} faults over {summary.ended_at:.0f} "
        f"simulated seconds at {summary.speed:g}x (times are scenario seconds)\n"
    )
    detections = summary.detections
    if detections:
        w(
            f"\ndetection latency (onset -> alert -> webhook -> enforced; stamps late by up to "
            f"{summary.resolution:.1f}s)\n"
        )
        rows = [
            [
                d.label,
                d.fault,
                d.alert,
                _seconds(d.detect),
                _seconds(d.deliver),
                _seconds(d.enforce),
                _seconds(d.total),
                f"{d.floor:.0f}",
                "-" if d.over_floor is None else f"{d.over_floor:+.1f}",
            ]
            for d in detections
        ]
        table = io.StringIO()
        write_table(
            ["DEVICE", "FAULT", "ALERT", "DETECT", "DELIVER", "ENFORCE", "TOTAL", "FLOOR", "OVER"],
            rows,
            table,
        )
        w("".join(f"  {line}\n" for line in table.getvalue().splitlines()))
    w("\nfaults and what was done\n")
    for story in summary.faults:
        line = f"  t+{story.at:.0f}s {story.fault} {story.target}" + (
            f" ({story.detail})" if story.detail else ""
        )
        w(line + "\n")
        if not story.done:
            w("      nothing done\n")
        for sentence in story.done:
            w(f"      {sentence}\n")
    true_q = [q for q in summary.quarantines if not q.false]
    w(f"\nquarantines: {len(true_q)} true, {len(summary.false_quarantines)} false\n")
    for q in summary.quarantines:
        walk = " -> ".join(f"{p} t+{at:.0f}s" for p, at in q.phases)
        tag = "FALSE" if q.false else "true"
        w(f"  [{tag}, verdict {q.verdict or '-'}] {q.label} ({q.reason or 'no reason'}): {walk}\n")
    if summary.quarantines:
        w(f"  {summary.agreement}\n")
        w(f"GPU-hours lost to quarantine: {summary.gpu_hours_lost:.2f} (simulated time)\n")
    if summary.migrations:
        w("\nmigrations\n")
        for m in summary.migrations:
            why = f": {m.reason}" if m.reason else ""
            again = f"; running again on {', '.join(m.placed)}" if m.placed else ""
            w(f"  t+{m.at:.0f}s {m.job or '?'} from {m.label}: {m.outcome}{why}")
            w(f" ({m.evictions} evicted{again})\n")
    releases = summary.releases
    if releases:
        w("\nreleases\n")
        for q in releases:
            steps = " -> ".join(f"{p} {_at(q.reached(p))}" for p in RELEASE_PHASES)
            w(f"  {q.label}: {steps}\n")
    w(f"\nbreaker: {'; '.join(_event(e) for e in summary.breaker) if summary.breaker else 'no change'}\n")
    kills = [e for e in summary.processes if e.what == "killed"]
    if kills:
        w(f"process kills: {'; '.join(_event(e) for e in kills)}\n")
    if summary.alerts_fired:
        w("alerts fired: " + ", ".join(f"{name} x{n}" for name, n in summary.alerts_fired) + "\n")
    w(f"evictions: {summary.evictions}; tenant Events: {summary.tenant_events}\n")
    w(f"exposure (pods started on a quarantined card): {len(summary.exposures)}\n")
    for x in summary.exposures:
        w(f"  t+{x.at:.0f}s {x.pod} on {x.label} (record {x.record})\n")
    violations = tuple(getattr(verdict, "violations", ()))
    if violations:
        w("\nSAFETY INVARIANT BROKEN:\n")
        for line in violations:
            w(f"  {line}\n")
    else:
        w("\nsafety: every invariant held (no unwarranted or doubled action, no unjustified node action)\n")
    out.flush()


def _event(event: Event) -> str:
    return f"t+{event.at:.0f}s {event.what}" + (f" ({event.detail})" if event.detail else "")


def _at(at: float | None) -> str:
    return "not reached" if at is None else f"t+{at:.0f}s"
