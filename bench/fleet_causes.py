"""The published failure record the fleet benchmark is calibrated to, and the seeded trace drawn
from it.

The record: "The Llama 3 Herd of Models" (Llama Team, AI @ Meta, 2024), Table 5: the root causes
of the 466 job interruptions of one 54-day snapshot of Llama 3 405B pre-training on 16,384 H100
GPUs (2,048 nodes of 8): 47 planned (automated maintenance such as firmware upgrades) and 419
unexpected, by cause below. The counts are the paper's; what each cause shows to gpuhealth's
pipeline (`Sight`) is this benchmark's mapping, printed with the results.

The trace: every interruption of the table at a uniformly drawn moment of the 54 days on a
uniformly drawn node (and card, for a card's cause); what the table does not give (how long a
repair takes, transient Unknown spells, cards whose repair does not hold) comes from `Knobs`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

from responder.replay.timeline import CheckTruth, Fault, NodeLost, Signal, Timeline, UnknownSpell

DAYS = 54
NODES = 2048
GPUS_PER_NODE = 8
PLANNED = 47
"""Planned interruptions (automated maintenance): separate from the causes below."""


class Sight(StrEnum):
    """What gpuhealth's pipeline sees of a cause."""

    FATAL_XID = "fatal XID (device plugin reports Unhealthy)"
    ECC = "uncorrectable ECC count grows"
    HEALTH_WATCH = "DCGM health watch at FAIL"
    NODE_LEASE = "node Lease lost (host down)"
    APPLICATION_XID = "application XID (card healthy)"
    NOTHING = "nothing at all"


@dataclass(frozen=True, slots=True)
class Cause:
    name: str
    count: int
    sight: Sight
    detail: str = ""
    """The XID or health watch it raises, where it raises one."""
    card: bool = False
    """A GPU card is broken until repaired (else the host, the fabric or the software is)."""

    @property
    def signal(self) -> Signal:
        return {
            Sight.FATAL_XID: Signal.FATAL_XID,
            Sight.ECC: Signal.ECC_UNCORRECTABLE,
            Sight.HEALTH_WATCH: Signal.HEALTH_WATCH,
        }.get(self.sight, Signal.NONE)


CAUSES: tuple[Cause, ...] = (
    Cause("Faulty GPU", 148, Sight.FATAL_XID, "79", card=True),
    Cause("GPU HBM3 memory", 72, Sight.ECC, card=True),
    Cause("Software bug", 54, Sight.APPLICATION_XID, "13"),
    Cause("Network switch/cable", 35, Sight.NOTHING),
    Cause("Host maintenance", 32, Sight.NODE_LEASE),
    Cause("GPU SRAM memory", 19, Sight.FATAL_XID, "95", card=True),
    Cause("GPU system processor", 17, Sight.FATAL_XID, "119", card=True),
    Cause("NIC", 7, Sight.NOTHING),
    Cause("NCCL watchdog timeouts", 7, Sight.NOTHING),
    Cause("Silent data corruption", 6, Sight.NOTHING, card=True),
    Cause("GPU thermal interface + sensor", 6, Sight.HEALTH_WATCH, "THERMAL", card=True),
    Cause("SSD", 3, Sight.NODE_LEASE),
    Cause("Power supply", 3, Sight.NODE_LEASE),
    Cause("Server chassis", 2, Sight.NODE_LEASE),
    Cause("IO expansion board", 2, Sight.NODE_LEASE),
    Cause("Dependency", 2, Sight.NOTHING),
    Cause("CPU", 2, Sight.NODE_LEASE),
    Cause("System memory", 2, Sight.NODE_LEASE),
)
"""Table 5's unexpected interruptions (419 in all), each with what the pipeline sees of it."""


@dataclass(frozen=True, slots=True)
class Knobs:
    """What the table does not count: each an assumption, printed, swept over three values."""

    unknown_per_node_day: float = 0.2
    """Transient Unknown spells (a kubelet or driver restart, a broken health stream, a partition)
    per node and day: every GPU of the node reports Unknown at once."""
    unknown_mean_seconds: float = 90.0
    """Mean length of a spell (exponential): most end within the tolerance window."""
    partition_share: float = 0.25
    """Share of the spells that are partitions (the node's Lease stops too) rather than restrictions
    of the device reports alone."""
    relapse: float = 0.1
    """Share of repaired cards whose repair does not hold: they fail again within `relapse_days`
    and fail a check with `flaky_failure` meanwhile."""
    relapse_days: float = 7.0
    flaky_failure: float = 0.5
    repair_hours: float = 48.0
    """Mean time (exponential) from a failure to the card or host repaired or replaced."""
    probe_seconds: float = 120.0
    """A `dcgmi diag -r 2` takes about two minutes."""
    canary_seconds: float = 300.0
    move_seconds: float = 60.0
    """A move's checkpoint answered and its pods evicted within a minute (the job restarts from its
    last checkpoint)."""
    redeploy_days: float = 7.0
    """An inference service's pod is replaced (a new version rolled out) every this many days, each
    service at its own drawn phase; until then it holds its cards, a restricted one included (the
    trace does not depend on it: only the inference mix's placement does)."""
    seed: int = 25


@dataclass(frozen=True, slots=True)
class Incident:
    """One interruption of the table, placed in the trace."""

    cause: Cause
    at: float
    node: str
    device: str
    until: float
    relapse: bool = False
    """A repaired card failing again (not one of the table's 419)."""


@dataclass(frozen=True, slots=True)
class Trace:
    timeline: Timeline
    incidents: tuple[Incident, ...]
    planned: tuple[tuple[float, str], ...]
    """(when, node) of each planned maintenance."""
    spells: int
    partitions: int


def node_name(index: int) -> str:
    return f"node-{index:04d}"


def gpu_name(node: int, index: int) -> str:
    return f"GPU-{node:04d}-{index}"


def devices_of(node: int) -> tuple[str, ...]:
    return tuple(gpu_name(node, i) for i in range(GPUS_PER_NODE))


def trace(knobs: Knobs, start: float) -> Trace:
    """The seeded trace: the table's interruptions, the spells, the relapses."""
    rng = random.Random(knobs.seed)
    end = start + DAYS * 86400.0
    repair = 1.0 / (knobs.repair_hours * 3600.0)
    incidents: list[Incident] = []
    for cause in CAUSES:
        for _ in range(cause.count):
            at, node = start + rng.uniform(0, end - start), rng.randrange(NODES)
            device = gpu_name(node, rng.randrange(GPUS_PER_NODE))
            incidents.append(
                Incident(cause, at, node_name(node), device, at + 60.0 + rng.expovariate(repair))
            )
    relapses = []
    for incident in incidents:
        if incident.cause.card and rng.random() < knobs.relapse:
            at = incident.until + rng.uniform(0, knobs.relapse_days * 86400.0)
            if at < end:
                until = at + 60.0 + rng.expovariate(repair)
                relapses.append(
                    Incident(incident.cause, at, incident.node, incident.device, until, relapse=True)
                )
    incidents.extend(relapses)
    incidents.sort(key=lambda i: i.at)
    planned = tuple(
        sorted((start + rng.uniform(0, end - start), node_name(rng.randrange(NODES))) for _ in range(PLANNED))
    )
    spells, lost = [], []
    count = _poisson(rng, knobs.unknown_per_node_day * NODES * DAYS)
    for _ in range(count):
        at, node = start + rng.uniform(0, end - start), rng.randrange(NODES)
        seconds = rng.expovariate(1.0 / knobs.unknown_mean_seconds)
        if rng.random() < knobs.partition_share:
            lost.append(NodeLost(at, node_name(node), seconds))
        else:
            spells.append(UnknownSpell(at, node_name(node), devices_of(node), seconds))
    for incident in incidents:
        if incident.cause.sight == Sight.NODE_LEASE:
            lost.append(NodeLost(incident.at, incident.node, incident.until - incident.at))
    faults = tuple(
        Fault(i.at, i.node, i.device, i.cause.signal, i.until, i.cause.detail)
        for i in incidents
        if i.cause.card
    )
    checks = CheckTruth(
        knobs.probe_seconds,
        knobs.canary_seconds,
        flaky_failure=knobs.flaky_failure,
        flaky=frozenset((i.node, i.device) for i in relapses),
    )
    timeline = Timeline(
        start=start,
        end=end,
        eligible=NODES * GPUS_PER_NODE,
        checks=checks,
        faults=faults,
        spells=tuple(spells),
        lost=tuple(lost),
        move_seconds=knobs.move_seconds,
        seed=knobs.seed,
        devices={node_name(n): devices_of(n) for n in range(NODES)},
    )
    return Trace(
        timeline,
        tuple(incidents),
        planned,
        len(spells),
        len(lost) - sum(1 for i in incidents if i.cause.sight == Sight.NODE_LEASE),
    )


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw by summing exponential gaps (the means here are at most some 10^5)."""
    total, n = 0.0, 0
    while True:
        total += rng.expovariate(1.0)
        if total > mean:
            return n
        n += 1
