"""What a device reads at a moment of the timeline: its health as the reconciler sees it, and
whether the card is broken (what a check finds).

Pure. The health is the effective one the shipped recording rules give the reconciler: Unhealthy
while the device plugin reports a confirmed failure (a fatal XID; a confirmed Unhealthy stays
Unhealthy when its report goes stale), Unknown during an Unknown spell or once a lost node's
reports are older than the heartbeat limit, Healthy otherwise. A card broken in a way the device
plugin does not report (ECC, row remapping, a health watch, silent corruption) reads Healthy: only
its alert, or a check, says otherwise. `Readings.of` builds that from a timeline; a replay of
recorded alerts (`history`) builds its own from the alerts' firing intervals.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

from responder.reconcile.policy import Health
from responder.replay.timeline import Signal, Timeline

UNHEALTHY, UNKNOWN = 0, 1

Interval = tuple[float, float, int]
"""(start, end, what): `UNHEALTHY` or `UNKNOWN` for the whole interval."""
DeviceKey = tuple[str, str]
NodeInterval = tuple[float, float, frozenset[str] | None]
"""(start, end, devices): the node's `devices` (None: all of them) read Unknown meanwhile."""


class Readings:
    """Index of what each device reads by node and device (built once; every query is a short
    scan): intervals of a device's own, intervals of its node's, and when its card was broken."""

    def __init__(
        self,
        device: Mapping[DeviceKey, list[Interval]],
        node: Mapping[str, list[NodeInterval]],
        broken: Mapping[DeviceKey, list[tuple[float, float]]],
    ) -> None:
        self._device, self._node, self._broken = device, node, broken

    @classmethod
    def of(cls, timeline: Timeline, *, heartbeat_limit: float) -> Readings:
        """What the devices of a timeline read (the effective health described above)."""
        device: dict[DeviceKey, list[Interval]] = defaultdict(list)
        node: dict[str, list[NodeInterval]] = defaultdict(list)
        broken: dict[DeviceKey, list[tuple[float, float]]] = defaultdict(list)
        for fault in timeline.faults:
            key = (fault.node, fault.device)
            broken[key].append((fault.at, fault.until))
            if fault.signal == Signal.FATAL_XID:
                device[key].append((fault.at, fault.until, UNHEALTHY))
        for spell in timeline.spells:
            node[spell.node].append((spell.at, spell.at + spell.seconds, frozenset(spell.devices)))
        for lost in timeline.lost:
            if lost.seconds > heartbeat_limit:
                node[lost.node].append((lost.at + heartbeat_limit, lost.at + lost.seconds, None))
        return cls(device, node, broken)

    def _intervals(self, node: str, device: str) -> list[Interval]:
        own = list(self._device.get((node, device), ()))
        for start, end, devices in self._node.get(node, ()):
            if devices is None or device in devices:
                own.append((start, end, UNKNOWN))
        return own

    def health(self, node: str, device: str, now: float) -> tuple[Health, float | None]:
        """(the device's effective health at `now`, since when it has been Healthy without a break;
        None while it is not Healthy, or when it never was otherwise)."""
        worst: Health | None = None
        since: float | None = None
        for start, end, what in self._intervals(node, device):
            if start <= now < end:
                if what == UNHEALTHY:
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
