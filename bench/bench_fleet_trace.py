"""What device-level governance saves on a published failure record: four policies over one
seeded 54-day, 16,384-GPU trace (`python -m bench fleet_trace [--seed N] [--responder-config F]
[--rules-config F]`).

The trace is calibrated to "The Llama 3 Herd of Models", Table 5 (`bench.fleet_causes`): every
interruption of the table on a drawn node and card, plus what the table does not give (transient
Unknown spells, relapses, repair times), each an explicit knob swept over three values. gpuhealth
is played through the replay engine (`responder.replay`: the product's intake, policy, breaker,
rate limit and ladder, with the shipped rules' timings); node-cordon, naive and none are the rules
of `bench.fleet_policies`. Printed: what each cause shows to the pipeline and who acts on it, the
four-policy table for both workload mixes, the goals met or not (with the cause when not), the
sensitivity of the figures to each knob, and the replay's wall and CPU time on one core.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from backtest.inputs import replay_settings, rule_timings
from bench.fleet_causes import CAUSES, GPUS_PER_NODE, NODES, PLANNED, Knobs, Sight, Trace, trace
from bench.fleet_policies import (
    CRASHLOOP_SECONDS,
    POLICIES,
    Tally,
    account,
    broken_spans,
    inference,
    training,
)
from responder.replay.alerting import RuleTimings
from responder.replay.engine import ReplaySettings, replay
from responder.replay.outcomes import Replay
from rules.render import DEFAULT_CONFIG

START = 1_800_000_000.0
"""The trace's virtual start (any instant: nothing reads the clock)."""
SWEEP: dict[str, tuple[float, float, float]] = {
    "unknown_per_node_day": (0.02, 0.2, 1.0),
    "relapse": (0.0, 0.1, 0.3),
    "repair_hours": (12.0, 48.0, 120.0),
    "redeploy_days": (1.0, 7.0, 30.0),
}
WITHHELD_GOAL, FAILING_GOAL, WALL_GOAL = 0.2, 0.05, 60.0


@dataclasses.dataclass(frozen=True)
class Run:
    knobs: Knobs
    trace: Trace
    replays: dict[str, Replay]
    """gpuhealth's replay per mix (each mix places its own pods on the cards)."""
    wall: float
    cpu: float
    """Drawing the trace and replaying it for the first mix (the training job)."""
    tallies: dict[str, dict[str, Tally]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench fleet_trace")
    parser.add_argument("--seed", type=int, default=Knobs().seed)
    parser.add_argument("--responder-config", type=Path, default=None)
    parser.add_argument("--rules-config", type=Path, default=DEFAULT_CONFIG)
    args = parser.parse_args(argv or [])
    rules, settings = rule_timings(args.rules_config), replay_settings(args.responder_config)
    base = Knobs(seed=args.seed)
    runs: dict[Knobs, Run] = {}

    def run(knobs: Knobs) -> Run:
        if knobs not in runs:
            runs[knobs] = _run(knobs, rules, settings)
        return runs[knobs]

    default = run(base)
    _print_causes(rules)
    _print_knobs(base)
    _print_trace(default)
    for mix, tallies in default.tallies.items():
        _print_table(mix, tallies, default.replays[mix].hours)
    _print_notes(default)
    _print_goals(default)
    if "THERMAL" not in rules.health_watches:
        watched = dataclasses.replace(rules, health_watches=rules.health_watches | {"THERMAL"})
        what_if = _run(base, watched, settings)
        print(
            "\nWhat if dcgm.health_watches included THERMAL (the shipped rules leave it out: a room's cooling"
        )
        print("is no card's fault), same trace:")
        for mix, t in what_if.tallies.items():
            gh, nc, none = t["gpuhealth"], t["node-cordon"], t["none"]
            print(
                f"  [{mix.split(':')[0]}] withheld "
                f"{_ratio(gh.withheld_healthy_hours, nc.withheld_healthy_hours):.3f}x "
                f"node-cordon's; interruptions {gh.interruptions:,} vs {nc.interruptions:,}; work "
                f"on a failing card "
                f"{_ratio(gh.failing_work_hours, none.failing_work_hours):.4f}x none's"
            )
    print("\nSensitivity (one knob at a time, the others as above; gh = gpuhealth, nc = node-cordon):")
    print(
        f"  {'knob = value':30} {'withheld (a)/(b)':>15} {'interr. (a) gh/nc':>19} "
        f"{'interr. (b) gh/nc':>19} "
        f"{'failing gh/none':>16} {'Unknown evict. gh/naive':>24} {'false q. gh':>12} {'trips':>6}"
    )
    for name, values in SWEEP.items():
        for value in values:
            changes: dict[str, Any] = {name: value}
            swept = run(dataclasses.replace(base, **changes))
            print("  " + _sensitivity_row(f"{name} = {value:g}", swept))
    print(
        f"\nReplay of the default trace: wall {default.wall:.1f} s, CPU {default.cpu:.1f} s on one core "
        f"(trace drawn and played through the engine; goal < {WALL_GOAL:.0f} s: "
        f"{'met' if default.wall < WALL_GOAL else 'NOT met'})"
    )


def _run(knobs: Knobs, rules: RuleTimings, settings: ReplaySettings) -> Run:
    wall, cpu = time.perf_counter(), time.process_time()
    drawn = trace(knobs, START)
    mixes = (training(), inference(knobs.seed, knobs.redeploy_days))
    replays = {mixes[0].name: replay(drawn.timeline, rules, settings, mixes[0].placement(drawn))}
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    for mix in mixes[1:]:
        replays[mix.name] = replay(drawn.timeline, rules, settings, mix.placement(drawn))
    detection = rules.evaluation_interval
    tallies = {mix.name: account(drawn, mix, replays[mix.name], detection) for mix in mixes}
    return Run(knobs, drawn, replays, wall, cpu, tallies)


def _who(sight: Sight, detail: str, rules: RuleTimings) -> tuple[str, str, str]:
    """(gpuhealth as shipped, node-cordon, naive) on a cause seen as `sight`."""
    if sight == Sight.FATAL_XID:
        gh = "quarantines" if int(detail) in rules.fatal_xids else "no (XID not in fatal_xids)"
        return gh, "cordons node", "deletes pod"
    if sight == Sight.ECC:
        return "quarantines", "cordons node", "no (plugin says Healthy)"
    if sight == Sight.HEALTH_WATCH:
        gh = "quarantines" if detail in rules.health_watches else f"no ({detail} not in dcgm.health_watches)"
        return gh, "cordons node", "no (plugin says Healthy)"
    if sight == Sight.NODE_LEASE:
        return "left to node lifecycle", "left to node lifecycle", "left to node lifecycle"
    if sight == Sight.APPLICATION_XID:
        return "no action (card healthy)", "no action", "no action"
    return "-", "-", "-"


def _print_causes(rules: RuleTimings) -> None:
    print(
        'Failure record: "The Llama 3 Herd of Models", Table 5: 54 days, 16,384 H100 GPUs '
        f"({NODES:,} nodes x {GPUS_PER_NODE}); {sum(c.count for c in CAUSES)} unexpected + {PLANNED} planned"
    )
    print(
        f"  {'cause':32} {'count':>5}  {'what the pipeline sees':45} {'gpuhealth':28} "
        f"{'node-cordon':14} naive"
    )
    for cause in CAUSES:
        seen = cause.sight.value + (f" [{cause.detail}]" if cause.detail else "")
        gh, nc, naive = _who(cause.sight, cause.detail, rules)
        print(f"  {cause.name:32} {cause.count:5}  {seen:45} {gh:28} {nc:14} {naive}")
    blind = [c for c in CAUSES if c.sight == Sight.NOTHING]
    print(
        f"  Seen by no policy: {', '.join(c.name for c in blind)} ({sum(c.count for c in blind)} of 419; "
        f"{sum(c.count for c in blind if c.card)} of them a broken card: silent data corruption)"
    )
    unseen = [
        c
        for c in CAUSES
        if c.card and c.sight != Sight.NOTHING and _who(c.sight, c.detail, rules)[0].startswith("no")
    ]
    for cause in unseen:
        print(
            f"  Seen, but not acted on by gpuhealth as shipped: {cause.name} ({cause.count}): "
            f"{_who(cause.sight, cause.detail, rules)[0]}"
        )


def _print_knobs(knobs: Knobs) -> None:
    print("\nAssumptions the table does not give (knobs; the first four are swept below):")
    print(
        f"  unknown_per_node_day = {knobs.unknown_per_node_day:g}: transient Unknown spells per node and day "
        f"(kubelet/driver restarts, partitions), every GPU of the node; mean length "
        f"{knobs.unknown_mean_seconds:g} s "
        f"(exponential); {knobs.partition_share:.0%} of them partitions (the node's Lease stops too)"
    )
    print(
        f"  relapse = {knobs.relapse:g}: share of repaired cards that fail again within "
        f"{knobs.relapse_days:g} days; "
        f"such a flaky card fails a check with probability {knobs.flaky_failure:g} meanwhile"
    )
    print(
        f"  repair_hours = {knobs.repair_hours:g}: mean time (exponential) to repair or replace a "
        f"card or host"
    )
    print(
        f"  redeploy_days = {knobs.redeploy_days:g}: an inference service's pod is replaced every "
        f"{knobs.redeploy_days:g} days (its own drawn phase) or when its node goes down or is drained, "
        "and holds its cards until then; the training job's pods are replaced at every restart of "
        "the job (every interruption of the trace, every planned maintenance). A restricted card "
        "keeps its pod (DeviceInUse) and takes no new one; the time its pod ran on it is not "
        "counted as withheld"
    )
    print(
        f"  fixed: probe {knobs.probe_seconds:g} s, canary {knobs.canary_seconds:g} s; a move's "
        f"checkpoint answered in "
        f"{knobs.move_seconds:g} s; a pod on a failing card crash-loops every {CRASHLOOP_SECONDS:g} s "
        f"(CrashLoopBackOff cap); "
        "node-cordon acts on any GPU signal (THERMAL included) one rule evaluation after the fault; "
        "every GPU is "
        "busy in both mixes; partitions and planned maintenance cost every policy the same"
    )


def _print_trace(run: Run) -> None:
    relapses = sum(1 for i in run.trace.incidents if i.relapse)
    print(
        f"\nTrace (seed {run.knobs.seed}): {len(run.trace.incidents) - relapses} failures of the "
        f"table + {relapses} relapses, "
        f"{run.trace.spells:,} Unknown spells, {run.trace.partitions:,} partitions, "
        f"{len(run.trace.planned)} planned"
    )
    for mix, played in run.replays.items():
        print(
            f"  gpuhealth's replay [{mix.split(':')[0]}]: {len(played.records):,} records, "
            f"{len(played.holds):,} holds, {len(played.moves)} moves; records end {dict(played.phases())}"
        )


MEASURES = (
    ("healthy GPU-hours withheld", "withheld_healthy_hours", "{:,.0f}"),
    ("job interruptions", "interruptions", "{:,}"),
    ("work-hours on a failing card", "failing_work_hours", "{:,.1f}"),
    ("evictions for Unknown", "unknown_evictions", "{:,}"),
    ("false quarantines (healthy cards held)", "false_quarantines", "{:,}"),
    ("breaker trips", "breaker_trips", "{}"),
    ("actions per hour", "actions", "{:.2f}"),
)


def _print_table(mix: str, tallies: dict[str, Tally], hours: float) -> None:
    print(f"\nMix {mix}")
    print(f"  {'':40}" + "".join(f"{p:>14}" for p in POLICIES))
    for label, attr, fmt in MEASURES:
        cells = []
        for policy in POLICIES:
            value = getattr(tallies[policy], attr)
            value = value / hours if attr == "actions" else value
            cells.append("-" if value is None else fmt.format(value))
        print(f"  {label:40}" + "".join(f"{c:>14}" for c in cells))


def _print_notes(run: Run) -> None:
    broken = broken_spans(run.trace)
    repaired = sum(1 for i in run.trace.incidents if i.cause.card)
    for mix, played in run.replays.items():
        false = played.false_holds(broken)
        restricts = sum(1 for h in false if h.action == "restrict")
        kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(played.actions.items()))
        restricted, quarantined = _withheld_by_action(run, mix)
        in_use = played.in_use_seconds(broken, "restrict") / 3600.0
        tallies = run.tallies[mix]
        counted = _ratio(
            tallies["gpuhealth"].withheld_healthy_hours + in_use,
            tallies["node-cordon"].withheld_healthy_hours,
        )
        print(
            f"\n  [{mix.split(':')[0]}] gpuhealth's healthy GPU-hours withheld: {restricted:,.0f} by "
            f"restrictions for Unknown (each from when its pod left until its ladder is walked; "
            f"{in_use:,.0f} more hours restricted while the tenant's pod still ran on the card, "
            f"DeviceInUse, not counted: that work went on; counted, the ratio to node-cordon's would "
            f"be {counted:.3f}x), {quarantined:,.0f} by quarantines after "
            f"the repair of {repaired} cards (the ladder, and what is left of the backoff that the "
            "quarantine's expiries while the card was still broken built up)"
        )
        print(
            f"  [{mix.split(':')[0]}] gpuhealth's false quarantines: {restricts:,} restrictions for "
            f"Unknown (nothing moved), {len(false) - restricts:,} quarantines of a working card; "
            "node-cordon's: healthy cards cordoned with their node"
        )
        print(
            f"  [{mix.split(':')[0]}] gpuhealth's actions (its writes): {kinds}; node-cordon's: cordon, "
            "evictions, uncordon; naive's: pod deletions"
        )


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("inf") if a else 0.0


def _print_goals(run: Run) -> None:
    print("\nGoals (default knobs):")
    for mix, t in run.tallies.items():
        gh, nc, none = t["gpuhealth"], t["node-cordon"], t["none"]
        withheld = _ratio(gh.withheld_healthy_hours, nc.withheld_healthy_hours)
        ok = withheld <= WITHHELD_GOAL and gh.interruptions <= nc.interruptions
        print(
            f"  [{mix.split(':')[0]}] withheld {withheld:.3f}x node-cordon's (goal <= {WITHHELD_GOAL}), "
            f"interruptions {gh.interruptions:,} vs {nc.interruptions:,}: {'met' if ok else 'NOT met'}"
            + (
                ""
                if ok
                else " ("
                + (_withheld_cause(run, mix) if withheld > WITHHELD_GOAL else _interruption_cause(gh))
                + ")"
            )
        )
        failing = _ratio(gh.failing_work_hours, none.failing_work_hours)
        top = max(gh.failing_by_cause.items(), key=lambda kv: kv[1], default=("-", 0.0))
        print(
            f"  [{mix.split(':')[0]}] work on a failing card {failing:.4f}x none's (goal <= {FAILING_GOAL}): "
            f"{'met' if failing <= FAILING_GOAL else 'NOT met'}; largest share: {top[0]} ({top[1]:,.1f} h)"
        )
        print(
            f"  [{mix.split(':')[0]}] evictions for Unknown {gh.unknown_evictions} (goal 0): "
            f"{'met' if gh.unknown_evictions == 0 else 'NOT met'}"
        )


def _withheld_cause(run: Run, mix: str) -> str:
    restricts, quarantines = _withheld_by_action(run, mix)
    return (
        f"of gpuhealth's healthy GPU-hours withheld, {restricts:,.0f} are restrictions for Unknown and "
        f"{quarantines:,.0f} quarantines after the card's repair"
    )


def _withheld_by_action(run: Run, mix: str) -> tuple[float, float]:
    """Healthy GPU-hours gpuhealth withheld in `mix`: (restrictions for Unknown, quarantines)."""
    broken = broken_spans(run.trace)
    played = run.replays[mix]
    return (
        played.withheld_healthy_seconds(broken, "restrict") / 3600.0,
        played.withheld_healthy_seconds(broken, "quarantine") / 3600.0,
    )


def _interruption_cause(gh: Tally) -> str:
    top = max(gh.crashes_by_cause.items(), key=lambda kv: kv[1], default=("-", 0))
    return (
        f"{sum(gh.crashes_by_cause.values()):,} restarts on failing cards, {top[1]:,} of them on "
        f"{top[0]} cards"
    )


def _sensitivity_row(label: str, run: Run) -> str:
    a, b = run.tallies.values()
    withheld = _ratio(a["gpuhealth"].withheld_healthy_hours, a["node-cordon"].withheld_healthy_hours)
    served = _ratio(b["gpuhealth"].withheld_healthy_hours, b["node-cordon"].withheld_healthy_hours)
    failing = _ratio(a["gpuhealth"].failing_work_hours, a["none"].failing_work_hours)
    return (
        f"{label:30} {withheld:8.3f}/{served:<6.3f} "
        f"{a['gpuhealth'].interruptions:>8,}/{a['node-cordon'].interruptions:<10,}"
        f" {b['gpuhealth'].interruptions:>8,}/{b['node-cordon'].interruptions:<10,} {failing:16.4f}"
        f" {b['gpuhealth'].unknown_evictions:>11}/{b['naive'].unknown_evictions:<12,}"
        f" {a['gpuhealth'].false_quarantines:12,} {a['gpuhealth'].breaker_trips:6}"
    )


if __name__ == "__main__":
    main()
