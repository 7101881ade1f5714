"""The business SLO in a whole closed-loop run: the workloads' own errors, beside device health.

One device-plugin node, a two-replica serving Deployment that checkpoints. A GPU that holds one
of its pods reports Unhealthy from 30 s on, for good: the pod on it fails its requests
(the simulator's workloads export their own request and error counters, scraped as job
`workloads`), the responder quarantines the device and moves the pod, and the replacement
serves without errors on a healthy GPU. Read from the run's Prometheus through the shipped
recording rules (gpuhealth-workload.records): the failed device's holders' error ratio rises
above 0 while the pod is on it; once the pod has moved, no pod fails a request any more, the
fleet's workloads serve, and the failed device holds no workload. The safety verdict holds.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from demo.pipeline import Controls, DemoSettings, Running, expected_wall_seconds, run_demo
from demo.staging import staging
from rules.render import DEFAULT_CONFIG, load_config, scaled
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import from_dict

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAILED = gpu_uuid("gpu-dp-0", 1)
SCENARIO: dict[str, Any] = {
    "name": "business-slo",
    "description": "a serving pod's GPU fails: its requests fail until it is moved",
    "fleet": [{"name": "gpu-dp", "count": 1, "gpusPerNode": 3, "path": "device-plugin"}],
    "workloads": [
        {"name": "serve", "namespace": "inference", "kind": "Deployment", "replicas": 2,
         "gpusPerPod": 1, "path": "device-plugin", "checkpoint": "annotation", "topology": "shardable"},
    ],
    "timeline": [
        {"at": "30s", "fault": "device-unhealthy", "device": {"node": "gpu-dp-0", "gpu": 1},
         "message": "XID 79: GPU has fallen off the bus"},
    ],
    "demo": {"speed": 20, "settle": "5m"},
}  # fmt: skip


def value(running: Running, expr: str) -> float | None:
    return running.prometheus.value(expr)


def test_a_failing_gpu_fails_its_pods_requests_until_the_pod_moves(tmp_path: Path) -> None:
    scenario = from_dict(SCENARIO)
    speed = 20.0
    settings = DemoSettings(speed=speed)
    assert expected_wall_seconds(scenario, settings, staging(scenario.demo)) < 120
    seen: dict[str, float] = {"failed_device_ratio": 0.0}
    last: dict[str, float | None] = {}

    def look(running: Running) -> None:
        ratio = value(running, f'node_device:workload_error_ratio:rate5m{{device="{FAILED}"}}')
        if ratio is not None:
            seen["failed_device_ratio"] = max(seen["failed_device_ratio"], ratio)
        # Errors now (the last few seconds of wall time), requests now, holders of the failed GPU.
        last["errors"] = value(running, 'sum(rate(workload_request_errors_total{job="workloads"}[5s]))')
        last["requests"] = value(running, 'sum(rate(workload_requests_total{job="workloads"}[5s]))')
        last["failed_device_held"] = value(
            running, f'count(node_device:workload_error_ratio:rate5m{{device="{FAILED}"}})'
        )

    rules = scaled(load_config(DEFAULT_CONFIG), speed)
    outcome = run_demo(scenario, rules, settings, tmp_path, io.StringIO(), controls=Controls(on_tick=look))
    assert outcome.verdict.violations == ()
    # Positive evidence first: the pod on the failing GPU failed requests while it was there.
    assert seen["failed_device_ratio"] > 0, f"no errors seen on {FAILED}; journal: {outcome.journal_path}"
    # Then, at the end: the workloads serve, none fails, and the failed GPU holds no workload.
    assert (last["requests"] or 0) > 0, last
    assert last["errors"] == 0, last
    assert last["failed_device_held"] is None, last
