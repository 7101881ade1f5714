"""A recorded demo run as the replay engine's input, and where the replay's records differ from
the run's.

Pure: reads a `Journal` and the records the run left (`records.json`, the objects as the API
served them); returns data. The replay (`responder.replay.engine.replay_recorded`) is given what
the run recorded, not what the alerting model would derive:
- the notifications Alertmanager delivered to the responders (`delivery` entries to `responder`,
  HA duplicates and re-deliveries included: the intake sorts them), each alert's firing episode
  told apart as Alertmanager tells it (its fingerprint, and a firing after its resolved begins a
  new one);
- the verdicts the probes and canaries reached (`check` entries), each as long after its rung
  began as in the run (the replay's reconciler starts a check sooner than the run's, which
  passes every few seconds: the check's own time is what the policy's timeouts judge);
- the devices' health from the faults the simulator applied (`fault` entries): a device-unhealthy
  fault, a lost GPU, or an XID outside the application list (the simulator's `APPLICATION_XIDS`),
  makes the card read Unhealthy until the fault's duration ends or a `recover`; a device-unknown
  fault is an Unknown spell of its duration (from the fault, not from when the kubelet's timeout
  shows it); an ECC error and a row-remap failure change no health reading (only their alerts and
  the checks, both recorded, see them);
- the pods that held each recorded device (`pod` entries: running, then stopped, on every card
  they list), gpuhealth's own check and holder pods aside, as the product's reconciler counts
  them: a release attempt waits for the device to be free (a restrict moves no work, so its pods
  stay);
- the move time: the longest the run took from a record's entry into Quarantined to its move's
  outcome in that episode.

Times: the journal's entries are read in time order (`sorted_entries`). The responders ran with
the configuration scaled to the run's speed, on wall seconds; the journal's times are scenario
seconds. The replay runs on the responders' clock (scenario seconds / speed) with the
configuration they ran with, so every duration is theirs.

A journal with what this adapter does not model (another fault kind, a node fault, a reset, a
person's release request, a health-source outage) is refused with a ValueError naming the entry:
the replay would differ from the run for a reason that is not a decision.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from demo.journal import Entry, Journal, Kind, sorted_entries
from responder.reconcile.policy import CheckResult
from responder.replay.engine import CheckKey, Delivery, Holding
from responder.replay.outcomes import DeviceKey, Replay
from responder.replay.timeline import CheckTruth, Fault, Signal, Timeline, UnknownSpell
from responder.webhook.alerts import FIRING, RESOLVED
from simulator.model import APPLICATION_XIDS

RESPONDER = "responder"
"""The receiver the responders' webhook is (`demo.journal.Kind.DELIVERY`'s `what`)."""
UNHEALTHY_FAULTS = frozenset({"device-unhealthy", "xid", "gpu-lost"})
UNSEEN_FAULTS = frozenset({"ecc", "row-remap-failure"})
"""Faults that change no health reading: an alert sees them, and a check (both recorded)."""
UNMODELLED = frozenset({Kind.RESET, Kind.REQUEST, Kind.HEALTH_SOURCE})
"""Entries of what no recorded input here stands for: a reset's outcome, a person's request, the
responders' health source cut."""
Span = tuple[str, str, float, float]
VERDICTS = {"passed": CheckResult.SUCCEEDED, "failed": CheckResult.FAILED}


@dataclass(frozen=True, slots=True)
class Recorded:
    """What `responder.replay.engine.replay_recorded` takes, from one run."""

    timeline: Timeline
    deliveries: tuple[Delivery, ...]
    verdicts: Mapping[CheckKey, tuple[float, CheckResult]]
    holders: Mapping[DeviceKey, tuple[Holding, ...]]


def recorded(journal: Journal) -> Recorded:
    """The replay's inputs from a run's journal (ValueError for an entry it does not model)."""
    speed = journal.speed
    for entry in journal.entries:
        if entry.kind in UNMODELLED:
            raise ValueError(
                f"{entry.at:g}s: a {entry.kind} entry ({entry.what}) is not modelled by the replay"
            )
    faults, spells = _faults(sorted_entries(journal.of(Kind.FAULT)), journal.ended_at)
    nodes: dict[str, list[str]] = defaultdict(list)
    for device in journal.devices.values():
        nodes[device.node].append(device.uuid)
    timeline = Timeline(
        start=0.0,
        end=journal.ended_at / speed,
        eligible=len(journal.devices),
        # A recorded run's checks end as `verdicts` says; the truth's durations are never read.
        checks=CheckTruth(probe_seconds=math.inf, canary_seconds=math.inf),
        # The only part of a fault the recorded replay reads is its Unhealthy reading (its alerts
        # are the recorded deliveries): the signal that reads Unhealthy is the device plugin's.
        faults=tuple(
            Fault(at / speed, node, device, Signal.FATAL_XID, until / speed)
            for node, device, at, until in faults
        ),
        spells=tuple(
            UnknownSpell(at / speed, node, (device,), seconds / speed) for node, device, at, seconds in spells
        ),
        move_seconds=_move_seconds(journal) / speed,
        devices={node: tuple(uuids) for node, uuids in nodes.items()},
    )
    return Recorded(
        timeline, _deliveries(journal, speed), _verdicts(journal, speed), _holders(journal, speed)
    )


def _faults(entries: Iterable[Entry], end: float) -> tuple[list[Span], list[Span]]:
    """(node, device, from, until) of each Unhealthy reading the faults make, and (node, device,
    from, seconds) of each Unknown spell, in scenario seconds."""
    out: list[Span] = []
    spells: list[Span] = []
    open_: dict[DeviceKey, float] = {}
    for entry in entries:
        key = (entry.node, entry.device)
        if not entry.device:
            raise ValueError(
                f"{entry.at:g}s: node fault {entry.what} on {entry.node} is not modelled by the replay"
            )
        if entry.what == "recover":
            # The card works again: every Unhealthy reading of it ends here, bounded or not.
            out = [
                (n, d, a, min(u, entry.at)) if (n, d) == key and a < entry.at else (n, d, a, u)
                for n, d, a, u in out
            ]
            if key in open_:
                out.append((*key, open_.pop(key), entry.at))
        elif entry.what == "device-unknown":
            spells.append((*key, entry.at, float(entry.detail.get("duration", "0"))))
        elif entry.what in UNHEALTHY_FAULTS:
            if entry.what == "xid" and int(entry.detail["xid"]) in APPLICATION_XIDS:
                continue  # an application's error: the card's health does not change
            duration = entry.detail.get("duration")
            if duration is not None:
                out.append((*key, entry.at, entry.at + float(duration)))
            elif key not in open_:
                open_[key] = entry.at
        elif entry.what not in UNSEEN_FAULTS:
            raise ValueError(f"{entry.at:g}s: fault {entry.what} is not modelled by the replay")
    out.extend((*key, since, end) for key, since in open_.items() if since < end)
    return out, spells


def _deliveries(journal: Journal, speed: float) -> tuple[Delivery, ...]:
    out = []
    began: dict[str, float] = {}
    """A fingerprint's firing episode: when its first firing was delivered."""
    ended: set[str] = set()
    for entry in sorted_entries(journal.of(Kind.DELIVERY)):
        if entry.what != RESPONDER:
            continue
        fingerprint, status = entry.detail["fingerprint"], entry.detail["status"]
        if status == FIRING and (fingerprint not in began or fingerprint in ended):
            began[fingerprint] = entry.at
            ended.discard(fingerprint)
        elif status == RESOLVED:
            ended.add(fingerprint)
        labels = {
            "alertname": entry.detail["alertname"],
            "action": entry.detail["action"],
            "node": entry.node,
            "device": entry.device,
        }
        starts = began.get(fingerprint, entry.at)
        out.append(Delivery(entry.at / speed, status, labels, starts / speed, fingerprint))
    return tuple(out)


def _verdicts(journal: Journal, speed: float) -> dict[CheckKey, tuple[float, CheckResult]]:
    """Each check's verdict and how long it ran: from its record's entry into the check's rung (the
    record's last phase entry before the verdict) to the verdict, as the run saw them."""
    out: dict[CheckKey, tuple[float, CheckResult]] = {}
    entered: dict[str, Entry] = {}
    for entry in sorted_entries(journal.of(Kind.PHASE, Kind.CHECK)):
        record = entry.detail["record"]
        if entry.kind == Kind.PHASE:
            entered[record] = entry
            continue
        rung = entered[record]
        key = ((rung.node, rung.device), entry.what, int(entry.detail["attempt"]))
        out.setdefault(key, ((entry.at - rung.at) / speed, VERDICTS[entry.detail["result"]]))
    return out


def _holders(journal: Journal, speed: float) -> dict[DeviceKey, tuple[Holding, ...]]:
    out: dict[DeviceKey, list[Holding]] = defaultdict(list)
    since: dict[tuple[str, DeviceKey], float] = {}
    """(pod, device) -> when it was seen running there."""
    for entry in sorted_entries(journal.of(Kind.POD)):
        if "check" in entry.detail or entry.detail.get("holder"):
            continue  # gpuhealth's own: the reconciler does not wait for them
        pod = entry.detail["pod"]
        for device in entry.detail["devices"].split(","):
            held = (pod, (entry.node, device))
            if entry.what == "running":
                since.setdefault(held, entry.at)
            elif held in since:
                out[held[1]].append((since.pop(held) / speed, entry.at / speed, pod))
    for (pod, key), start in since.items():
        out[key].append((start / speed, math.inf, pod))
    return {key: tuple(held) for key, held in out.items()}


def _move_seconds(journal: Journal) -> float:
    entered: dict[tuple[str, str], float] = {}
    longest = 0.0
    for entry in sorted_entries(journal.of(Kind.PHASE, Kind.MIGRATION)):
        episode = (entry.detail.get("record", ""), entry.detail.get("episode", ""))
        if entry.kind == Kind.PHASE and entry.what == "Quarantined":
            entered.setdefault(episode, entry.at)
        elif entry.kind == Kind.MIGRATION and episode in entered:
            longest = max(longest, entry.at - entered[episode])
    return longest


# ----- the comparison ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reached:
    """What one device's record reached: the parts a replay must reproduce."""

    action: str
    reason: str
    phases: tuple[str, ...]
    """The phases it went through, in order (a phase kept across several writes counted once)."""
    final: str
    episode: int
    attempt: int
    failures: int


def run_reached(journal: Journal, records: Sequence[Mapping[str, Any]]) -> dict[DeviceKey, Reached]:
    """Per device, what the run's record reached: its phases from the journal's `phase` entries, the
    rest from the record as the run left it."""
    phases: dict[DeviceKey, list[str]] = defaultdict(list)
    for entry in sorted_entries(journal.of(Kind.PHASE)):
        phases[(entry.node, entry.device)].append(entry.what)
    out = {}
    for obj in records:
        spec, status = obj["spec"], obj["status"]
        key = (str(spec["node"]), str(spec["device"]))
        out[key] = Reached(
            action=str(spec["action"]),
            reason=str(spec["reason"]),
            phases=_once(phases.get(key, ())),
            final=str(status["phase"]),
            episode=int(status.get("episode", 0)),
            attempt=int(status.get("attempt", 0)),
            failures=int(status.get("failures", 0)),
        )
    return out


def replay_reached(replay: Replay) -> dict[DeviceKey, Reached]:
    """Per device, what the replay's record reached (its phases from the record's history)."""
    return {
        key: Reached(
            action=r.spec.action,
            reason=r.spec.reason,
            phases=_once(str(h.phase) for h in r.status.history),
            final=str(r.status.phase),
            episode=r.status.episode,
            attempt=r.status.attempt,
            failures=r.status.failures,
        )
        for key, r in replay.records.items()
    }


def differences(run: Mapping[DeviceKey, Reached], replayed: Mapping[DeviceKey, Reached]) -> list[str]:
    """One line per device and field where the replay reached otherwise than the run."""
    out = []
    for key in sorted(run.keys() | replayed.keys()):
        where = f"{key[0]}/{key[1]}"
        ran, played = run.get(key), replayed.get(key)
        if ran is None or played is None:
            out.append(f"{where}: a record in the {'replay' if ran is None else 'run'} only")
            continue
        for name in (f.name for f in fields(Reached)):
            a, b = getattr(ran, name), getattr(played, name)
            if a != b:
                out.append(f"{where}: {name}: run {a!r}, replay {b!r}")
    return out


def _once(phases: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for phase in phases:
        if not out or out[-1] != phase:
            out.append(phase)
    return tuple(out)
