"""End-to-end detection latency, per fault kind, through the whole demo pipeline.

The pipeline is the demo's (`demo.pipeline.run_demo`): the simulated cluster, node-mode
exporters with NVML from the simulator, a real Prometheus evaluating the shipped rules and a
real Alertmanager with the shipped routing, two responder replicas enforcing. The bench
scenario injects many spaced faults, each on its own GPU, of each kind:

- `xid`: a fatal XID (79): NVML's event and the kubelet's Unhealthy at the same instant;
- `device-unhealthy`: the kubelet's Unhealthy alone (the alert waits its `for:`);
- `ecc` (uncorrectable) and `row-remap-failure`: NVML readings only;
- `gpu-lost`: the GPU falls off the bus (XID 79, Unhealthy, the driver's taint);
- `device-unknown` for longer than the tolerance: restrict.

Latency runs from the onset (the NVML event, or the kubelet's report: `demo.summary`) to the
device excluded: its DeviceTaintRule (DRA) or its node annotation (device plugin) existing.
The floor is the pipeline's own, per alert: scrape interval + evaluation interval + the alert's
`for:` + the responder route's group_wait (`demo.floors.alert_floors`).

Units. The demo runs the cluster `SPEED` times faster than the wall clock and divides every
rule duration by the same factor, so latencies and floors are in simulated seconds, as the
scenario means them. What lies above the floor is the pipeline's own work (the exporter's
watch, Prometheus sending, Alertmanager dispatching, the responder recording and enforcing,
and the journal's observation), and that is wall time whatever the speed: the excess in
simulated seconds divided by the speed is what a deployment at 1x would see above its floor.
The targets (median within floor + 2 s, p99 within floor + 5 s) are judged on that wall
excess; both are printed. The breaker and the bucket of new quarantines are raised for this
run (the scenario's `responder:` section, said in the output): the bench measures the path,
not the limits, as `bench_responder_cluster` does.

Run: `python -m bench e2e_latency [--speed X] [--per-kind N]`. It takes about three minutes;
the journal and the HTML report of the run are kept in a temporary directory it names.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demo.floors import alert_floors
from demo.journal import Entry, Journal, Kind
from demo.pipeline import DemoSettings, devices_of, run_demo
from demo.progress import narrate
from demo.report import write_html
from demo.summary import Detection, Summary, percentile, summarize, write_text
from gpuhealth.cliargs import positive_float
from gpuhealth.tables import write_table
from rules.render import DEFAULT_CONFIG, ConfigError, load_config, scaled
from rules.render import Settings as RuleSettings
from simulator.model import Scenario
from simulator.scenario import from_dict

SPEED = 10.0
"""Simulated seconds per wall second: high enough to keep the run short, low enough that the
2-core machine keeps up (the exporters, Prometheus and the responders share it)."""
PER_KIND = 8
"""Faults of each kind: p99 of eight is close to their maximum, the honest reading of a tail
this small."""
SPACING = 12.0
"""Simulated seconds between two faults: each alert fires alone, not in one Alertmanager group."""
UNKNOWN_FOR = 420.0
"""How long the long Unknowns last: past the 5-minute tolerance plus the DRA health timeout."""
SETTLE = 60.0
"""Simulated seconds after the last fault ends: the last restrict is enforced by then."""
START_UP = 20.0
"""Wall seconds the exporters and responders take to come up after the cluster starts, on a
loaded 2-core machine: a fault before they watch would measure their start-up."""
MEDIAN_TARGET = 2.0
P99_TARGET = 5.0
DRA_NODES = 4
DP_NODES = 3
GPUS = 8

KINDS: tuple[tuple[str, dict[str, Any], bool], ...] = (
    # (fault kind, its fields, DRA only)
    ("xid", {"xid": 79}, False),
    ("device-unhealthy", {"message": "bench: kubelet reports Unhealthy"}, False),
    ("ecc", {"uncorrected": 1}, False),
    ("row-remap-failure", {}, False),
    ("gpu-lost", {}, False),
    # The kubelet's Unknown comes from the DRA health stream going silent.
    ("device-unknown", {"duration": f"{UNKNOWN_FOR:g}s"}, True),
)

RESPONDER_OVERRIDES: dict[str, Any] = {
    "breaker": {"rate_floor": 1000, "capacity_floor": 1000},
    "new_quarantines": {"burst": 1000, "per_hour": 100000},
}


def bench_scenario(per_kind: int | None = None, spacing: float | None = None) -> dict[str, Any]:
    """The scenario as plain data: spaced faults of every kind, each on its own GPU.

    Every GPU holds a pod (one GPU each, no checkpoint): the kubelet reports the health of
    allocated devices, as it does in a real cluster. Without a checkpoint nothing is evicted:
    the responder keeps the evidence and tells the tenant, which keeps the run's API work to
    what detection and enforcement need.
    """
    per_kind = PER_KIND if per_kind is None else per_kind
    spacing = SPACING if spacing is None else spacing
    dra = [(f"lat-dra-{n}", g) for g in range(GPUS) for n in range(DRA_NODES)]
    dp = [(f"lat-dp-{n}", g) for g in range(GPUS) for n in range(DP_NODES)]
    timeline = []
    at = 20.0
    for round_ in range(per_kind):
        for kind, fields, dra_only in KINDS:
            pool = dra if dra_only or round_ % 2 == 0 or not dp else dp
            if not pool:
                raise ValueError(f"the bench fleet has no device left for {kind} (round {round_ + 1})")
            node, gpu = pool.pop(0)
            timeline.append({"at": f"{at:g}s", "fault": kind, "device": {"node": node, "gpu": gpu}, **fields})
            at += spacing
    return {
        "name": "bench-e2e-latency",
        "description": f"{per_kind} spaced faults of each kind, each on its own GPU",
        "fleet": [
            {"name": "lat-dra", "count": DRA_NODES, "gpusPerNode": GPUS, "path": "dra"},
            {"name": "lat-dp", "count": DP_NODES, "gpusPerNode": GPUS, "path": "device-plugin"},
        ],
        "workloads": [
            {
                "name": f"hold-{group}",
                "namespace": "bench",
                "kind": "Deployment",
                "replicas": nodes * GPUS,
                "gpusPerPod": 1,
                "checkpoint": "none",
                "path": path,
                "nodeGroup": f"lat-{group}",
            }
            for group, nodes, path in (("dra", DRA_NODES, "dra"), ("dp", DP_NODES, "device-plugin"))
        ],
        "timeline": timeline,
        "demo": {"settle": f"{SETTLE:g}s"},
        "responder": RESPONDER_OVERRIDES,
    }


@dataclass(frozen=True)
class Row:
    fault: str
    alert: str
    """Which alert detected the faults first, and how often (GPUDevice prefix dropped)."""
    count: int
    seen: int
    """Faults of this kind in the scenario (count: those that reached enforcement)."""
    floors: str
    """The floors of the alerts that detected it (the first alert with an action wins)."""
    median: float
    p99: float
    over_median_wall: float
    over_p99_wall: float

    @property
    def met(self) -> bool:
        return (
            self.count == self.seen
            and self.over_median_wall <= MEDIAN_TARGET
            and self.over_p99_wall <= P99_TARGET
        )


def figures(summary: Summary, speed: float) -> list[Row]:
    """Per fault kind: latency in simulated seconds and the excess over the floor in wall seconds."""
    rows = []
    for kind, _, _ in KINDS:
        stories = [f for f in summary.faults if f.fault == kind and f.detection is not None]
        done: list[Detection] = [
            f.detection for f in stories if f.detection is not None and f.detection.total is not None
        ]
        totals = [d.total for d in done if d.total is not None]
        over = [d.over_floor / speed for d in done if d.over_floor is not None]
        first = Counter(d.alert for d in done)
        floor_of = {d.alert: d.floor for d in done}
        rows.append(
            Row(
                fault=kind,
                alert=", ".join(f"{name.removeprefix('GPUDevice')} x{n}" for name, n in sorted(first.items()))
                or "-",
                count=len(done),
                seen=len(stories),
                floors="/".join(f"{floor_of[name]:.0f}" for name in sorted(first)) or "-",
                median=percentile(totals, 0.5),
                p99=percentile(totals, 0.99),
                over_median_wall=percentile(over, 0.5),
                over_p99_wall=percentile(over, 0.99),
            )
        )
    return rows


def print_table(rows: Sequence[Row], speed: float, resolution: float) -> None:
    print(
        f"\nend-to-end detection latency at {speed:g}x: simulated seconds, and the excess over the floor "
        f"in wall seconds (journal stamps late by up to {resolution / speed:.2f} wall s)"
    )
    headers = ["FAULT", "ALERT", "N", "FLOOR", "MEDIAN", "P99", "OVER MEDIAN", "OVER P99", "TARGET"]
    cells = [
        [
            r.fault,
            r.alert,
            f"{r.count}/{r.seen}",
            r.floors,
            f"{r.median:.1f}",
            f"{r.p99:.1f}",
            f"{r.over_median_wall:+.2f}s",
            f"{r.over_p99_wall:+.2f}s",
            "met" if r.met else "MISSED",
        ]
        for r in rows
    ]
    write_table(headers, cells, sys.stdout)
    print(f"targets: median within floor + {MEDIAN_TARGET:g} s, p99 within floor + {P99_TARGET:g} s (wall)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench e2e_latency", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--speed",
        type=positive_float,
        default=SPEED,
        help="simulated seconds per second (default: %(default)s)",
    )
    parser.add_argument(
        "--per-kind", type=int, default=PER_KIND, help="faults of each kind (default: %(default)s)"
    )
    args = parser.parse_args(argv or [])
    if args.per_kind < 1:
        parser.error(f"--per-kind {args.per_kind}: at least 1")
    speed = args.speed
    try:
        scenario = from_dict(bench_scenario(per_kind=args.per_kind), source="bench/bench_e2e_latency.py")
        rules = scaled(load_config(DEFAULT_CONFIG), speed)
    except (ValueError, ConfigError) as exc:
        parser.error(str(exc))
    floors = alert_floors(rules, speed)
    workdir = Path(tempfile.mkdtemp(prefix="gpuhealth-bench-e2e-"))
    print(
        f"{len(scenario.timeline)} faults ({args.per_kind} of each of {len(KINDS)} kinds) on "
        f"{scenario.gpu_count()} GPUs at {speed:g}x, "
        f"about {expected_wall_seconds(scenario, rules, speed):.0f} s; "
        f"breaker and bucket raised for the run ({RESPONDER_OVERRIDES}); files in {workdir}",
        flush=True,
    )
    labels = Journal(scenario.name, scenario.description, speed, devices_of(scenario))
    started = time.monotonic()

    def progress(entry: Entry) -> None:
        # One line per fault and per enforcement: enough to follow a few minutes' run.
        if entry.kind is Kind.FAULT or (entry.kind is Kind.ENFORCED and entry.what == "quarantine"):
            print(f"[{time.monotonic() - started:6.1f}s] {narrate(labels, entry)}", flush=True)

    settings = DemoSettings(speed=speed, lead_in_seconds=lead_in(rules))
    outcome = run_demo(scenario, rules, settings, workdir, sys.stdout, on_entry=progress)
    journal = outcome.journal
    summary = summarize(journal, floors=floors)
    write_text(summary, outcome.verdict, sys.stdout)
    print_table(figures(summary, speed), speed, journal.resolution_seconds)
    report = workdir / "report.html"
    write_html(report, journal, summary, outcome.verdict)
    print(f"journal: {outcome.journal_path}; report: {report}")


def lead_in(rules: RuleSettings) -> float:
    """Wall seconds of healthy fleet before the first fault: start-up, then one event window.

    The NVML event alerts count an increase only where the device's NVML readings existed one
    `event_window` earlier (so an exporter's first scrape of an old counter is no event): a
    fault sooner after the exporters start is seen by the kubelet path alone, which would
    measure the warm-up, not the pipeline.
    """
    return START_UP + rules.device.event_window.seconds


def expected_wall_seconds(scenario: Scenario, rules: RuleSettings, speed: float) -> float:
    """Wall seconds of the run: lead-in, the timeline to its last fault's end, the settle time."""
    end = max(f.at + (f.duration or 0.0) for f in scenario.timeline)
    return lead_in(rules) + (end + SETTLE) / speed
