"""A GPU workload's layers, read by a real Prometheus from kube-state-metrics and gpuhealth.

Aspects covered: kube-state-metrics 2.20 (built from its Go module, `tools/upstream`) lists and
watches the simulated cluster's pods and nodes and serves the pod series the workload-layer
rules read (`tests.support.kube_state_metrics`); Prometheus scrapes it beside a cluster-mode
exporter and the simulated workloads' own counters, and evaluates the shipped rules (durations
shrunk to seconds). One device-plugin node with three GPUs, each layer failing alone on its own
pod, and only that layer's alert firing:
- `inference/serve` (one GPU) runs ready, serves, and its layers read 0: allocated, on Healthy
  devices, every container ready, no errors (kube-state-metrics' readiness joined to the device
  it holds through gpu_device_allocation_info);
- `training/big`, created through the API, asks for four GPUs that no node has: the allocation
  layer alone fails, and GPUWorkloadUnallocated (owner platform) fires for it alone;
- `ml/stuck`, created through the API, runs on a Healthy GPU until its containers fail their
  probes (the simulated kubelet restarts them with back-off, never Ready): the readiness layer
  alone fails, and GPUWorkloadNotReady (owner tenant) fires for it alone;
- `shop/buggy` (one GPU, a bad release failing half its requests) is ready on a Healthy GPU: the
  business SLO alone fails, and GPUWorkloadErrorRatioHigh (owner tenant) fires for it alone;
- then the GPU `serve` holds fails: the device layer fails, GPUDeviceUnhealthy fires, and `serve`,
  now failing its requests on a failed device, raises no alert of its own: one failure, one
  layer's alert.
The same, rule by rule and at each `for:` boundary: rules/tests/workload-layers.yaml.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.testing.loopback import Prometheus, ScrapeJob, run_prometheus, wait_until
from rules.render import DEFAULT_CONFIG, parse_config, write_files
from rules.render import render as render_rules
from simulator.runner import WORKLOAD_METRICS_PATH
from simulator.traffic import JOB as WORKLOADS_JOB
from tests.e2e.test_pipeline_e2e import FAST_RULES
from tests.support import kube_state_metrics
from tests.support.exporters import cluster_exporter

pytestmark = [pytest.mark.integration]

SPEED = 10.0
FAST_LAYERS = {"unallocated_for": "3s", "not_ready_for": "3s", "error_ratio_for": "3s"}
SCENARIO: dict[str, Any] = {
    "name": "workload-layers",
    "description": "a serving pod and a buggy one on a 3-GPU node",
    "fleet": [{"name": "gpu-dp", "count": 1, "gpusPerNode": 3, "path": "device-plugin"}],
    "workloads": [
        {"name": "serve", "namespace": "inference", "kind": "Deployment", "replicas": 1,
         "gpusPerPod": 1, "path": "device-plugin"},
        # A bad release: half its requests fail, on a healthy GPU (simulator/traffic.py).
        {"name": "buggy", "namespace": "shop", "kind": "Deployment", "replicas": 1,
         "gpusPerPod": 1, "path": "device-plugin", "errorRatio": 0.5},
    ],
    "timeline": [],
}  # fmt: skip
EXPECTED = {
    ("GPUWorkloadUnallocated", "training"),
    ("GPUWorkloadNotReady", "ml"),
    ("GPUWorkloadErrorRatioHigh", "shop"),
}
"""The workload alerts of the run, by namespace: one per layer that fails alone."""


def gpu_pod(namespace: str, name: str, gpus: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)}
    container = {"name": "main", "image": f"registry.example/{name}:1", "resources": {"limits": limits}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [container]},
    }


API_PODS = (gpu_pod("training", "big", 4), gpu_pod("ml", "stuck", 1))
"""Created through the API as a tenant would: `big` asks for four GPUs where no node has more than
three (a scenario refuses what cannot fit), `stuck` for one (its containers are then made to fail
their probes)."""


def create_pods(kubeconfig: Path) -> None:
    from gpuhealth.kube.client import KubeClient
    from gpuhealth.kube.config import api_client
    from gpuhealth.kube.resources import NAMESPACE, POD
    from gpuhealth.kube.transport import KubeTransport

    kube = KubeClient(KubeTransport(api_client(str(kubeconfig))))
    try:
        for pod in API_PODS:
            namespace = pod["metadata"]["namespace"]
            kube.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
            kube.create(POD, pod)
    finally:
        kube.close()


def rule_files(workdir: Path) -> list[Path]:
    base = yaml.safe_load(DEFAULT_CONFIG.read_text())
    for section, values in {**FAST_RULES, "layers": FAST_LAYERS}.items():
        base[section] = {**base[section], **values} if isinstance(values, dict) else values
    written = write_files(render_rules(parse_config(base)), workdir / "rules")
    return [p for p in written if p.parent.name == "prometheus"]


def one(prometheus: Prometheus, expr: str) -> float | None:
    return prometheus.value(expr)


def firing(prometheus: Prometheus, alertname: str) -> list[dict[str, str]]:
    return [a["labels"] for a in prometheus.alerts("firing") if a["labels"].get("alertname") == alertname]


def workload_alerts(prometheus: Prometheus, state: str = ".+") -> set[tuple[str, str]]:
    """(alertname, namespace) of every GPUWorkload* alert in `state` (default: pending or firing)."""
    return {
        (a["metric"]["alertname"], a["metric"].get("namespace", ""))
        for a in prometheus.query(f'ALERTS{{alertname=~"GPUWorkload.*", alertstate=~"{state}"}}')
    }


@pytest.mark.timeout(240)
def test_each_layer_failing_alone_raises_only_its_own_alert(tmp_path: Path) -> None:
    with ExitStack() as stack:
        cluster, exporter_port, uuids = stack.enter_context(
            cluster_exporter(SCENARIO, "gpu-dp-0", 3, tmp_path, speed=SPEED)
        )
        ksm = stack.enter_context(
            kube_state_metrics.running(cluster.kubeconfig_path, tmp_path / "kube-state-metrics.log")
        )
        jobs = [
            ScrapeJob("gpuhealth-exporter", [f"127.0.0.1:{exporter_port}"]),
            ScrapeJob(kube_state_metrics.JOB, [ksm]),
            ScrapeJob(
                WORKLOADS_JOB, [cluster.url.removeprefix("http://")], metrics_path=WORKLOAD_METRICS_PATH
            ),
        ]
        prometheus = stack.enter_context(
            run_prometheus(tmp_path / "prometheus", jobs, rule_files=rule_files(tmp_path))
        )
        serve = '{namespace="inference"}'

        # Healthy first: every layer of the serving pod reads, and reads fine.
        def serving_fine() -> bool:
            return (
                one(prometheus, f"namespace_pod:gpu_workload_unallocated:bool{serve}") == 0
                and one(prometheus, f"namespace_pod:gpu_workload_devices_not_healthy:count{serve}") == 0
                and one(prometheus, f"namespace_pod:gpu_workload_containers_unready:count{serve}") == 0
                and one(prometheus, f"namespace_pod:gpu_workload_error_ratio:rate5m{serve}") == 0
                and one(prometheus, "sum(node_device:gpu_workload_containers_unready:sum)") == 0
            )

        wait_until("the serving pod's four layers, all fine", serving_fine, timeout=60, interval=1)

        create_pods(cluster.kubeconfig_path)
        ml = '{namespace="ml"}'
        wait_until(
            "ml/stuck running ready on a GPU",
            lambda: (
                one(prometheus, f"kube_pod_container_status_ready{ml}") == 1
                and prometheus.query(f"gpu_device_allocation_info{ml}")
            ),
            timeout=60,
            interval=1,
        )
        # The simulated kubelet's pod worker: each start of the pod's containers now fails its
        # startup probe, and they restart with back-off, never Ready (a model that no longer loads).
        cluster.call(lambda c: c.fleet.pod_runner.fail("ml/stuck", True))

        # Allocation alone (big), readiness alone (stuck) and the business SLO alone (buggy):
        # each its own layer's alert, and nothing else pending or firing.
        wait_until(
            "GPUWorkloadUnallocated for training/big, GPUWorkloadNotReady for ml/stuck and "
            "GPUWorkloadErrorRatioHigh for shop/buggy",
            lambda: workload_alerts(prometheus) == EXPECTED == workload_alerts(prometheus, "firing"),
            timeout=60,
            interval=1,
        )
        owners = {
            (labels["alertname"], labels["namespace"]): (labels["owner"], labels["layer"])
            for labels in (alert["labels"] for alert in prometheus.alerts("firing"))
            if labels["alertname"].startswith("GPUWorkload")
        }
        assert owners == {
            ("GPUWorkloadUnallocated", "training"): ("platform", "allocation"),
            ("GPUWorkloadNotReady", "ml"): ("tenant", "readiness"),
            ("GPUWorkloadErrorRatioHigh", "shop"): ("tenant", "slo"),
        }
        for healthy_gpu in (ml, '{namespace="shop"}'):
            assert one(prometheus, f"namespace_pod:gpu_workload_devices_not_healthy:count{healthy_gpu}") == 0
        assert one(prometheus, 'namespace_pod:gpu_workload_containers_unready:count{namespace="shop"}') == 0
        assert firing(prometheus, "GPUDeviceUnhealthy") == []

        # Device health alone: the serving pod's GPU fails, and the pod fails its requests on it.
        (held,) = prometheus.query(f"gpu_device_allocation_info{serve}")
        device = held["metric"]["device"]
        cluster.inject(
            {"fault": "device-unhealthy", "device": {"node": "gpu-dp-0", "gpu": uuids[device]},
             "message": "XID 79: GPU has fallen off the bus"}
        )  # fmt: skip
        wait_until(
            "GPUDeviceUnhealthy for the serving pod's GPU",
            lambda: [a.get("device") for a in firing(prometheus, "GPUDeviceUnhealthy")] == [device],
            timeout=60,
            interval=1,
        )
        # Positive evidence of what the SLO alert must not fire for: errors above its threshold.
        wait_until(
            "the serving pod failing its requests on the failed GPU",
            lambda: (
                (one(prometheus, f"namespace_pod:gpu_workload_error_ratio:rate5m{serve}") or 0) > 0.05
                and one(prometheus, f"namespace_pod:gpu_workload_devices_not_healthy:count{serve}") == 1
            ),
            timeout=60,
            interval=1,
        )
        held_since = time.monotonic()
        # Past the 3s `for` of the tenant alerts, several evaluations: the serving pod has no alert
        # of its own, not even a pending one, and the other layers' alerts stand as they were.
        while time.monotonic() - held_since < 8:
            assert prometheus.query('ALERTS{namespace="inference"}') == []
            assert workload_alerts(prometheus) == EXPECTED
            time.sleep(1)
