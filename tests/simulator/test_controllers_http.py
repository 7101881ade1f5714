"""The controllers through the official client against a running simulated cluster.

Aspects: a drain of a scenario Deployment under `maxUnavailable: 1` gets one eviction and then
429 TooManyRequests with the real message and a DisruptionBudget cause, and the PDB's status
says why (expected 6 from the Deployment's scale); a Deployment created through apps/v1 gets
its ReplicaSet, pods and status; deleting it in the foreground keeps it (deletionTimestamp,
foregroundDeletion) until its dependents are gone; a deleted namespace is Terminating, refuses
new content with 403 and goes once empty.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuhealth.kube.config import api_client
from simulator.testing import ClusterHandle, running_cluster

pytestmark = pytest.mark.integration

SCENARIO = {
    "fleet": [{"name": "gpu", "count": 6, "gpusPerNode": 2, "path": "device-plugin"}],
    "workloads": [{"name": "infer", "replicas": 6, "gpusPerPod": 2}],
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterHandle]:
    with running_cluster(SCENARIO) as handle:
        yield handle


@pytest.fixture
def api(cluster: ClusterHandle) -> Iterator[client.ApiClient]:
    with api_client(str(cluster.kubeconfig_path)) as api:
        yield api


def _until(check: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("not reached before the deadline")


def test_a_drain_stops_at_the_budget(api: client.ApiClient) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget(
        "default",
        {
            "metadata": {"name": "infer"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "infer"}}},
        },
    )

    def expected() -> int:
        status = policy.read_namespaced_pod_disruption_budget("infer", "default").status
        return (status.expected_pods or 0) if status is not None else 0

    _until(lambda: expected() == 6)
    names = [p.metadata.name for p in core.list_namespaced_pod("default", label_selector="app=infer").items]
    answers = []
    for name in names:
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace="default"))
        try:
            core.create_namespaced_pod_eviction(name, "default", body)
            answers.append(201)
        except ApiException as exc:
            answers.append(exc.status)
            status = json.loads(exc.body)
            assert status["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
            assert status["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert answers == [201] + [429] * 5
    pdb = policy.read_namespaced_pod_disruption_budget("infer", "default").status
    assert (pdb.expected_pods, pdb.desired_healthy, pdb.disruptions_allowed) == (6, 5, 0)


def test_a_deployment_through_apps_v1(api: client.ApiClient) -> None:
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.create_namespaced_deployment(
        "default",
        {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "main", "image": "registry.example/web:1"}]},
                },
            },
        },
    )
    _until(lambda: len(core.list_namespaced_pod("default", label_selector="app=web").items) == 2)
    (rs,) = apps.list_namespaced_replica_set("default", label_selector="app=web").items
    assert rs.metadata.owner_references[0].kind == "Deployment"
    _until(lambda: (apps.read_namespaced_deployment("web", "default").status.observed_generation or 0) == 1)
    apps.delete_namespaced_deployment("web", "default", propagation_policy="Foreground")
    _until(lambda: not apps.list_namespaced_deployment("default", field_selector="metadata.name=web").items)
    assert core.list_namespaced_pod("default", label_selector="app=web").items == []


def test_a_namespace_terminates(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "team-a"}})
    # A finalizer holds one object, and with it the namespace, in Terminating.
    core.create_namespaced_config_map(
        "team-a", {"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}
    )
    core.delete_namespace("team-a")
    assert core.read_namespace("team-a").status.phase == "Terminating"
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("team-a", {"metadata": {"name": "late"}})
    assert exc.value.status == 403
    assert json.loads(exc.value.body)["message"] == (
        'configmaps "late" is forbidden: '
        "unable to create new content in namespace team-a because it is being terminated"
    )
    with pytest.raises(ApiException) as exc:
        core.create_namespace({"metadata": {"name": "team-a"}})
    assert exc.value.status == 409
    core.patch_namespaced_config_map("held", "team-a", {"metadata": {"finalizers": None}})
    _until(lambda: "team-a" not in {n.metadata.name for n in core.list_namespace().items})
