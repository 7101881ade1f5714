"""End to end: a short seeded chaos run through the whole loop, with every must-be-0 at 0.

Aspects: the small scenario beside this file (a fatal XID under a checkpointed job, a short
Unknown, an application XID) runs through the real pipeline of `gpuhealth demo` (simulated
cluster, exporters, Prometheus, Alertmanager, two enforcing responder replicas) while a fixed
seed injects API faults at the simulated apiserver (503, 409 on conditional writes, 429,
dropped watches, 410 on resume), kills the responder leader, duplicates and reorders webhook
deliveries and steps the cluster's clock; the run injects every planned kind, counted where
it happened (each API kind met requests, the kill and the clock step done once each, a
duplicated and a late webhook delivery forwarded), and nothing unplanned, and ends with no
action done twice, no warranted quarantine lost, no unwarranted action, and a time to
converge. `docs/reliability.md` holds the longer runs.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from demo.chaos import run_once, write_results
from demo.chaos_plan import ChaosSettings, parse_kinds, plan
from rules.render import DEFAULT_CONFIG, load_config, scaled
from simulator.scenario import resolve

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIO = Path(__file__).with_name("chaos-scenario.yaml")
SEED = 3
SPEED = 10.0
FAULTS = "api-503,api-409,api-429,api-watch-drop,api-410,kill-responder-leader,webhook,clock"


def test_a_short_seeded_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    scenario = resolve(SCENARIO)
    kinds, settings = parse_kinds(FAULTS), ChaosSettings(api_probability=0.3)
    chaos = plan(scenario, SEED, kinds, settings)  # what run_once plans from the same inputs
    out = io.StringIO()
    assessment = run_once(
        scenario,
        scaled(load_config(DEFAULT_CONFIG), SPEED),
        SPEED,
        SEED,
        kinds,
        settings,
        tmp_path / "run",
        out,
        "ci",
    )
    table = io.StringIO()
    write_results([(SEED, assessment)], table)
    report = f"{table.getvalue()}\n--- progress ---\n{out.getvalue()}"
    assert assessment.errors == (), report
    # What was planned happened, kind by kind, and nothing else was injected.
    assert sorted(assessment.injected) == sorted(kinds), report
    assert chaos.shortfalls(assessment.injected) == [], report
    assert assessment.injected["kill-responder-leader"] == assessment.injected["clock-jump"] == 1, report
    assert assessment.duplicates == (), report
    assert assessment.lost == (), report
    assert assessment.unwarranted == (), report
    assert assessment.expectation_failures == (), report
    assert not assessment.failed
    assert assessment.converged_after is not None, report
