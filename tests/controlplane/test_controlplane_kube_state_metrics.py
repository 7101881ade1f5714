"""kube-state-metrics against the real apiserver (1.37): the pod series the workload layers read.

The judge of the simulated cluster, which the end-to-end test of the layers runs kube-state-metrics
against (tests/e2e/test_workload_layers.py). Aspects: kube-state-metrics 2.20 (`--resources=pods,nodes`,
the allowlist of `tests.support.kube_state_metrics`) lists and watches the real apiserver; a pod
asking for more `nvidia.com/gpu` than any node has is left unscheduled by the real kube-scheduler
and reads `kube_pod_status_unschedulable` 1 with its GPU request in
`kube_pod_container_resource_requests{resource="nvidia_com_gpu"}` (the allocation layer); a pod
bound to a node and run as its kubelet would (Running, Ready) reads phase Running and
`kube_pod_container_status_ready` 1 (the readiness layer); every series the rules read comes with
exactly the labels declared for it.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuhealth.kube.resources import POD
from gpuhealth.testing.loopback import wait_until
from simulator.controlplane import ControlPlane
from tests.support import kube_state_metrics
from tests.support.controlplane import IMAGE, admin, namespace_ready, ready_node, run_as_kubelet

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

TENANT = "tenant-ksm"
NODE = "ksm-node"


def samples(target: str) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def of_pod(
    found: list[tuple[str, dict[str, str], float]], name: str, pod: str
) -> list[tuple[dict[str, str], float]]:
    return [(labels, value) for n, labels, value in found if n == name and labels.get("pod") == pod]


@pytest.mark.timeout(180)
def test_the_layers_series_come_from_the_real_apiserver(plane: ControlPlane, tmp_path: Path) -> None:
    client = admin(plane)
    namespace_ready(client, TENANT)
    ready_node(client, NODE)
    container = {"name": "work", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "4"}}}
    client.create(
        POD,
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": TENANT},
         "spec": {"automountServiceAccountToken": False, "containers": [container]}},
    )  # fmt: skip
    running = client.create(
        POD,
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "serve", "namespace": TENANT},
         "spec": {"nodeName": NODE, "automountServiceAccountToken": False,
                  "containers": [{"name": "work", "image": IMAGE}]}},
    )  # fmt: skip
    run_as_kubelet(client, running)

    with kube_state_metrics.running(plane.kubeconfig_path, tmp_path / "kube-state-metrics.log") as target:

        def seen() -> list[tuple[str, dict[str, str], float]] | None:
            found = samples(target)
            unscheduled = of_pod(found, "kube_pod_status_unschedulable", "big")
            ready = of_pod(found, "kube_pod_container_status_ready", "serve")
            return found if unscheduled and ready else None

        found = wait_until("kube-state-metrics to report both pods", seen, timeout=60, interval=1)

    assert [v for _labels, v in of_pod(found, "kube_pod_status_unschedulable", "big")] == [1.0]
    requests = of_pod(found, "kube_pod_container_resource_requests", "big")
    assert [
        (labels["resource"], labels["unit"], v) for labels, v in requests if "gpu" in labels["resource"]
    ] == [("nvidia_com_gpu", "integer", 4.0)]
    assert [v for _labels, v in of_pod(found, "kube_pod_container_status_ready", "serve")] == [1.0]
    phases = {labels["phase"]: v for labels, v in of_pod(found, "kube_pod_status_phase", "serve")}
    assert phases["Running"] == 1.0
    for name, labels, _value in found:
        if name in kube_state_metrics.SERIES and labels.get("namespace") == TENANT:
            assert set(labels) == kube_state_metrics.SERIES[name], name
