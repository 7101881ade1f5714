"""`gpuhealth chaos`: scenarios run through the whole pipeline while faults are injected.

    gpuhealth chaos [--scenario NAME|FILE] [--seed N] [--faults LIST] [--speed X] [--runs N]
                    [--per-kind N] [--workdir DIR] [--rules-config FILE]
                    [--control-plane simulated|real] [--kubernetes-version 1.37|1.36]

The plan is pure (`demo.chaos_plan`); this module executes it through the pipeline's seams
(`demo.pipeline.Controls`) and prints one table: faults injected by kind, duplicate actions,
lost quarantines and unwarranted actions (each must be 0), and the time to converge after
the last fault. `ChaosExecutor`:

- on every pass of the pipeline's observation loop (`on_tick`), opens and closes the API fault
  windows that are due on the simulated apiserver (`SimulatedCluster.api_faults`, reached
  through the cluster handle's `call`) and steps the cluster's wall clock
  (`SimulatedCluster.clock.step`), noting each in the journal;
- on the real control plane instead (`demo.clusters.RealTarget.plane`), restarts its components
  and compacts its etcd when due (`simulator.controlplane.ControlPlane.restart`, `compact_etcd`).
  A restart blocks the tick until the whole control plane is ready again (seconds of wall time:
  the pipeline's loop reads no alerts meanwhile, the processes it started run on; it must run
  on the thread that started the components, `simulator.controlplane.process`), and the journal
  notes how long. After a compaction (then a restart of kube-apiserver) it waits for the evidence that our
  watches met 410 Gone: the exporters' `watch_restarts{reason="expired"}` rising in Prometheus;
- decides, as the webhook front's hook, what happens to each notification: forwarded twice
  (a duplicate delivery), or followed by the notification before it once more (an older one
  after a newer: out of order); each counted once it has been forwarded;
- leaves process kills to the pipeline, which runs them from the scenario's `demo:` section
  (`chaos_plan.staged` puts them there).

Exit codes: 0 every must-be-0 column is 0 in every run, 1 one is not (or a run failed),
2 bad flags or input.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO, runtime_checkable

from demo.chaos_plan import (
    COMPACTION,
    GROUPS,
    KINDS,
    PLANE_KINDS,
    SIMULATED,
    Assessment,
    ChaosError,
    ChaosPlan,
    ChaosSettings,
    PlaneFault,
    assess,
    convergence,
    injected_text,
    merge_counts,
    parse_kinds,
    plan,
    staged,
)
from demo.cli import prepare
from demo.journal import Entry, Journal, Kind
from demo.pipeline import CONTROL_PLANES, KUBERNETES_VERSIONS, Controls, DemoSettings, run_demo, timeline_end
from demo.staging import StagingError, staging
from gpuhealth.cliargs import EXIT_FAILED, UsageError, command, positive_float
from gpuhealth.tables import write_table
from gpuhealth.testing.loopback import LoopbackError
from rules.render import DEFAULT_CONFIG
from rules.render import Settings as RuleSettings
from simulator.apiserver.faults import FaultRule, describe, rule_from_json
from simulator.controlplane.process import ControlPlaneError
from simulator.scenario import Scenario

EXPIRED_WATCHES = 'sum(gpuhealth_exporter_watch_restarts_total{reason="expired"}) or vector(0)'
"""The exporters' watches restarted after 410 Gone, all resources together."""


@runtime_checkable
class _Cluster(Protocol):
    """The simulated cluster's seam (`demo.clusters.SimulatedTarget.call`): API faults, its clock."""

    def call(self, fn: Callable[[Any], Any], timeout: float = ...) -> Any: ...


class _Plane(Protocol):
    """What the executor does to a real control plane (`simulator.controlplane.ControlPlane`)."""

    @property
    def revived(self) -> list[str]: ...
    def restart(self, name: str) -> float: ...
    def compact_etcd(self) -> int: ...


@runtime_checkable
class _RealCluster(Protocol):
    """The real control plane's seam (`demo.clusters.RealTarget.plane`)."""

    @property
    def plane(self) -> _Plane: ...


class _Metrics(Protocol):
    """What the executor reads of Prometheus (`gpuhealth.testing.loopback.Prometheus`)."""

    def value(self, expr: str) -> float | None: ...


class RunningPipeline(Protocol):
    """What the executor uses of `demo.pipeline.Running`."""

    @property
    def cluster(self) -> object: ...
    @property
    def journal(self) -> Journal: ...
    @property
    def prometheus(self) -> _Metrics: ...
    def now(self) -> float: ...


class _Request(Protocol):
    @property
    def body(self) -> bytes: ...


Reply = tuple[int, bytes]


def _simulated(run: RunningPipeline) -> _Cluster:
    """The run's cluster, which must be the simulated one: API faults and clock steps are its own."""
    cluster = run.cluster
    if not isinstance(cluster, _Cluster):
        raise ChaosError("API fault windows and clock steps need the simulated cluster")
    return cluster


def _plane(run: RunningPipeline) -> _Plane:
    """The run's real control plane: its components' restarts and etcd's compactions are its own."""
    cluster = run.cluster
    if not isinstance(cluster, _RealCluster):
        raise ChaosError(
            "restarts of control-plane components and etcd compactions need the real control plane"
        )
    return cluster.plane


class ChaosExecutor:
    """Applies one `ChaosPlan` to a running pipeline and counts what it injected."""

    def __init__(self, plan: ChaosPlan, out: TextIO | None = None, *, label: str = "chaos") -> None:
        self.plan = plan
        self.out = out
        self.label = label
        self._schedule = plan.api_schedule()
        self._steps = list(plan.steps)
        self._plane_faults = list(plan.plane_faults)
        self._simulated = plan.control_plane == SIMULATED
        self._expired_before: float | None = None
        """The exporters' expired-watch restarts before a compaction, until more are seen."""
        self.expired_watches = 0
        """Watch restarts after 410 Gone the exporters counted following compactions."""
        self._api_counts: dict[str, int] = {}
        self.counts: Counter[str] = Counter()
        """Faults this executor injected itself (clock steps, duplicates, reorders)."""
        self._lock = threading.Lock()
        self.decided = 0
        """Notifications whose fate the hook has drawn."""
        self._last: _Request | None = None
        """The notification decided last: the one a late delivery sends again."""

    # -- the pipeline's seams

    def on_started(self, run: RunningPipeline) -> None:
        if self._simulated:
            _simulated(run).call(lambda c: c.api_faults.configure((), seed=self.plan.seed))
            faults = f"{len(self.plan.windows)} API windows, {len(self.plan.steps)} clock steps"
        else:
            _plane(run)  # a plan for the real control plane on another cluster fails now, not mid-run
            faults = f"{len(self.plan.plane_faults)} control-plane faults"
        self._say(run, f"plan: {len(self.plan.kills)} kills, {faults}")

    def on_tick(self, run: RunningPipeline) -> None:
        if self._simulated:
            self._simulated_tick(run)
        else:
            self._plane_tick(run)

    def _plane_tick(self, run: RunningPipeline) -> None:
        while self._plane_faults and self._plane_faults[0].at <= run.now():
            self._apply(run, self._plane_faults.pop(0))
        if self._expired_before is not None:
            self._look_for_expired(run)

    def _apply(self, run: RunningPipeline, fault: PlaneFault) -> None:
        """One control-plane fault, done before this returns (the tick waits: noted)."""
        plane, at = _plane(run), run.now()
        compacted = ""
        if fault.kind == COMPACTION:
            if self._expired_before is None:  # still waiting after an earlier one: keep its baseline
                self._expired_before = _expired(run) or 0.0
            compacted = f"etcd compacted at revision {plane.compact_etcd()}, then "
        revived = len(plane.revived)
        took = plane.restart(fault.component)
        self.counts[fault.kind] += 1
        also = "".join(f"; {name} had exited and was started again" for name in plane.revived[revived:])
        self._note(
            run,
            at,
            f"{compacted}{fault.component} restarted, the control plane ready again after {took:.1f} s "
            f"wall{also} (the pipeline's observation waited until t+{run.now():.0f}s)",
        )

    def _look_for_expired(self, run: RunningPipeline) -> None:
        """Note once the exporters' watches restarted after 410 Gone since the compaction."""
        before, now = self._expired_before or 0.0, _expired(run)
        if now is not None and now > before:
            self.expired_watches += int(now - before)
            self._expired_before = None
            self._note(
                run,
                run.now(),
                f"our watches met 410 Gone: {now - before:.0f} exporter watch restarts (expired) "
                "since the compaction, each followed by a list",
            )

    def _simulated_tick(self, run: RunningPipeline) -> None:
        now = run.now()
        while self._schedule and self._schedule[0][0] <= now:
            _, raw = self._schedule.pop(0)
            rules = tuple(rule_from_json(r, f"window rule {r}") for r in raw)
            _simulated(run).call(_configure(rules))
            self._note(run, now, f"API faults now: {describe(rules)}")
        while self._steps and self._steps[0].at <= now:
            step = self._steps.pop(0)
            _simulated(run).call(_step(step.seconds))
            self.counts["clock-jump"] += 1
            self._note(run, now, f"cluster clock stepped {step.seconds:+.0f}s")
        self._api_counts = _simulated(run).call(lambda c: dict(c.api_faults.injected))

    def front_hook(self, request: _Request, forward: Callable[[Any], Reply]) -> Reply:
        """The webhook front's hook: forward once, twice, or once and then the one before again.

        The sender gets the answer to its own notification (the second copy's, for a duplicate);
        the answer to a late copy of an earlier one goes to no one, as that sender had its own."""
        chaos = self.plan.deliveries
        if chaos is None:
            return forward(request)
        with self._lock:
            index, self.decided = self.decided, self.decided + 1
            earlier, self._last = self._last, request
        fate = chaos.decide(index)
        reply = forward(request)
        if fate.copies > 1:
            reply = forward(request)
            with self._lock:
                self.counts["webhook-duplicate"] += 1
        if fate.late and earlier is not None:
            forward(earlier)
            with self._lock:
                self.counts["webhook-reorder"] += 1
        return reply

    # -- the figures

    def injected(self, journal: Journal) -> dict[str, int]:
        """Every fault injected in the run, by kind: API faults as the apiserver counted them,
        process kills as the journal recorded them, and this executor's own."""
        total: Counter[str] = Counter(self._api_counts)
        total.update(self.counts)
        total.update(kills_by_kind(journal))
        return {k: total[k] for k in sorted(total) if total[k]}

    def _note(self, run: RunningPipeline, at: float, text: str) -> None:
        run.journal.record(at, Kind.NOTE, f"chaos: {text}")
        self._say(run, text, at)

    def _say(self, run: RunningPipeline, text: str, at: float | None = None) -> None:
        if self.out is not None:
            stamp = f"t+{at if at is not None else run.now():6.0f}s"
            print(f"[{self.label} {stamp}] {text}", file=self.out, flush=True)


def _expired(run: RunningPipeline) -> float | None:
    """The exporters' expired-watch restarts now (None: Prometheus did not answer; asked again)."""
    try:
        return run.prometheus.value(EXPIRED_WATCHES)
    except LoopbackError:
        return None


def _configure(rules: tuple[FaultRule, ...]) -> Callable[[Any], None]:
    return lambda cluster: cluster.api_faults.configure(rules)


def _step(seconds: float) -> Callable[[Any], None]:
    return lambda cluster: cluster.clock.step(seconds)


def kills_by_kind(journal: Journal) -> Mapping[str, int]:
    """Process kills the journal recorded, by chaos kind (`kill-responder-leader`, ...)."""
    kinds: Counter[str] = Counter()
    for entry in journal.of(Kind.PROCESS):
        if entry.what != "killed":
            continue
        name = entry.detail.get("name", "")
        if name.startswith("responder"):
            kinds[f"kill-responder-{entry.detail.get('role') or 'follower'}"] += 1
        elif name.startswith("exporter"):
            kinds["kill-exporter"] += 1
        elif name.startswith("alertmanager"):
            kinds["kill-alertmanager"] += 1
        else:
            kinds[f"kill-{name}"] += 1
    return kinds


# ---- the command ---------------------------------------------------------------------------------

DEFAULT_SCENARIO = "closed-loop"
DEFAULT_SEED = 1
HEADERS = (
    "RUN",
    "SEED",
    "FAULTS INJECTED",
    "DUPLICATE ACTIONS",
    "LOST QUARANTINES",
    "UNWARRANTED ACTIONS",
    "EXPECTATIONS FAILED",
    "CONVERGED AFTER LAST FAULT",
)
PROGRESS_KINDS = frozenset(
    {Kind.FAULT, Kind.PROCESS, Kind.PHASE, Kind.MIGRATION, Kind.BREAKER, Kind.NODE_ACTION}
)
"""Journal entries shown while a run goes (the rest is in each run's journal.json)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chaos",
        help="run a scenario through the whole loop while injecting faults; one reliability table",
        description=(
            "Run a scenario through the whole closed loop (simulated cluster, exporters, Prometheus, "
            "Alertmanager, two responder replicas) while injecting seeded faults: API faults at the "
            "simulated apiserver (500, 503, 409, 429, slow answers, dropped watches, 410 on resume), "
            "process kills (exporter, responder leader and follower, one Alertmanager of a pair), "
            "duplicate and out-of-order webhook deliveries, and steps of the cluster's clock. With "
            "--control-plane real, on etcd and the Kubernetes servers built from upstream: restarts "
            "of kube-apiserver, etcd, kube-scheduler and kube-controller-manager, and an etcd "
            "compaction (410 Gone for every watch), besides the kills and webhook faults. Print "
            "one table; exit 1 when any run did an action twice, lost a warranted quarantine, did an "
            "unwarranted action or failed the scenario's expectations; 2 for bad flags or input."
        ),
    )
    parser.add_argument(
        "--scenario", default=DEFAULT_SCENARIO, help="built-in name or YAML file (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help="seed of the first run (default: %(default)s)"
    )
    parser.add_argument(
        "--faults",
        default="all",
        help=f"fault kinds or groups, comma-separated: {', '.join(GROUPS)}, or kinds ({', '.join(KINDS)}); "
        "`all` is every kind the control plane supports (simulated: "
        f"{', '.join(PLANE_KINDS['simulated'])}; real: {', '.join(PLANE_KINDS['real'])}) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--control-plane",
        choices=CONTROL_PLANES,
        default=SIMULATED,
        help=(
            "the cluster to run on: the in-process simulated apiserver (the default; API faults and "
            "clock steps), or a real etcd, kube-apiserver, kube-controller-manager and kube-scheduler "
            "built from upstream (tools/upstream; their restarts and an etcd compaction)"
        ),
    )
    parser.add_argument(
        "--kubernetes-version",
        choices=KUBERNETES_VERSIONS,
        default=None,
        help="with --control-plane real: which pinned build runs "
        f"(default: {DemoSettings.kubernetes_version})",
    )
    parser.add_argument(
        "--speed",
        type=positive_float,
        default=None,
        help="simulated seconds per second (default: the scenario's demo.speed, else the demo's default)",
    )
    parser.add_argument(
        "--runs", type=_whole_positive, default=1, help="runs, seeds N, N+1, ... (default: 1)"
    )
    parser.add_argument(
        "--per-kind",
        type=_whole_positive,
        default=ChaosSettings().per_kind,
        help="injections of each kind per run",
    )
    parser.add_argument("--rules-config", type=Path, default=DEFAULT_CONFIG, help="rules config to scale")
    parser.add_argument("--workdir", type=Path, help="keep each run's files here (default: a temp dir)")
    command(parser, run)


def _whole_positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    if args.control_plane == SIMULATED and args.kubernetes_version is not None:
        raise UsageError("--kubernetes-version applies to --control-plane real")
    try:
        kinds = parse_kinds(args.faults, args.control_plane)
    except ChaosError as exc:
        raise UsageError(f"--faults: {exc}") from exc
    scenario, _, speed, rules, workdir = prepare(args)
    settings = ChaosSettings(per_kind=args.per_kind)
    cluster = DemoSettings(
        speed=speed,
        control_plane=args.control_plane,
        kubernetes_version=args.kubernetes_version or DemoSettings.kubernetes_version,
    )
    out = sys.stdout
    where = "simulated cluster"
    if cluster.control_plane != SIMULATED:
        where = f"real control plane, Kubernetes {cluster.kubernetes_version}"
    print(
        f"gpuhealth chaos: scenario {scenario.name} on the {where}, {args.runs} run(s) from seed "
        f"{args.seed}, {speed:g}x; faults: {', '.join(kinds)}; files in {workdir}",
        file=out,
        flush=True,
    )
    results: list[tuple[int, Assessment]] = []
    for index in range(args.runs):
        seed = args.seed + index
        label = f"run {index + 1}/{args.runs} seed {seed}"
        assessment = run_once(
            scenario,
            rules,
            speed,
            seed,
            kinds,
            settings,
            workdir / f"run-{index + 1}",
            out,
            label,
            control_plane=cluster.control_plane,
            kubernetes_version=cluster.kubernetes_version,
        )
        results.append((seed, assessment))
    print(file=out)
    write_results(results, out)
    (workdir / "chaos.json").write_text(
        json.dumps(results_document(results, scenario.name, speed, kinds, cluster), indent=1)
    )
    print(f"\nfiles: {workdir} (each run's journal.json and logs; chaos.json)", file=out, flush=True)
    return EXIT_FAILED if any(a.failed for _, a in results) else 0


def run_once(
    scenario: Scenario,
    rules: RuleSettings,
    speed: float,
    seed: int,
    kinds: tuple[str, ...],
    settings: ChaosSettings,
    workdir: Path,
    out: TextIO,
    label: str,
    *,
    control_plane: str = SIMULATED,
    kubernetes_version: str = DemoSettings.kubernetes_version,
) -> Assessment:
    """One run of `scenario` with the faults of `seed`, through the whole pipeline on
    `control_plane` (`DemoSettings.control_plane`); its figures."""
    chaos = plan(scenario, seed, kinds, settings, control_plane=control_plane)
    run_scenario = staged(scenario, chaos)
    stage = staging(run_scenario.demo)
    # The pipeline runs `settle` past the timeline and the kills' restarts; the time to converge
    # is measured after the last injected fault, so the run goes on `quiet_seconds` past it (a
    # scenario's own faults play out as its author timed them, to the end the author chose).
    last_fault = chaos.last_at
    ran_to = max([timeline_end(run_scenario), *(k.at + (k.restart or 0.0) for k in stage.kills)])
    settle = max(stage.settle, last_fault + settings.quiet_seconds - ran_to)
    workdir.mkdir(parents=True, exist_ok=True)
    executor = ChaosExecutor(chaos, out, label=label)
    print(f"[{label}] planned:", file=out)
    for line in chaos.describe():
        print(f"[{label}]   {line}", file=out)
    out.flush()

    def progress(entry: Entry) -> None:
        if entry.kind in PROGRESS_KINDS:
            where = f" {entry.node}" if entry.node else ""
            device = f" {entry.device[:12]}" if entry.device else ""
            if entry.kind is Kind.PROCESS:
                role = entry.detail.get("role")
                where = f" {entry.detail.get('name', '?')}" + (f" ({role})" if role else "")
            print(
                f"[{label} t+{entry.at:6.0f}s] {entry.kind.value} {entry.what}{where}{device}",
                file=out,
                flush=True,
            )

    controls = Controls(
        front_hook=executor.front_hook, on_started=executor.on_started, on_tick=executor.on_tick
    )
    with (workdir / "demo.log").open("w") as log:
        try:
            outcome = run_demo(
                run_scenario,
                rules,
                DemoSettings(
                    speed=speed,
                    settle_seconds=settle,
                    control_plane=control_plane,
                    kubernetes_version=kubernetes_version,
                ),
                workdir,
                log,
                controls=controls,
                on_entry=progress,
            )
        except StagingError as exc:
            raise UsageError(f"{scenario.name}: {exc}") from exc
        except (LoopbackError, ControlPlaneError) as exc:
            print(f"[{label}] the pipeline failed: {exc}", file=out, flush=True)
            return Assessment(injected={}, duplicates=(), lost=(), unwarranted=(), errors=(str(exc),))
    return assess(
        outcome.journal,
        scenario,
        chaos,
        executor.injected(outcome.journal),
        verdict_violations=outcome.verdict.violations,
        expectation_failures=outcome.expectation_failures,
        last_fault_at=last_fault,
        rest_seconds=settings.rest_seconds,
    )


def write_results(results: list[tuple[int, Assessment]], out: TextIO) -> None:
    """The one table, then every line behind a non-zero must-be-0 figure."""
    rows = []
    for index, (seed, a) in enumerate(results, 1):
        rows.append(
            [
                str(index),
                str(seed),
                injected_text(a.injected) if not a.errors else "run failed",
                str(len(a.duplicates)),
                str(len(a.lost)),
                str(len(a.unwarranted)),
                str(len(a.expectation_failures)),
                convergence(a) if not a.errors else "-",
            ]
        )
    if len(results) > 1:
        total = merge_counts(*(a.injected for _, a in results))
        rows.append(
            [
                "all",
                "",
                injected_text(total),
                str(sum(len(a.duplicates) for _, a in results)),
                str(sum(len(a.lost) for _, a in results)),
                str(sum(len(a.unwarranted) for _, a in results)),
                str(sum(len(a.expectation_failures) for _, a in results)),
                _worst_converge([a for _, a in results]),
            ]
        )
    write_table(HEADERS, rows, out)
    for index, (seed, a) in enumerate(results, 1):
        for title, lines in (
            ("DUPLICATE ACTION", a.duplicates),
            ("LOST QUARANTINE", a.lost),
            ("UNWARRANTED ACTION", a.unwarranted),
            ("EXPECTATION FAILED", a.expectation_failures),
            ("RUN FAILED", a.errors),
        ):
            for line in lines:
                print(f"run {index} (seed {seed}) {title}: {line}", file=out)
    out.flush()


def _worst_converge(assessments: list[Assessment]) -> str:
    """The slowest of the runs that converged, and how many did not (or could not tell)."""
    times = [a.converged_after for a in assessments if a.converged_after is not None and not a.errors]
    others = len(assessments) - len(times)
    slowest = f"max {max(times):.0f}s" if times else "-"
    return f"{slowest}, {others} of {len(assessments)} not" if others else slowest


def results_document(
    results: list[tuple[int, Assessment]],
    scenario: str,
    speed: float,
    kinds: tuple[str, ...],
    cluster: DemoSettings | None = None,
) -> dict[str, Any]:
    cluster = cluster or DemoSettings(speed=speed)
    return {
        "scenario": scenario,
        "controlPlane": cluster.control_plane,
        "kubernetesVersion": cluster.kubernetes_version if cluster.control_plane != SIMULATED else None,
        "speed": speed,
        "faults": list(kinds),
        "runs": [
            {
                "seed": seed,
                "injected": dict(a.injected),
                "duplicateActions": list(a.duplicates),
                "lostQuarantines": list(a.lost),
                "unwarrantedActions": list(a.unwarranted),
                "expectationFailures": list(a.expectation_failures),
                "lastFaultAt": a.last_fault_at,
                "convergedAfterSeconds": a.converged_after,
                "observedUntil": a.observed_until if a.observed_until != float("inf") else None,
                "convergence": convergence(a),
                "errors": list(a.errors),
            }
            for seed, a in results
        ],
    }
