"""What a chaos run injects and how its outcome is judged: pure data and decisions, no I/O.

`plan(scenario, seed, kinds)` turns a seed, a scenario and the fault kinds asked for into a
`ChaosPlan`: timed steps in scenario seconds (API fault windows at the simulated apiserver,
process kills with their restarts, steps of the cluster's clock, restarts of the real control
plane's components and compactions of its etcd) and the per-delivery decisions for the webhook
front (`DeliveryChaos`: duplicate a notification, deliver the one before it again after it:
out of order). The same seed gives the same plan. Which kinds a run may ask for depends on its control
plane (`PLANE_KINDS`): the simulated apiserver's fault rules and clock exist only there, the
components of a real control plane only on it. `staged(scenario, plan)`
puts the kills into the scenario's `demo:` section, where the pipeline runs them (`kills:`,
see `demo.staging`), and asks for the HA pair and the replicas they need; the executor
(`demo.chaos`) drives the rest while the pipeline runs.

`assess(...)` turns a run into its figures: the safety verdict's broken invariants
(`demo.safety`, judged over the journal) sorted into duplicate actions, lost quarantines and
unwarranted actions (`classify`), the scenario's failed expectations, and the time the system
took to stop changing after the last fault (from the journal).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from demo.journal import Journal, Kind
from gpuhealth import fields
from simulator.scenario import Scenario

API_KINDS = ("api-500", "api-503", "api-409", "api-429", "api-slow", "api-watch-drop", "api-410")
KILL_KINDS = ("kill-exporter", "kill-responder-leader", "kill-responder-follower", "kill-alertmanager")
WEBHOOK_KINDS = ("webhook-duplicate", "webhook-reorder")
CLOCK_KINDS = ("clock-jump",)
CONTROL_PLANE_KINDS = (
    "restart-apiserver",
    "restart-etcd",
    "etcd-compaction",
    "restart-scheduler",
    "restart-controller-manager",
)
KINDS = API_KINDS + KILL_KINDS + WEBHOOK_KINDS + CLOCK_KINDS + CONTROL_PLANE_KINDS
"""Every fault kind a chaos run can inject, on one control plane or the other."""

RESTARTED = {
    "restart-apiserver": "kube-apiserver",
    "restart-etcd": "etcd",
    "restart-scheduler": "kube-scheduler",
    "restart-controller-manager": "kube-controller-manager",
}
"""The real control plane's component each restart kind stops and starts again
(`simulator.controlplane.ControlPlane.restart`)."""
COMPACTION = "etcd-compaction"
"""etcd compacted at its current revision, then kube-apiserver restarted: a compaction alone is
invisible behind the running apiserver's watch cache; after the restart neither the new cache nor
etcd holds any resourceVersion a client had, so each resuming watch gets 410 Gone and lists
again (`simulator.controlplane.cluster`)."""

SIMULATED = "simulated"
REAL = "real"
PLANE_KINDS: dict[str, tuple[str, ...]] = {
    # API faults and clock steps are rules and a clock of the simulated apiserver itself.
    SIMULATED: API_KINDS + KILL_KINDS + WEBHOOK_KINDS + CLOCK_KINDS,
    # A real apiserver takes no injected faults; its components restart and its etcd compacts.
    REAL: KILL_KINDS + WEBHOOK_KINDS + CONTROL_PLANE_KINDS,
}
"""The kinds each control plane (`demo.pipeline.CONTROL_PLANES`) can have injected."""

GROUPS: dict[str, tuple[str, ...]] = {
    "api": API_KINDS,
    "kills": KILL_KINDS,
    "webhook": WEBHOOK_KINDS,
    "clock": CLOCK_KINDS,
    "control-plane": CONTROL_PLANE_KINDS,
    "all": KINDS,
}
"""Names that stand for several kinds in `--faults` (`all`: those of the run's control plane)."""


class ChaosError(ValueError):
    """A chaos request that cannot be planned; the message names what is wrong."""


def parse_kinds(text: str, control_plane: str = SIMULATED) -> tuple[str, ...]:
    """`api,kill-exporter,clock` -> the kinds, in KINDS order, each once; `all` stands for every
    kind `control_plane` supports, and a kind or group it does not support is refused."""
    supported = kinds_of(control_plane)
    wanted: set[str] = set()
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if name == "all":
            wanted.update(supported)
        elif name in GROUPS:
            wanted.update(GROUPS[name])
        elif name in KINDS:
            wanted.add(name)
        else:
            expected = f"one of {', '.join(KINDS)}, or a group: {', '.join(GROUPS)}"
            raise ChaosError(f"unknown fault kind {name!r} (expected {expected})")
    if not wanted:
        raise ChaosError("no fault kinds given")
    kinds = tuple(k for k in KINDS if k in wanted)
    check_plane(kinds, control_plane)
    return kinds


def kinds_of(control_plane: str) -> tuple[str, ...]:
    """The kinds `control_plane` supports; ChaosError naming the planes for an unknown one."""
    try:
        return PLANE_KINDS[control_plane]
    except KeyError:
        raise ChaosError(
            f"unknown control plane {control_plane!r} (expected one of {', '.join(PLANE_KINDS)})"
        ) from None


def check_plane(kinds: Sequence[str], control_plane: str) -> None:
    """ChaosError naming the kinds `control_plane` cannot inject, and the plane that can."""
    supported = kinds_of(control_plane)
    refused = [k for k in kinds if k in KINDS and k not in supported]
    if refused:
        other = REAL if control_plane == SIMULATED else SIMULATED
        raise ChaosError(
            f"{', '.join(refused)} cannot be injected on the {control_plane} control plane "
            f"(only on the {other} one); it supports: {', '.join(supported)}"
        )


@dataclass(frozen=True, slots=True)
class ChaosSettings:
    """How hard a chaos run pushes; each field checked when built."""

    per_kind: int = 1
    """Injections of each kind asked for, per run (API kinds: windows; kills; clock steps)."""
    api_probability: float = 0.25
    """Chance that a request matching an open API fault window gets the fault."""
    api_window_seconds: float = 60.0
    """Simulated seconds an API fault window stays open."""
    restart_min_seconds: float = 15.0
    """Simulated seconds, at least, before a killed process starts again."""
    restart_max_seconds: float = 60.0
    """Simulated seconds, at most, before a killed process starts again (shorter than the Unknown
    tolerance, so a dead exporter alone never warrants a restriction)."""
    clock_step_min_seconds: float = 30.0
    """Wall seconds, at least, that one step moves the cluster's clock forward."""
    clock_step_max_seconds: float = 600.0
    """Wall seconds, at most, that one step moves the cluster's clock forward."""
    webhook_probability: float = 0.3
    """Chance that a notification is duplicated (webhook-duplicate), or followed by the one before
    it again (webhook-reorder), beyond the first `per_kind` of each, which always are."""
    quiet_seconds: float = 360.0
    """Simulated seconds the run goes on after the last injected fault is over, so that it shows
    the system coming to rest; the plan also keeps the end of the timeline free of injections
    when it can. Long enough for a leader failover (a 15 s Lease in wall time:
    150 simulated seconds at 10x) or a release through probe, canary, stability and ramp."""
    rest_seconds: float = 60.0
    """Simulated seconds without a change of state before the end of the run for the system to
    count as at rest (shorter than `quiet_seconds`; a record cycling every minute is not)."""

    def __post_init__(self) -> None:
        fields.within(self, "per_kind", "injections", 1, whole=True)
        fields.within(self, "api_probability", "chance", 0.0, 1.0)
        fields.positive(self, "api_window_seconds", "simulated seconds")
        fields.positive(self, "restart_min_seconds", "simulated seconds")
        fields.within(self, "restart_max_seconds", "simulated seconds", self.restart_min_seconds)
        fields.positive(self, "clock_step_min_seconds", "wall seconds")
        fields.within(self, "clock_step_max_seconds", "wall seconds", self.clock_step_min_seconds)
        fields.within(self, "webhook_probability", "chance", 0.0, 1.0)
        fields.within(self, "quiet_seconds", "simulated seconds", 0.0)
        fields.within(self, "rest_seconds", "simulated seconds", 0.0, self.quiet_seconds)


@dataclass(frozen=True, slots=True)
class ApiWindow:
    """An API fault at the simulated apiserver from `at` to `until` (scenario seconds)."""

    at: float
    until: float
    kind: str
    rule: Mapping[str, Any]
    """The fault in the JSON form the simulated apiserver takes (`simulator.apiserver.faults`)."""


@dataclass(frozen=True, slots=True)
class Kill:
    """A process killed at `at` and started again `restart` seconds later (scenario seconds)."""

    at: float
    kind: str
    process: str
    """As the `demo:` section names it: responder-leader, responder-follower, exporter, alertmanager."""
    restart: float


@dataclass(frozen=True, slots=True)
class ClockStep:
    """The cluster's wall clock steps `seconds` forward at `at` (scenario seconds)."""

    at: float
    seconds: float
    kind: str = "clock-jump"


@dataclass(frozen=True, slots=True)
class PlaneFault:
    """At `at` (scenario seconds), a component of the real control plane restarted, or its etcd
    compacted (`kind`: one of CONTROL_PLANE_KINDS)."""

    at: float
    kind: str

    @property
    def component(self) -> str:
        """The component that restarts: the restart kind's own, kube-apiserver for a compaction."""
        return RESTARTED.get(self.kind, "kube-apiserver")

    def describe(self) -> str:
        if self.kind == COMPACTION:
            return f"t+{self.at:.0f}s compact etcd, then restart kube-apiserver (410 for every watch)"
        return f"t+{self.at:.0f}s restart {self.component}"


@dataclass(frozen=True, slots=True)
class Delivery:
    """What the webhook front does with one notification."""

    copies: int = 1
    """How many times it is forwarded (2: a duplicate)."""
    late: bool = False
    """Once it has gone, the notification before it is delivered again: an older notification
    arriving after a newer one (out of order), as from an Alertmanager peer that lags."""


@dataclass(frozen=True, slots=True)
class DeliveryChaos:
    """Seeded per-delivery decisions for the webhook front; the n-th delivery's fate depends on n only."""

    seed: int
    duplicate: float = 0.0
    reorder: float = 0.0
    at_least: int = 0
    """The first `at_least` deliveries that can have each planned fault have it (a reorder needs
    one before it: from the second), so that a run with that many notifications injects every
    planned kind; the later ones by their chances."""

    def decide(self, index: int) -> Delivery:
        draw = random.Random(f"{self.seed}:{index}")  # independent of how many were decided before
        duplicated, reordered = draw.random() < self.duplicate, draw.random() < self.reorder
        copies = 2 if self.duplicate > 0 and (duplicated or index < self.at_least) else 1
        late = self.reorder > 0 and index > 0 and (reordered or index <= self.at_least)
        return Delivery(copies, late)


@dataclass(frozen=True)
class ChaosPlan:
    seed: int
    kinds: tuple[str, ...]
    windows: tuple[ApiWindow, ...] = ()
    kills: tuple[Kill, ...] = ()
    steps: tuple[ClockStep, ...] = ()
    deliveries: DeliveryChaos | None = None
    plane_faults: tuple[PlaneFault, ...] = ()
    control_plane: str = SIMULATED
    """The control plane the plan was made for (PLANE_KINDS)."""

    @property
    def last_at(self) -> float:
        """Scenario seconds when the last planned fault is over (a restart, a window's close).
        A control-plane fault is over at its time: it is done (the component ready again) before
        the pipeline's clock is read again."""
        ends = (
            [w.until for w in self.windows]
            + [k.at + k.restart for k in self.kills]
            + [s.at for s in self.steps]
            + [f.at for f in self.plane_faults]
        )
        return max(ends, default=0.0)

    def shortfalls(self, injected: Mapping[str, int]) -> list[str]:
        """How `injected` (by kind) falls short of this plan, one line per kind: a kill, clock
        step or control-plane fault not done exactly as often as planned; an API kind injected
        fewer times than it has windows (each window's first matching request gets its fault:
        `atLeast`); a webhook kind below the deliveries that always carry it
        (`DeliveryChaos.at_least`). Empty: every planned fault was injected."""
        exact: Counter[str] = Counter(k.kind for k in self.kills)
        exact.update(s.kind for s in self.steps)
        exact.update(f.kind for f in self.plane_faults)
        least: Counter[str] = Counter(w.kind for w in self.windows)  # each window's first request
        if self.deliveries is not None:
            for kind, chance in (
                ("webhook-duplicate", self.deliveries.duplicate),
                ("webhook-reorder", self.deliveries.reorder),
            ):
                if chance > 0:
                    least[kind] = max(1, self.deliveries.at_least)
        lines = [
            f"{kind}: planned {count}, injected {injected.get(kind, 0)}"
            for kind, count in sorted(exact.items())
            if injected.get(kind, 0) != count
        ]
        lines += [
            f"{kind}: planned at least {count}, injected {injected.get(kind, 0)}"
            for kind, count in sorted(least.items())
            if injected.get(kind, 0) < count
        ]
        return lines

    def api_schedule(self) -> list[tuple[float, tuple[Mapping[str, Any], ...]]]:
        """(scenario seconds, the rules open from then on), at every window's open and close."""
        moments = sorted({w.at for w in self.windows} | {w.until for w in self.windows})
        return [(t, tuple(w.rule for w in self.windows if w.at <= t < w.until)) for t in moments]

    def describe(self) -> list[str]:
        """One line per planned fault, in time order, for the progress output."""
        lines: list[tuple[float, str]] = []
        for w in self.windows:
            lines.append((w.at, f"t+{w.at:.0f}s..{w.until:.0f}s {w.kind} (p={w.rule['probability']:g})"))
        for k in self.kills:
            lines.append((k.at, f"t+{k.at:.0f}s kill {k.process}, restart after {k.restart:.0f}s"))
        for s in self.steps:
            lines.append((s.at, f"t+{s.at:.0f}s cluster clock +{s.seconds:.0f}s"))
        for f in self.plane_faults:
            lines.append((f.at, f.describe()))
        if self.deliveries is not None:
            d = self.deliveries
            always = f", the first {d.at_least} of each kind planned always" if d.at_least else ""
            line = f"webhook deliveries: duplicate p={d.duplicate:g}, reorder p={d.reorder:g}{always}"
            lines.append((-1.0, line))
        return [text for _, text in sorted(lines, key=lambda x: x[0])]


def timeline_span(scenario: Scenario) -> float:
    """Scenario seconds when the timeline's last fault has played out (at least a minute)."""
    ends = [f.at + (f.duration or 0.0) + (f.times or 0) * (f.period or 0.0) for f in scenario.timeline]
    return max([60.0, *ends])


def _api_rule(kind: str, probability: float, draw: random.Random) -> dict[str, Any]:
    """The apiserver's fault rule (its JSON form) for an API kind: the first request it matches
    gets the fault (`atLeast`), so that the window injects it; later ones by `probability`."""
    sure = {"probability": probability, "atLeast": 1}
    if kind in ("api-500", "api-503"):
        return {"kind": "error", "code": int(kind[4:]), **sure}
    if kind == "api-409":
        return {"kind": "conflict", **sure}
    if kind == "api-429":
        return {"kind": "throttle", **sure}
    if kind == "api-slow":
        return {"kind": "slow", "delay": round(draw.uniform(0.2, 1.0), 2), **sure}
    if kind == "api-watch-drop":
        return {"kind": "drop-watch", "after": round(draw.uniform(0.5, 3.0), 2), **sure}
    return {"kind": "gone", **sure}


def _start(draw: random.Random, span: float, settings: ChaosSettings, lasting: float) -> float:
    """A seeded start for a fault `lasting` seconds, over `quiet_seconds` before `span` if it can be."""
    latest = span - settings.quiet_seconds - lasting
    # A timeline too short for a quiet end takes faults anywhere; the run is made longer instead.
    return round(draw.uniform(0.0, latest if latest > 0 else span), 1)


def plan(
    scenario: Scenario,
    seed: int,
    kinds: Sequence[str],
    settings: ChaosSettings | None = None,
    *,
    control_plane: str = SIMULATED,
) -> ChaosPlan:
    """The faults of one run on `control_plane`: each kind `per_kind` times at seeded points of
    the timeline, each over (a window closed, a process restarted) `quiet_seconds` before the
    timeline's end where the timeline is long enough. A kind the control plane cannot inject
    is refused (ChaosError)."""
    settings = settings or ChaosSettings()
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ChaosError(f"unknown fault kind {unknown[0]!r}")
    check_plane(kinds, control_plane)
    draw = random.Random(f"gpuhealth-chaos:{seed}:{scenario.name}")
    span = timeline_span(scenario)
    windows: list[ApiWindow] = []
    kills: list[Kill] = []
    steps: list[ClockStep] = []
    plane_faults: list[PlaneFault] = []
    for kind in kinds:
        for _ in range(settings.per_kind if kind not in WEBHOOK_KINDS else 0):
            if kind in API_KINDS:
                at = _start(draw, span, settings, settings.api_window_seconds)
                until = at + settings.api_window_seconds
                windows.append(ApiWindow(at, until, kind, _api_rule(kind, settings.api_probability, draw)))
            elif kind in KILL_KINDS:
                restart = round(draw.uniform(settings.restart_min_seconds, settings.restart_max_seconds), 1)
                kills.append(
                    Kill(_start(draw, span, settings, restart), kind, kind.removeprefix("kill-"), restart)
                )
            elif kind in CONTROL_PLANE_KINDS:
                plane_faults.append(PlaneFault(_start(draw, span, settings, 0.0), kind))
            else:
                seconds = round(
                    draw.uniform(settings.clock_step_min_seconds, settings.clock_step_max_seconds)
                )
                steps.append(ClockStep(_start(draw, span, settings, 0.0), float(seconds)))
    deliveries = None
    if any(k in WEBHOOK_KINDS for k in kinds):
        deliveries = DeliveryChaos(
            seed,
            duplicate=settings.webhook_probability if "webhook-duplicate" in kinds else 0.0,
            reorder=settings.webhook_probability if "webhook-reorder" in kinds else 0.0,
            at_least=settings.per_kind,
        )
    return ChaosPlan(
        seed,
        tuple(kinds),
        tuple(sorted(windows, key=lambda w: w.at)),
        tuple(sorted(kills, key=lambda k: k.at)),
        tuple(sorted(steps, key=lambda s: s.at)),
        deliveries,
        tuple(sorted(plane_faults, key=lambda f: f.at)),
        control_plane,
    )


def _duration_text(seconds: float) -> str:
    return f"{seconds:g}s"


def staged(scenario: Scenario, chaos: ChaosPlan) -> Scenario:
    """`scenario` with the plan's kills in its `demo:` section (after its own), and the HA pair
    and replicas they need: killing one Alertmanager of a pair needs a pair, a follower needs two.
    Its expectations lose the promises of silence that the plan's faults break on purpose (a
    killed exporter's node unreachable, every node's Lease unrenewed while the apiserver is down);
    every other expectation is judged."""
    demo: dict[str, Any] = dict(scenario.demo)
    kills = list(demo.get("kills") or [])
    for kill in chaos.kills:
        kills.append(
            {"at": _duration_text(kill.at), "process": kill.process, "restart": _duration_text(kill.restart)}
        )
    if kills:
        demo["kills"] = kills
    processes = {k.process for k in chaos.kills}
    if "alertmanager" in processes:
        demo["alertmanagers"] = 2
    if "responder-follower" in processes or "responder-leader" in processes:
        demo["responders"] = max(2, int(demo.get("responders", 2)))
    lifted: set[str] = set()
    if "exporter" in processes:
        lifted |= DEAD_EXPORTER_ALERTS
    if any(f.kind in API_OUTAGE_KINDS for f in chaos.plane_faults):
        lifted |= CONTROL_PLANE_OUTAGE_ALERTS
    return dataclasses.replace(scenario, demo=demo, expect=_expect_without(scenario.expect, lifted))


DEAD_EXPORTER_ALERTS = frozenset({"GPUNodeUnreachable", "GPUHealthExporterDown"})
"""Alerts a killed exporter raises by design: its node's target is down while it is."""
API_OUTAGE_KINDS = frozenset({"restart-apiserver", "restart-etcd", "etcd-compaction"})
"""Control-plane faults during which the apiserver serves no one (the others leave it up)."""
CONTROL_PLANE_OUTAGE_ALERTS = frozenset({"GPUNodeUnreachable"})
"""Alerts a restart of etcd or kube-apiserver may raise by design: no node agent renews its Lease
while the apiserver is down, and that outage runs in real time while the rules run at the
run's speed: 10 s of wall time at 10x is 100 simulated seconds, the shipped Lease-age limit
(40 s) plus `unreachable_for` (60 s). On a loaded 2-core machine a restart of kube-apiserver
took 4.6 s to 14.5 s (`docs/reliability.md`)."""


def _expect_without(expect: Mapping[str, Any], alerts: set[str]) -> Mapping[str, Any]:
    """`expect` without the promises that `alerts` stay silent, which an injected fault breaks on
    purpose: the alerts saying what the fault did are the pipeline working, not failing."""
    promised = expect.get("alerts")
    if not alerts or not isinstance(promised, Mapping):
        return expect
    kept = [
        entry
        for entry in promised.get("notFired") or []
        if (entry.get("name") if isinstance(entry, Mapping) else entry) not in alerts
    ]
    return {**expect, "alerts": {**promised, "notFired": kept}}


# ---- judging a run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assessment:
    """The figures of one chaos run, from its journal."""

    injected: Mapping[str, int]
    """Faults actually injected, by kind."""
    duplicates: tuple[str, ...]
    """Actions done twice: must be none."""
    lost: tuple[str, ...]
    """Warranted quarantines that never happened (outside a tripped breaker): must be none."""
    unwarranted: tuple[str, ...]
    """Actions nothing warranted: must be none."""
    expectation_failures: tuple[str, ...] = ()
    """The scenario's expectations that failed: must be none."""
    last_fault_at: float = 0.0
    """Scenario seconds when the last injected fault was over."""
    converged_after: float | None = 0.0
    """Scenario seconds from the last fault to the last change of state; None: not at rest by
    `observed_until`, or too little time to tell (`convergence` says which)."""
    observed_until: float = math.inf
    """Scenario seconds up to which the rest is judged: the end, or the scenario's next own fault."""
    rest_seconds: float = 0.0
    """The rest the system needed to count as converged."""
    errors: tuple[str, ...] = field(default=())
    """Why the run could not be judged (it failed to run): counts as a failure."""

    @property
    def failed(self) -> bool:
        return bool(
            self.duplicates or self.lost or self.unwarranted or self.expectation_failures or self.errors
        )


STATE_CHANGES = (
    Kind.ALERT_FIRING,
    Kind.ALERT_RESOLVED,
    Kind.PHASE,
    Kind.ENFORCED,
    Kind.LIFTED,
    Kind.EVICTION,
    Kind.MIGRATION,
    Kind.CHECK,
    Kind.BREAKER,
    Kind.NODE_ACTION,
)
"""What counts as the system still moving when the time to converge is measured."""

DUPLICATE = "duplicate"
LOST = "lost"
UNWARRANTED = "unwarranted"


def classify(violation: str) -> str:
    """Which column a line of the safety verdict (`demo.safety`) belongs to.

    The verdict names each broken invariant in words: an action done twice says "a second"
    record or rule, evicted "a second time", finished "twice"; a warranted quarantine that did
    not happen says "no record by", one delivered and never enforced "was not enforced by", a pod
    never moved off its quarantined device "still on quarantined", a pod handed the card while it
    was quarantined (exposure) "started on quarantined". Everything else the verdict
    refuses (an action without a warrant, an eviction for Unknown, a node-wide action, a release
    without probe and canary or while the device fails, a check on another device, a release
    the breaker blocked) is an action the faults did not warrant.
    """
    if "a second " in violation or " twice" in violation:
        return DUPLICATE
    lost = ("no record by", "was not enforced by", "still on quarantined", "started on quarantined")
    if any(words in violation for words in lost):
        return LOST
    return UNWARRANTED


def next_timeline_moment(scenario: Scenario, after: float) -> float:
    """The scenario's first own fault starting or ending after `after` (inf: none)."""
    moments = [f.at for f in scenario.timeline]
    moments += [f.at + f.duration for f in scenario.timeline if f.duration is not None]
    moments += [f.at + f.times * f.period for f in scenario.timeline if f.times and f.period]
    return min((m for m in moments if m > after), default=math.inf)


def converged_after(
    journal: Journal, last_fault_at: float, rest_seconds: float, horizon: float = math.inf
) -> float | None:
    """Seconds from the last fault to the last change of state before `horizon` (the end of the
    run, or the scenario's next own fault: what follows that is its doing); None when the state
    changed within `rest_seconds` (or two observations) of the horizon, not at rest by then, or
    when the horizon comes sooner than `rest_seconds` after the fault: too little time to tell."""
    until = min(horizon, journal.ended_at)
    if until - last_fault_at < rest_seconds:
        return None  # too little time to tell
    changes = [e.at for e in journal.of(*STATE_CHANGES) if last_fault_at <= e.at <= until]
    if not changes:
        return 0.0
    last = max(changes)
    if until - last < max(rest_seconds, 2 * journal.resolution_seconds):
        return None
    return last - last_fault_at


def assess(
    journal: Journal,
    scenario: Scenario,
    chaos: ChaosPlan,
    injected: Mapping[str, int],
    *,
    verdict_violations: Sequence[str],
    expectation_failures: Sequence[str],
    last_fault_at: float,
    rest_seconds: float,
) -> Assessment:
    """The figures of one run: the safety verdict's lines by column, the expectations that
    failed, and the time to converge after `last_fault_at` (when the last injected fault was
    over)."""
    horizon = next_timeline_moment(scenario, last_fault_at)
    by_column: dict[str, list[str]] = {DUPLICATE: [], LOST: [], UNWARRANTED: []}
    for line in verdict_violations:
        by_column[classify(line)].append(line)
    return Assessment(
        injected=dict(injected),
        duplicates=tuple(by_column[DUPLICATE]),
        lost=tuple(by_column[LOST]),
        unwarranted=tuple(by_column[UNWARRANTED]),
        expectation_failures=tuple(expectation_failures),
        last_fault_at=last_fault_at,
        converged_after=converged_after(journal, last_fault_at, rest_seconds, horizon),
        observed_until=min(horizon, journal.ended_at),
        rest_seconds=rest_seconds,
    )


def merge_counts(*counts: Mapping[str, int]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return {k: total[k] for k in sorted(total) if total[k]}


def injected_text(injected: Mapping[str, int]) -> str:
    """`api-503 x4, kill-exporter x1` (kinds in a stable order)."""
    return ", ".join(f"{kind} x{count}" for kind, count in sorted(injected.items()) if count) or "none"


def convergence(a: Assessment) -> str:
    """The table's cell: `251s`, `not at rest by t+770s`, or `n/a: ...` when it cannot be told."""
    if a.converged_after is not None:
        return f"{a.converged_after:.0f}s"
    if a.observed_until - a.last_fault_at < a.rest_seconds:
        return f"n/a: the scenario's own fault at t+{a.observed_until:.0f}s follows at once"
    return f"not at rest by t+{a.observed_until:.0f}s"
