"""What a device reads at a moment of the timeline: its health as the reconciler sees it, and
whether the card is broken (what a check finds).

Pure. The health is the effective one the shipped recording rules give the reconciler: Unhealthy
while the device plugin reports a confirmed failure (a fatal XID; a confirmed Unhealthy stays
Unhealthy when its report goes stale), Unknown during an Unknown spell or once a lost node's
reports are older than the heartbeat limit, Healthy otherwise. A card broken in a way the device
plugin does not report (ECC, row remapping, a health watch, silent corruption) reads Healthy: only
its alert, or a check, says otherwise.
"""

from __future__ import annotations

import math
from collections import defaultdict

from responder.reconcile.policy import Health
from responder.replay.timeline import Signal, Timeline

_UNHEALTHY, _UNKNOWN = 0, 1

Interval = tuple[float, float, int]
"""(start, end, what): `_UNHEALTHY` or `_UNKNOWN` for the whole interval."""


class Readings:
    """Index of the timeline by node and device (built once; every query is a short scan)."""

    def __init__(self, timeline: Timeline, *, heartbeat_limit: float) -> None:
        self._device: dict[tuple[str, str], list[Interval]] = defaultdict(list)
        self._node: dict[str, list[tuple[float, float, frozenset[str] | None]]] = defaultdict(list)
        self._broken: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        for fault in timeline.faults:
            key = (fault.node, fault.device)
            self._broken[key].append((fault.at, fault.until))
            if fault.signal == Signal.FATAL_XID:
                self._device[key].append((fault.at, fault.until, _UNHEALTHY))
        for spell in timeline.spells:
            self._node[spell.node].append((spell.at, spell.at + spell.seconds, frozenset(spell.devices)))
        for lost in timeline.lost:
            if lost.seconds > heartbeat_limit:
                self._node[lost.node].append((lost.at + heartbeat_limit, lost.at + lost.seconds, None))

    def _intervals(self, node: str, device: str) -> list[Interval]:
        own = list(self._device.get((node, device), ()))
        for start, end, devices in self._node.get(node, ()):
            if devices is None or device in devices:
                own.append((start, end, _UNKNOWN))
        return own

    def health(self, node: str, device: str, now: float) -> tuple[Health, float | None]:
        """(the device's effective health at `now`, since when it has been Healthy without a break;
        None while it is not Healthy, or when it never was otherwise)."""
        worst: Health | None = None
        since: float | None = None
        for start, end, what in self._intervals(node, device):
            if start <= now < end:
                if what == _UNHEALTHY:
                    worst = Health.UNHEALTHY
                elif worst is None:
                    worst = Health.UNKNOWN
            elif end <= now:
                since = end if since is None else max(since, end)
        if worst is not None:
            return worst, None
        return Health.HEALTHY, since

    def next_change(self, node: str, device: str, now: float) -> float | None:
        """The first moment after `now` at which the device's health may read otherwise."""
        soonest = math.inf
        for start, end, _ in self._intervals(node, device):
            for edge in (start, end):
                if now < edge < soonest:
                    soonest = edge
        return None if soonest == math.inf else soonest

    def broken(self, node: str, device: str, start: float, end: float) -> bool:
        """Whether the card is broken at any moment of [start, end]."""
        return any(a <= end and start < b for a, b in self._broken.get((node, device), ()))
