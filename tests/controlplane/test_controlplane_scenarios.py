"""Built-in scenarios end to end on the real control plane: their own `expect:` sections are the test.

Aspects covered: the whole closed loop (`demo.pipeline.run_demo` with `control_plane="real"`)
with etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from upstream, the
scenario's nodes as node agents over HTTP, real Prometheus and Alertmanager, and two enforcing
responder replicas: the real kube-scheduler places the workloads (their Jobs and Deployments run
by the real controllers), allocates no quarantined DRA device while our DeviceTaintRule stands
and calls the responders' extender for device-plugin nodes; evictions go through the real
eviction API; each run breaks no safety invariant and meets every expectation its file states.
`closed-loop`, `dra-and-device-plugin`, `leader-kill`, `multi-gpu-topology`, `idle-relapse`,
`dra-extended-resource`, `nvidia-dra-driver` and `mig-dra` on 1.37 (DeviceTaintRule v1; in
`dra-extended-resource` the real kube-scheduler serves pods' `nvidia.com/gpu` through the
DeviceClass's extendedResourceName, KEP-5004, GA and on in 1.37: it writes the special claim and
`status.extendedResourceClaimStatus`); `closed-loop` on 1.36 too (v1beta2 behind its feature
gate). Not `gradual-return`: its story needs the opted-in workload on the GPU that fails, and on
a real control plane which of a node's GPUs a pod gets is the kubelet's and driver's choice (the
scheduler picks only the node), so the failing GPU may hold another workload; the opt-in
itself is held to the real API server by `test_controlplane_dra.py`.
`idle-relapse` holds a device quarantined through an idle relapse on both paths: its
device-plugin node agent serves the kubelet's pod-resources view, which the demo's node
exporter reads. `nvidia-dra-driver` runs the NVIDIA DRA driver's profile as node agents: its
slices and taints written to the real API server, no health in pod status. `mig-dra` runs it with
MIG cards: the real API server takes the slice of MIG devices and a DeviceTaintRule per MIG
device, and the real kube-scheduler allocates the check's claim of all of a card's MIG devices
(DeviceClass `mig.nvidia.com`, `allocationMode: All`, CEL on `parentUUID`).
`device-plugin-churn` holds three device-plugin cards (a whole GPU, a time-sliced one, a MIG
card) with gpuhealth's holder pods through the real API server and the real controllers' churn
(a Job completing, a Deployment scaled and replaced, holders deleted by hand, the plugin
restarting): no other pod starts on a held card, each is released after its checks.

Time: the fleet, the rules and the responders run at the scenario's own speed; the control
plane's own timers (backoffs, grace periods) run in real time (`docs/simulator.md`, "Time").
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from demo.pipeline import DemoSettings, Outcome, expected_wall_seconds, run_demo
from demo.staging import staging
from rules.render import DEFAULT_CONFIG, load_config, scaled
from simulator.scenario import resolve
from tests.controlplane.conftest import require_builds

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

START_UP_SECONDS = 120.0
"""Wall seconds a run may spend starting the control plane and its processes beyond its estimate."""

EXTENDER_PLACES = {"dra-and-device-plugin", "idle-relapse", "device-plugin-churn"}
WEB_CONFIG = {"dra-and-device-plugin"}
"""Runs with every exporter and responder behind TLS and basic auth (`demo --web-config`): scraped
over HTTPS with a password, the webhook and the real kube-scheduler's extender calls reaching the
responders over HTTPS. The other runs, and tests/e2e/test_web_config_demo.py on the simulated
cluster, are the other way round."""
"""Scenarios that move a device-plugin pod while the responders run (its replacement is filtered)."""

RUNS = [
    ("closed-loop", "1.37"),
    ("dra-and-device-plugin", "1.37"),
    ("leader-kill", "1.37"),
    ("multi-gpu-topology", "1.37"),
    ("idle-relapse", "1.37"),
    ("dra-extended-resource", "1.37"),
    ("nvidia-dra-driver", "1.37"),
    ("mig-dra", "1.37"),
    ("device-plugin-churn", "1.37"),
    ("closed-loop", "1.36"),
]


CONTROLLER_BACKOFF_WALL_SECONDS = 45.0
"""Wall seconds added to each run's settle: the real Job controller re-creates an evicted Job's
pods after its pod failure back-off (10 s doubling per failed pod, in real time, not the
scenario's), and a move succeeds only once those replacements run on healthy devices."""


def settings(name: str, kubernetes: str) -> DemoSettings:
    stage = staging(resolve(name).demo)
    speed = stage.speed or DemoSettings.speed
    return DemoSettings(
        speed=speed,
        control_plane="real",
        kubernetes_version=kubernetes,
        settle_seconds=stage.settle + CONTROLLER_BACKOFF_WALL_SECONDS * speed,
        web_config=name in WEB_CONFIG,
    )


def deadline(name: str, kubernetes: str) -> float:
    scenario = resolve(name)
    wall = expected_wall_seconds(scenario, settings(name, kubernetes), staging(scenario.demo))
    return 2 * wall + START_UP_SECONDS


def explain(outcome: Outcome, narration: str) -> str:
    lines = [*outcome.verdict.violations, *outcome.expectation_failures]
    tail = "\n".join(narration.splitlines()[-40:])
    return "\n".join([*lines, f"journal: {outcome.journal_path}", "narration (last lines):", tail])


@pytest.mark.parametrize(
    ("name", "kubernetes"),
    [pytest.param(n, k, id=f"{n}-{k}", marks=pytest.mark.timeout(deadline(n, k))) for n, k in RUNS],
)
def test_builtin_scenario_meets_its_expected_outcome_on_the_real_control_plane(
    name: str, kubernetes: str, tmp_path: Path
) -> None:
    require_builds(kubernetes)
    scenario = resolve(name)
    run = settings(name, kubernetes)
    rules = scaled(load_config(DEFAULT_CONFIG), run.speed)
    out = io.StringIO()
    outcome = run_demo(scenario, rules, run, tmp_path, out)
    narration = out.getvalue()
    assert "real control plane" in narration
    assert outcome.journal.entries, "the run journaled nothing"
    assert not outcome.verdict.violations and not outcome.expectation_failures, explain(outcome, narration)
    if name in WEB_CONFIG:
        scrape = (tmp_path / "prometheus" / "prometheus.yml").read_text()
        assert "scheme: https" in scrape and "password_file" in scrape
    if name in EXTENDER_PLACES:
        # The moved device-plugin pod was placed by the real kube-scheduler, which asked the
        # responders' extender (the shipped KubeSchedulerConfiguration) and got an answer.
        assert outcome.extender_replies.get(200, 0) > 0, outcome.extender_replies
