"""Every built-in scenario, end to end: the scenario's own `expect:` section is the test.

Aspects covered, with every part real except the cluster (simulated): each demo-sized built-in
runs through `demo.pipeline.run_demo` (the simulated cluster, node-mode exporters, a real
Prometheus with the shipped rules, a real Alertmanager with the shipped routing, or an HA pair,
and enforcing responder replicas) at the speed its `demo:` section gives; the run breaks no
safety invariant (`demo.safety`) and meets every expectation its file states
(`demo.expectations`). A scenario file of one's own is checked the same way: an expectation
the run does not meet comes back as a failure line, not a pass.

`closed-loop`, the default scenario, runs in tests/demo/test_demo_run.py through `gpuhealth
demo`, whose exit status includes its expectations. `fleet-10k` is the cluster-mode scale
path: its expectations are checked by `gpuhealth demo --scenario fleet-10k` on a large
machine, not here (10,000 simulated nodes do not fit the suite's budget on two cores). Every
other built-in runs at 20x, a few minutes of simulated time each.

The replay engine reaches the records a run reached (issue 25: the replay cannot drift from the
product): the runs of `PARITY` are played again through `responder.replay.engine.replay_recorded`
from what they recorded (`demo.replayed`: the deliveries the responders received, their checks'
verdicts, the faults' health readings, the pods holding each device) with the configuration the
responders ran with, and each device's record must reach the same action, reason, sequence of
phases, final phase, episode, attempt and failures. Left out, each for its reason:
- times: the run's reconciler passes every few wall seconds, and leaves a record that asked for
  nothing for up to 30 wall seconds (`max_recheck_seconds`, unscaled: 10 simulated minutes at
  20x); the replay steps a record the moment anything it reads changes. In `idle-relapse` the
  replay fails the stability window on the relapse's Unhealthy reading, the run on the alert that
  fires for it a little later (the next thing that woke its reconciler): the same failed attempt;
- the moves (a record's migrations, evictions, kept pods): the replay knows no pods, it moves one
  job per device; the run moves the jobs its pods belong to;
- what enforces a record and who holds it (`status.enforced`, the Held condition): the replay
  applies enforcement as an effect, it has no DeviceTaintRule, node annotation or holder pod;
- the alerts' identities (`spec.sourceAlerts`, `status.processedKeys`): the replay rebuilds each
  episode from the deliveries, not from Alertmanager's `startsAt`.
The parity is judged in the scenario's own test, on its run: it adds no run.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from backtest.inputs import replay_settings
from demo.pipeline import DemoSettings, Outcome, expected_wall_seconds, run_demo
from demo.replayed import differences, recorded, replay_reached, run_reached
from demo.staging import staging
from responder.replay.engine import replay_recorded
from rules.render import DEFAULT_CONFIG, load_config, scaled
from simulator.scenario import Scenario, builtin_names, from_dict, resolve

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_DEMO_GPUS = 256
"""Built-ins above this are scale tests (one cluster-mode exporter), not end-to-end stories."""
START_UP_SECONDS = 60.0
"""Wall seconds a run may spend starting its processes beyond the pipeline's own estimate."""


RUN_ELSEWHERE = frozenset({"closed-loop"})
"""The default scenario of `gpuhealth demo`: tests/demo/test_demo_run.py runs it through the
command, whose exit status includes its expectations (and checks its story in detail)."""


PARITY = {
    "idle-relapse": frozenset({"Pending", "Quarantined", "Probing", "Canary", "Stabilizing"}),
    "unrecoverable": frozenset({"Pending", "Quarantined"}),
}
"""Runs the replay is checked against, with the phases every record of the run goes through (the
evidence that the comparison has something to compare): the release ladder walked and failed in
its stability window; quarantines whose work cannot move."""


def demo_sized() -> list[str]:
    return [
        name
        for name in builtin_names()
        if name not in RUN_ELSEWHERE and resolve(name).gpu_count() <= MAX_DEMO_GPUS
    ]


def run(scenario: Scenario, workdir: Path) -> tuple[Outcome, str]:
    """`scenario` through the whole loop at its own speed; the outcome and the narration."""
    stage = staging(scenario.demo)
    speed = stage.speed or DemoSettings.speed
    rules = scaled(load_config(DEFAULT_CONFIG), speed)
    out = io.StringIO()
    outcome = run_demo(scenario, rules, DemoSettings(speed=speed), workdir, out)
    return outcome, out.getvalue()


def deadline(scenario: Scenario) -> float:
    """Wall seconds a run of `scenario` may take before the test is stopped: twice the estimate."""
    stage = staging(scenario.demo)
    settings = DemoSettings(speed=stage.speed or DemoSettings.speed)
    return 2 * expected_wall_seconds(scenario, settings, stage) + START_UP_SECONDS


def explain(outcome: Outcome, narration: str) -> str:
    lines = [*outcome.verdict.violations, *outcome.expectation_failures]
    tail = "\n".join(narration.splitlines()[-40:])
    return "\n".join([*lines, f"journal: {outcome.journal_path}", "narration (last lines):", tail])


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.timeout(deadline(resolve(n)))) for n in demo_sized()]
)
def test_builtin_scenario_meets_its_expected_outcome(name: str, tmp_path: Path) -> None:
    assert resolve(name).expect, f"{name} states no expected outcome"
    outcome, narration = run(resolve(name), tmp_path)
    assert outcome.verdict.violations == (), explain(outcome, narration)
    assert outcome.expectation_failures == [], explain(outcome, narration)
    if name in PARITY:
        assert_the_replay_reaches_the_records_the_run_reached(name, outcome, narration)


# A one-node fleet with nothing wrong, and an expectation nothing can meet.
UNMET = {
    "name": "unmet-expectation",
    "description": "a healthy GPU; the file expects the breaker to trip and a quarantine",
    "fleet": [{"name": "gpu-dra", "count": 1, "gpusPerNode": 2, "path": "dra"}],
    "demo": {"speed": 20, "settle": "1m"},
    "expect": {
        "breaker": "tripped",
        "quarantined": [{"node": "gpu-dra-0", "gpu": 1}],
        "enforcedDevices": 0,
    },
}


@pytest.mark.timeout(deadline(from_dict(UNMET)))
def test_a_scenario_file_whose_outcome_differs_fails_with_one_line_per_expectation(tmp_path: Path) -> None:
    outcome, narration = run(from_dict(UNMET, "unmet.yaml"), tmp_path)
    assert outcome.verdict.violations == (), explain(outcome, narration)
    assert outcome.expectation_failures == [
        "quarantined gpu-dra-0/gpu-1: never reached Quarantined; no record at all",
        "quarantined gpu-dra-0/gpu-1: never enforced (no DeviceTaintRule or node annotation seen)",
        "breaker: expected to trip, never did",
    ], explain(outcome, narration)


def test_the_parity_runs_are_built_in_demo_sized_scenarios() -> None:
    assert set(PARITY) <= set(demo_sized())


def assert_the_replay_reaches_the_records_the_run_reached(
    name: str, outcome: Outcome, narration: str
) -> None:
    records = json.loads((outcome.workdir / "records.json").read_text())
    reached = run_reached(outcome.journal, records)
    assert reached, explain(outcome, narration)
    for (node, device), record in reached.items():
        assert PARITY[name] <= set(record.phases), f"{node}/{device}: {record}"
    inputs = recorded(outcome.journal)

    replayed = replay_recorded(
        inputs.timeline,
        inputs.deliveries,
        inputs.verdicts,
        replay_settings(outcome.workdir / "responder-config.yaml"),
        inputs.holders,
    )

    assert differences(reached, replay_reached(replayed)) == [], f"journal: {outcome.journal_path}"
