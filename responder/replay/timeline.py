"""What happened to the hardware: a timeline of faults, Unknown spells and lost nodes.

Pure data. A timeline names no alert and no decision: it says when a card was broken and how
it showed (`Signal`), when devices reported Unknown, when a node's Lease stopped, and how a
card answers a check (`CheckTruth`). The alerting model turns it into deliveries; the engine
into records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Signal(StrEnum):
    """How a broken card shows to the pipeline (what the exporter or dcgm-exporter reads)."""

    FATAL_XID = "fatal-xid"
    """An XID event (`detail`: its number); the device plugin also reports the card Unhealthy."""
    ECC_UNCORRECTABLE = "ecc-uncorrectable"
    """The uncorrected volatile ECC count grows once; the device plugin reports nothing."""
    ROW_REMAP_FAILURE = "row-remap-failure"
    """NVML's remapped-rows failure flag, set until the card is repaired."""
    HEALTH_WATCH = "health-watch"
    """A DCGM health watch at FAIL (`detail`: the watch, e.g. MEM, THERMAL) until repaired."""
    NONE = "none"
    """Nothing at all (silent data corruption): the card is broken and no signal says so."""


@dataclass(frozen=True, slots=True)
class Fault:
    """A card broken from `at` until `until` (repaired or replaced)."""

    at: float
    node: str
    device: str
    signal: Signal
    until: float
    detail: str = ""
    """The XID number or the health watch's name, where the signal has one."""

    def __post_init__(self) -> None:
        if self.until <= self.at:
            raise ValueError(f"fault on {self.node}/{self.device}: until {self.until} is not after {self.at}")


@dataclass(frozen=True, slots=True)
class UnknownSpell:
    """`devices` of `node` reported Unknown for `seconds` (a kubelet or driver restart, a broken
    health stream): the node's Lease is unaffected."""

    at: float
    node: str
    devices: tuple[str, ...]
    seconds: float


@dataclass(frozen=True, slots=True)
class NodeLost:
    """The node's kubelet stopped renewing its Lease for `seconds` (a partition, a host down):
    its device reports go stale with it."""

    at: float
    node: str
    seconds: float


@dataclass(frozen=True, slots=True)
class CheckTruth:
    """How a card answers the release ladder's checks: a broken card fails, a working one passes,
    a flaky one (it was broken before and its repair did not hold) fails with `flaky_failure`."""

    probe_seconds: float
    """How long a probe runs before its verdict."""
    canary_seconds: float
    """How long a canary runs before its verdict."""
    flaky_failure: float = 0.0
    """Probability that a check of a flaky card fails although the card works at that moment."""
    flaky: frozenset[tuple[str, str]] = frozenset()
    """(node, device) of the flaky cards."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.flaky_failure <= 1.0:
            raise ValueError(f"flaky_failure must be a probability, not {self.flaky_failure!r}")
        if self.probe_seconds <= 0 or self.canary_seconds <= 0:
            raise ValueError("a check takes some time: probe_seconds and canary_seconds must be > 0")


@dataclass(frozen=True, slots=True)
class Frame:
    """What a replay needs besides its deliveries and device readings: the window, the fleet's
    size, how checks answer, how long a move takes, the seed of the flaky cards' verdicts."""

    start: float
    end: float
    eligible: int
    """GPUs in the fleet (what the breaker counts against)."""
    checks: CheckTruth
    move_seconds: float = 60.0
    """How long moving the work off a quarantined device takes (the checkpoint answered, the pods
    evicted): the move stays in the record, unfinished, that long."""
    seed: int = 0
    """Seeds the flaky cards' check verdicts: the same inputs and seed replay the same."""

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError("a replay's window ends after it starts")
        if self.eligible < 0:
            raise ValueError("eligible: a count of GPUs, not negative")
        if self.move_seconds < 0:
            raise ValueError("move_seconds: a duration, not negative")


@dataclass(frozen=True, slots=True)
class Timeline:
    start: float
    end: float
    eligible: int
    """GPUs in the fleet (what the breaker counts against)."""
    checks: CheckTruth
    faults: tuple[Fault, ...] = ()
    spells: tuple[UnknownSpell, ...] = ()
    lost: tuple[NodeLost, ...] = ()
    move_seconds: float = 60.0
    """How long moving the work off a quarantined device takes (`Frame.move_seconds`)."""
    seed: int = 0
    """Seeds the flaky cards' check verdicts: the same timeline and seed replay the same."""
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False, hash=False)
    """Optional: node -> its devices (what a lost node's stale reports cover)."""

    def __post_init__(self) -> None:
        self.frame  # noqa: B018 - builds the frame, which refuses a bad window, count or duration

    @property
    def frame(self) -> Frame:
        return Frame(self.start, self.end, self.eligible, self.checks, self.move_seconds, self.seed)
