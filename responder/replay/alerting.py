"""Which of the shipped alerts a timeline raises, and when Alertmanager delivers them.

Pure. Prometheus and Alertmanager are not in the loop, so their part is modelled here from the
rules' own settings (`RuleTimings`, built by the caller from `rules/config.yaml`: this module
holds no threshold of its own):
- rules are evaluated every `evaluation_interval` (ticks from the timeline's start); a `for:`
  counts from the first tick that sees the condition;
- GPUDeviceFatalXid (an XID of the fatal list) and GPUDeviceEccUncorrectable fire at the first
  tick after the event and resolve once `event_window` has passed; the device plugin's Unhealthy
  report of a fatal XID also raises GPUDeviceUnhealthy after `unhealthy_for`, until the repair;
  GPUDeviceRowRemapFailure and GPUDeviceHealthWatchFailed (a watch of the configured list, after
  `health_failed_for`) fire until the repair;
- an Unknown episode raises GPUDeviceUnknownExpired once it outlasts its tolerance window (the
  rules' own `unknown_window`: stepped by its factor per earlier episode); `flapping_episodes`
  short episodes within `flapping_window`, none of them reaching the first window, raise
  GPUDeviceUnknownFlapping (approximated: it fires at the episode that completes the count, and
  resolves when the oldest of them leaves the window);
- GPUNodeUnreachable (a Lease older than `lease_age_limit` for `unreachable_for`) inhibits every
  device alert of its node while it fires, as the shipped Alertmanager configuration does;
- the responder receives a firing alert `group_wait` after it fires and a resolved one
  `group_interval` after it resolves.
Not modelled: GPUFleetUnknownStorm's inhibition of restrictions, the critical-over-warning
inhibition between two device alerts, GPUDeviceUnhealthyFlapping (the timeline has no Unhealthy
blips), re-deliveries (the intake makes them no-ops).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from responder.replay.timeline import Fault, Signal, Timeline
from responder.webhook.alerts import QUARANTINE, RESTRICT


@dataclass(frozen=True, slots=True)
class RuleTimings:
    """The shipped rules' and Alertmanager route's values the model needs (no defaults: they come
    from the rules configuration, `rules.render.Settings`)."""

    evaluation_interval: float
    heartbeat_limit: float
    unhealthy_for: float
    event_window: float
    unknown_window: Callable[[int], float] = field(compare=False)
    """Seconds of an Unknown episode's tolerance window, given its earlier episodes within
    `unknown_repeat_window` (the rules' own function)."""
    unknown_repeat_window: float
    flapping_episodes: int
    flapping_window: float
    fatal_xids: frozenset[int]
    health_watches: frozenset[str]
    health_failed_for: float
    lease_age_limit: float
    unreachable_for: float
    group_wait: float
    group_interval: float


@dataclass(frozen=True, slots=True)
class AlertEpisode:
    """One firing episode of one device alert, as the responder receives it."""

    name: str
    action: str
    node: str
    device: str
    fires: float
    """When the responder receives the firing notification."""
    resolves: float
    """When it receives the resolved one (may lie past the timeline's end)."""
    labels: tuple[tuple[str, str], ...] = ()
    """The alert's other labels as Prometheus fired it (`xid`, `severity`, ...), where they are
    known: a recorded history has them, the model of a timeline does not."""


def episodes(timeline: Timeline, rules: RuleTimings) -> list[AlertEpisode]:
    """Every device alert the timeline raises that reaches the responder, in delivery order."""
    tick = _ticks(timeline.start, rules.evaluation_interval)
    raw: list[tuple[str, str, str, str, float, float]] = []
    for fault in timeline.faults:
        raw.extend(_fault_alerts(fault, rules, tick))
    raw.extend(_unknown_alerts(timeline, rules, tick))
    muted = _node_alerts(timeline, rules, tick)
    out = []
    for name, action, node, device, fires, resolves in raw:
        delivered = unmuted(fires, resolves, muted.get(node, ()))
        if delivered is not None:
            out.append(
                AlertEpisode(
                    name, action, node, device, delivered + rules.group_wait, resolves + rules.group_interval
                )
            )
    out.sort(key=lambda e: (e.fires, e.node, e.device, e.name))
    return out


def _ticks(start: float, interval: float) -> Callable[[float], float]:
    def tick(t: float) -> float:
        """The first rule evaluation at or after `t`."""
        return start + math.ceil((t - start) / interval - 1e-9) * interval

    return tick


def _fault_alerts(
    fault: Fault, rules: RuleTimings, tick: Callable[[float], float]
) -> Iterable[tuple[str, str, str, str, float, float]]:
    seen, until = tick(fault.at), tick(fault.until)
    where = (fault.node, fault.device)
    if fault.signal == Signal.FATAL_XID:
        if fault.detail.isdigit() and int(fault.detail) in rules.fatal_xids:
            yield (
                "GPUDeviceFatalXid",
                QUARANTINE,
                *where,
                seen,
                max(seen, tick(fault.at + rules.event_window)),
            )
        if seen + rules.unhealthy_for < until:
            yield ("GPUDeviceUnhealthy", QUARANTINE, *where, seen + rules.unhealthy_for, until)
    elif fault.signal == Signal.ECC_UNCORRECTABLE:
        yield (
            "GPUDeviceEccUncorrectable",
            QUARANTINE,
            *where,
            seen,
            max(seen, tick(fault.at + rules.event_window)),
        )
    elif fault.signal == Signal.ROW_REMAP_FAILURE:
        yield ("GPUDeviceRowRemapFailure", QUARANTINE, *where, seen, until)
    elif (
        fault.signal == Signal.HEALTH_WATCH
        and fault.detail in rules.health_watches
        and seen + rules.health_failed_for < until
    ):
        yield ("GPUDeviceHealthWatchFailed", QUARANTINE, *where, seen + rules.health_failed_for, until)


def _unknown_alerts(
    timeline: Timeline, rules: RuleTimings, tick: Callable[[float], float]
) -> Iterable[tuple[str, str, str, str, float, float]]:
    per_device: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for spell in timeline.spells:
        for device in spell.devices:
            per_device[(spell.node, device)].append((spell.at, spell.at + spell.seconds))
    for lost in timeline.lost:
        if lost.seconds > rules.heartbeat_limit:
            for device in timeline.devices.get(lost.node, ()):
                per_device[(lost.node, device)].append(
                    (lost.at + rules.heartbeat_limit, lost.at + lost.seconds)
                )
    full = rules.unknown_window(0)
    for (node, device), spells in per_device.items():
        spells.sort()
        flapping: tuple[float, float] | None = None
        for i, (start, end) in enumerate(spells):
            earlier = sum(1 for s, _ in spells[:i] if start - s <= rules.unknown_repeat_window)
            window = rules.unknown_window(earlier)
            if end - start >= window and tick(start + window) < tick(end):
                yield ("GPUDeviceUnknownExpired", RESTRICT, node, device, tick(start + window), tick(end))
            recent = [(s, e) for s, e in spells[: i + 1] if start - s < rules.flapping_window]
            if len(recent) >= rules.flapping_episodes and all(e - s < full for s, e in recent):
                fires = tick(start)
                resolves = tick(recent[-rules.flapping_episodes][0] + rules.flapping_window)
                if flapping is not None and fires <= flapping[1]:
                    flapping = (flapping[0], max(flapping[1], resolves))
                else:
                    if flapping is not None:
                        yield ("GPUDeviceUnknownFlapping", RESTRICT, node, device, *flapping)
                    flapping = (fires, resolves)
        if flapping is not None:
            yield ("GPUDeviceUnknownFlapping", RESTRICT, node, device, *flapping)


def _node_alerts(
    timeline: Timeline, rules: RuleTimings, tick: Callable[[float], float]
) -> dict[str, list[tuple[float, float]]]:
    """GPUNodeUnreachable's firing intervals per node: what inhibits the node's device alerts."""
    muted: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for lost in timeline.lost:
        fires = tick(lost.at + rules.lease_age_limit) + rules.unreachable_for
        resolves = tick(lost.at + lost.seconds)
        if fires < resolves:
            muted[lost.node].append((fires, resolves))
    return muted


def unmuted(fires: float, resolves: float, muted: Iterable[tuple[float, float]]) -> float | None:
    """The first moment in [fires, resolves) outside every inhibiting interval (None: none)."""
    at = fires
    moved = True
    while moved and at < resolves:
        moved = False
        for start, end in muted:
            if start <= at < end:
                at, moved = end, True
    return at if at < resolves else None
