"""Safety invariants of a run: every automated action must be warranted by a fault.

Pure functions over plain data. An action is a firing alert Alertmanager delivered to the
responder webhook with an `action` label other than none (quarantine, restrict, or anything
else an alert might ask for). A fault warrants `quarantine` on a device when it
is a confirmed failure (Unhealthy, also in flaps; a fatal XID, GPU lost, uncorrectable ECC,
a row-remap failure) and `restrict` when the device stayed Unknown for the whole tolerance
window, and only from the fault on (restrict: from the spell's start plus the window): the
run notes when it saw each delivery, which is never before it arrived. Anything else is a
violation: the mistakes an automated responder must never make (acting on a short
Unknown, on an application XID, on every device of a node that is merely unreachable) all
show up here as actions without a warrant.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from simulator.scenario import Fault, Scenario

QUARANTINE_FAULTS = frozenset({"device-unhealthy", "gpu-lost", "row-remap-failure"})


@dataclass(frozen=True, slots=True)
class Action:
    """One firing notification delivered to the responder."""

    alertname: str
    action: str
    node: str
    device: str
    seen_at: float | None = None
    """Scenario seconds by which it had arrived (None: unknown, not checked against time)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    violations: tuple[str, ...]
    """Actions nothing warranted: a broken safety invariant."""
    acted: tuple[tuple[str, str, str], ...]
    """(node/gpu, action, alertname) of every warranted action."""
    missed: tuple[tuple[str, str], ...]
    """(node/gpu, action) warranted but not seen (the run may have ended first); flaps and
    Unhealthy reports that clear before the alert's `for:` are not expected to cause one."""


NO_ACTION = frozenset({"", "none"})
"""`action` label values that ask the responder for nothing."""


def requested_actions(body: Any, seen_at: float | None = None) -> list[Action]:
    """The actions one Alertmanager webhook body to the responder asks for.

    Every firing alert whose `action` is anything but none counts, not only the actions the
    responder knows: an alert that asks for something else (a pod deletion, a node drain)
    is then judged, and found unwarranted, instead of passing unseen.
    """
    alerts = body.get("alerts") if isinstance(body, dict) else None
    actions = []
    for alert in alerts if isinstance(alerts, list) else ():
        labels = alert.get("labels") if isinstance(alert, dict) else None
        if not isinstance(labels, dict) or alert.get("status") != "firing":
            continue
        action = str(labels.get("action") or "")
        if action not in NO_ACTION:
            actions.append(
                Action(
                    str(labels.get("alertname", "")),
                    action,
                    str(labels.get("node", "")),
                    str(labels.get("device", "")),
                    seen_at,
                )
            )
    return actions


def warrants(
    scenario: Scenario, *, fatal_xids: Iterable[int], tolerance: float
) -> dict[tuple[str, int], set[str]]:
    """Actions each (node, gpu index) may receive, from the scenario's faults."""
    return _by_place(warranted_from(scenario, fatal_xids=fatal_xids, tolerance=tolerance))


def _by_place(since: Mapping[tuple[tuple[str, int], str], float]) -> dict[tuple[str, int], set[str]]:
    allowed: dict[tuple[str, int], set[str]] = {}
    for place, action in since:
        allowed.setdefault(place, set()).add(action)
    return allowed


def warranted_from(
    scenario: Scenario, *, fatal_xids: Iterable[int], tolerance: float
) -> dict[tuple[tuple[str, int], str], float]:
    """The scenario time from which each ((node, gpu), action) is warranted.

    A confirmed failure warrants quarantine from its fault on; a long Unknown warrants
    restrict once the tolerance window has run from the start of its spell.
    """
    fatal = frozenset(fatal_xids)
    since: dict[tuple[tuple[str, int], str], float] = {}
    spells = _unknown_spells(scenario)
    for fault in scenario.timeline:
        for node, gpu in _devices_of(scenario, fault):
            action = _warranted_action(scenario, fault, fatal, tolerance, spells)
            if action == "restrict":
                key: SpellKey = (node, gpu) if fault.device is not None else (node, None)
                starts = [start for start, length in spells.get(key, ()) if length >= tolerance]
                at = min(starts) + tolerance
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
        elif fault.node is not None and fault.kind in ("health-stream-broken", "recover"):
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
    tolerance: float,
    spells: dict[SpellKey, list[tuple[float, float]]],
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
        return any(length >= tolerance for _, length in spells.get(key, ()))

    if kind == "device-unknown" and fault.device is not None:
        return "restrict" if long_enough((fault.device.node, fault.device.gpu)) else None
    if kind == "health-stream-broken" and fault.node is not None:
        # The device-plugin path reports a broken stream as Unhealthy, DRA as Unknown.
        if scenario.nodes[fault.node].path == "device-plugin":
            return "quarantine"
        return "restrict" if long_enough((fault.node, None)) else None
    # kubelet-stop, node-partition, recover: never a reason to act on a device.
    return None


def judge(
    scenario: Scenario,
    actions: Iterable[Action],
    uuid_of: Mapping[tuple[str, int], str],
    *,
    fatal_xids: Iterable[int],
    tolerance: float,
    unhealthy_for: float = 0.0,
) -> Verdict:
    """Compare delivered actions with what the faults warrant.

    `unhealthy_for` (simulated seconds, the Unhealthy alert's `for:`) only shapes `missed`:
    an Unhealthy that clears sooner may rightly cause no action.
    """
    since = warranted_from(scenario, fatal_xids=fatal_xids, tolerance=tolerance)
    allowed = _by_place(since)
    where = {(node, uuid): (node, gpu) for (node, gpu), uuid in uuid_of.items()}
    violations: list[str] = []
    acted: set[tuple[str, str, str]] = set()
    seen: set[tuple[tuple[str, int], str]] = set()
    for act in actions:
        place = where.get((act.node, act.device))
        label = f"{act.node}/gpu-{place[1]}" if place else f"{act.node}/{act.device}"
        if place is None or act.action not in allowed.get(place, set()):
            reason = "no fault on it" if place is None or place not in allowed else "its faults warrant "
            if place is not None and place in allowed:
                reason += " or ".join(sorted(allowed[place]))
            violations.append(f"{act.alertname} asked to {act.action} {label} ({act.device}), but {reason}")
            continue
        warranted_at = since[(place, act.action)]
        if act.seen_at is not None and act.seen_at < warranted_at:
            # seen_at is when the run noticed the delivery, so it came at the latest then.
            violations.append(
                f"{act.alertname} asked to {act.action} {label} ({act.device}) by t+{act.seen_at:.0f}s, "
                f"before anything warranted it (from t+{warranted_at:.0f}s)"
            )
            continue
        acted.add((label, act.action, act.alertname))
        seen.add((place, act.action))
    transient = {
        (f.device.node, f.device.gpu)
        for f in scenario.timeline
        if f.device is not None
        and (
            f.kind == "flap"
            or (f.kind == "device-unhealthy" and f.duration is not None and f.duration < unhealthy_for)
        )
    }
    missed = sorted(
        (f"{node}/gpu-{gpu}", action)
        for (node, gpu), actions_allowed in allowed.items()
        for action in actions_allowed
        if ((node, gpu), action) not in seen and (node, gpu) not in transient
    )
    return Verdict(tuple(violations), tuple(sorted(acted)), tuple(missed))
