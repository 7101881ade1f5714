"""What a replay did: the holds it enforced, the moves it started, its actions and breaker trips.

Pure. `Ledger` is written by the engine as it applies each step's effects; `Replay` is what it
hands back, with the measures that need only itself (and the timeline's broken intervals for
the healthy time withheld).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from responder.records import Phase, Quarantine

DeviceKey = tuple[str, str]
"""(node, device)."""


@dataclass(frozen=True, slots=True)
class Hold:
    """A device kept from new work by gpuhealth's enforcement (the quarantine taint, then the
    ramp's), from `start` until `end` (the timeline's end if it was still held then)."""

    node: str
    device: str
    action: str
    """`quarantine` or `restrict`, as the record stood when the hold began."""
    reason: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Move:
    """The work on a quarantined device moved off it (one per quarantine episode)."""

    at: float
    node: str
    device: str
    reason: str


@dataclass(frozen=True, slots=True)
class Replay:
    start: float
    end: float
    records: Mapping[DeviceKey, Quarantine]
    holds: tuple[Hold, ...]
    moves: tuple[Move, ...]
    actions: Mapping[str, int]
    """Cluster writes by kind: the effects applied (`Enforce`, `Unenforce`, `StartCheck`, ...)
    and `Move` (one move of a job's work)."""
    breaker_trips: int
    held_at_end: frozenset[DeviceKey] = frozenset()
    occupied: Mapping[DeviceKey, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    """Per device that gpuhealth held, the [from, until) spans a workload's pod held it (the
    replay's `holders`, as the product's effects left them): a held device still ran that work."""

    @property
    def hours(self) -> float:
        return (self.end - self.start) / 3600.0

    def actions_per_hour(self) -> float:
        return sum(self.actions.values()) / self.hours

    def phases(self) -> Counter[str]:
        """How many records end in each phase."""
        return Counter(str(r.status.phase) for r in self.records.values())

    def withheld_healthy_seconds(
        self, broken: Mapping[DeviceKey, Iterable[tuple[float, float]]], action: str | None = None
    ) -> float:
        """Device-seconds held while the card worked and no pod of the workload ran on it: each
        hold (of `action`, or all) less its overlap with the card's broken intervals and with
        the spans a pod held it (a restricted device keeps its tenant's pod: that work goes on)."""
        total = 0.0
        for hold in self.holds:
            if action is not None and hold.action != action:
                continue
            key = (hold.node, hold.device)
            spans = sorted([*broken.get(key, ()), *self.occupied.get(key, ())])
            total += (hold.end - hold.start) - _overlap(hold.start, hold.end, spans)
        return total

    def in_use_seconds(
        self, broken: Mapping[DeviceKey, Iterable[tuple[float, float]]], action: str | None = None
    ) -> float:
        """Device-seconds held while the card worked and a pod of the workload still ran on it
        (a release attempt waiting with DeviceInUse): kept from new work, not idle."""
        total = 0.0
        for hold in self.holds:
            if action is not None and hold.action != action:
                continue
            key = (hold.node, hold.device)
            healthy = sorted(broken.get(key, ()))
            for a, b in self.occupied.get(key, ()):
                a, b = max(a, hold.start), min(b, hold.end)
                if b > a:
                    total += (b - a) - _overlap(a, b, healthy)
        return total

    def false_holds(self, broken: Mapping[DeviceKey, Iterable[tuple[float, float]]]) -> list[Hold]:
        """Holds of a card that was not broken when the hold began."""
        return [
            h for h in self.holds if not any(a <= h.start < b for a, b in broken.get((h.node, h.device), ()))
        ]


def _overlap(start: float, end: float, spans: Iterable[tuple[float, float]]) -> float:
    covered, cursor = 0.0, start
    for a, b in spans:
        a, b = max(a, cursor), min(b, end)
        if b > a:
            covered += b - a
            cursor = b
    return covered


@dataclass
class Ledger:
    """The engine's running account (mutable while the replay runs, then frozen into `Replay`)."""

    start: float
    open_holds: dict[DeviceKey, tuple[str, str, float]] = field(default_factory=dict)
    holds: list[Hold] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    actions: Counter[str] = field(default_factory=Counter)
    breaker_trips: int = 0

    def held(self, key: DeviceKey, action: str, reason: str, now: float) -> None:
        if key not in self.open_holds:
            self.open_holds[key] = (action, reason, now)

    def freed(self, key: DeviceKey, now: float) -> None:
        opened = self.open_holds.pop(key, None)
        if opened is not None:
            action, reason, since = opened
            self.holds.append(Hold(key[0], key[1], action, reason, since, now))

    def moved(self, key: DeviceKey, reason: str, now: float) -> None:
        self.moves.append(Move(now, key[0], key[1], reason))
        self.actions["Move"] += 1

    def closed(
        self,
        end: float,
        records: Mapping[DeviceKey, Quarantine],
        occupied: Mapping[DeviceKey, tuple[tuple[float, float], ...]] | None = None,
    ) -> Replay:
        still = frozenset(self.open_holds)
        for key in sorted(still):
            self.freed(key, end)
        return Replay(
            start=self.start,
            end=end,
            records=dict(records),
            holds=tuple(sorted(self.holds, key=lambda h: (h.start, h.node, h.device))),
            moves=tuple(self.moves),
            actions=dict(self.actions),
            breaker_trips=self.breaker_trips,
            held_at_end=still,
            occupied=dict(occupied or {}),
        )


def released(record: Quarantine) -> bool:
    return record.status.phase == Phase.RELEASED
