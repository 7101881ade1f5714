"""Server-side defaulting of API clients' writes, as the apiserver defaults them.

Aspects: a created pod gets the PodSpec defaults, container defaults (imagePullPolicy by tag,
termination message, requests from limits), the admission-set service account, priority,
preemption policy and the not-ready/unreachable tolerations (only when not already tolerated),
and status.qosClass (Guaranteed, Burstable, BestEffort); namespaces get their finalizer and
name label; Jobs get completions, parallelism, backoffLimit, completionMode, suspend and a
generated selector; Deployments, ReplicaSets and StatefulSets their own defaults (a missing
selector stays missing); custom resources their schema defaults; defaulting is idempotent; the
official client reads the defaults back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from gpuhealth.clock import ManualClock
from simulator.apiserver import defaults
from simulator.apiserver.store import Store


@pytest.fixture
def store() -> Store:
    return Store(ManualClock(), seed=1)


def _pod(**container: Any) -> dict[str, Any]:
    main = {"name": "main", "image": "registry.example/infer:1", **container}
    return {"metadata": {"name": "p"}, "spec": {"containers": [main]}}


def test_a_created_pod_gets_the_apiservers_defaults(store: Store) -> None:
    pod = store.create("pods", _pod(), namespace="default")
    spec = pod["spec"]
    assert {k: spec[k] for k in spec if k not in ("containers", "tolerations")} == {
        "restartPolicy": "Always",
        "dnsPolicy": "ClusterFirst",
        "schedulerName": "default-scheduler",
        "terminationGracePeriodSeconds": 30,
        "securityContext": {},
        "enableServiceLinks": True,
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "priority": 0,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    assert spec["containers"][0] == {
        "name": "main",
        "image": "registry.example/infer:1",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        "resources": {},
    }
    assert spec["tolerations"] == [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    ]
    assert pod["status"] == {"phase": "Pending", "qosClass": "BestEffort"}


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("nginx", "Always"),
        ("nginx:latest", "Always"),
        ("registry:5000/nginx", "Always"),
        ("nginx:1.27", "IfNotPresent"),
        ("nginx@sha256:abc", "IfNotPresent"),
    ],
)
def test_image_pull_policy_follows_the_tag(image: str, policy: str) -> None:
    assert defaults.image_pull_policy(image) == policy


def test_requests_default_from_limits_and_decide_the_qos_class(store: Store) -> None:
    limits = {"cpu": "1", "memory": "1Gi"}
    guaranteed = store.create("pods", _pod(resources={"limits": limits}), namespace="default")
    assert guaranteed["spec"]["containers"][0]["resources"]["requests"] == limits
    assert guaranteed["status"]["qosClass"] == "Guaranteed"
    assert defaults.qos_class({"containers": [{"resources": {"requests": {"cpu": "100m"}}}]}) == "Burstable"
    same = {"requests": {"cpu": "1000m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    assert defaults.qos_class({"containers": [{"resources": same}]}) == "Guaranteed"


def test_a_pod_that_tolerates_everything_gets_no_default_tolerations(store: Store) -> None:
    body = _pod()
    body["spec"]["tolerations"] = [{"operator": "Exists"}]
    assert store.create("pods", body, namespace="default")["spec"]["tolerations"] == [{"operator": "Exists"}]


def test_namespaces_get_their_finalizer_and_name_label(store: Store) -> None:
    ns = store.create("namespaces", {"metadata": {"name": "team-a"}})
    assert ns["spec"] == {"finalizers": ["kubernetes"]}
    assert ns["metadata"]["labels"] == {"kubernetes.io/metadata.name": "team-a"}
    assert store.get("namespaces", "default")["metadata"]["labels"] == {
        "kubernetes.io/metadata.name": "default"
    }


def test_jobs_get_their_defaults_and_a_generated_selector(store: Store) -> None:
    body = {
        "metadata": {"name": "train"},
        "spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "w", "image": "i:1"}]}}
        },
    }
    job = store.create("jobs.batch", body, namespace="default")
    uid = job["metadata"]["uid"]
    spec = job["spec"]
    assert {
        k: spec[k] for k in ("completions", "parallelism", "backoffLimit", "completionMode", "suspend")
    } == {
        "completions": 1,
        "parallelism": 1,
        "backoffLimit": 6,
        "completionMode": "NonIndexed",
        "suspend": False,
    }
    assert spec["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert spec["template"]["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "train"
    assert spec["template"]["spec"]["dnsPolicy"] == "ClusterFirst"


def test_workload_defaults_leave_a_missing_selector_missing() -> None:
    deployment: dict[str, Any] = {
        "metadata": {"name": "d"},
        "spec": {"template": {"spec": {"containers": []}}},
    }
    defaults.apply_defaults("deployments.apps", deployment)
    spec = deployment["spec"]
    assert "selector" not in spec
    assert (spec["replicas"], spec["revisionHistoryLimit"], spec["progressDeadlineSeconds"]) == (1, 10, 600)
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
    }
    stateful: dict[str, Any] = {"metadata": {"name": "s"}, "spec": {}}
    defaults.apply_defaults("statefulsets.apps", stateful)
    assert stateful["spec"]["podManagementPolicy"] == "OrderedReady"
    assert stateful["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}


def test_defaulting_is_idempotent() -> None:
    pod = _pod(resources={"limits": {"cpu": "1"}})
    pod["status"] = {"phase": "Pending"}
    defaults.apply_defaults("pods", pod)
    again: dict[str, Any] = {**pod, "spec": dict(pod["spec"])}
    defaults.apply_defaults("pods", again)
    assert again == pod


def test_custom_resources_get_their_schema_defaults() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {"mode": {"type": "string", "default": "drain"}, "limits": {"type": "object"}},
            }
        },
    }
    obj: dict[str, Any] = {"spec": {}}
    defaults.apply_schema_defaults(obj, schema)
    assert obj == {"spec": {"mode": "drain"}}


@pytest.mark.integration
def test_the_official_client_reads_the_defaults_back(
    api: client.ApiClient, make_pod: Callable[..., dict[str, Any]]
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", make_pod("p"))
    pod = core.read_namespaced_pod("p", "default")
    assert pod.spec.restart_policy == "Always" and pod.spec.service_account_name == "default"
    assert pod.spec.containers[0].image_pull_policy == "IfNotPresent"
    assert pod.status.qos_class == "BestEffort"
    ns = core.create_namespace({"metadata": {"name": "team-b"}})
    assert ns.spec.finalizers == ["kubernetes"] and ns.metadata.labels == {
        "kubernetes.io/metadata.name": "team-b"
    }
