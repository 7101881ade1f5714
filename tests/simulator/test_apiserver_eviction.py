"""Conformance of the pods/eviction subresource and PodDisruptionBudgets, through the official client.

Aspects: an eviction that keeps a budget satisfied deletes the pod (201); one that would break
it is 429 TooManyRequests with a DisruptionBudget cause and keeps the pod; minAvailable and
maxUnavailable as integers and percentages, expected pods from the controller's scale (an evicted
pod keeps counting until its replacement is Ready, so a drain stops after one eviction under
maxUnavailable 1); the evicted pod is recorded in disruptedPods with the eviction time; the PDB
status and its DisruptionAllowed condition; dry-run evictions decide and change nothing; pods
that are not Running are always evictable; no PDB means plain deletion; two PDBs over one pod is
a 500 as in the real API; evicting a missing pod is 404.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration


def _eviction(name: str) -> client.V1Eviction:
    return client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace="default"))


def _pdb(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": "infer"}}, **spec},
    }


_READY = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def _replica_set(api: client.ApiClient, replicas: int) -> dict[str, Any]:
    """The ReplicaSet `infer` whose scale the budgets count; no controller runs here, it is only read."""
    body = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "infer"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "infer"}},
            "template": {
                "metadata": {"labels": {"app": "infer"}},
                "spec": {"containers": [{"name": "main", "image": "registry.example/infer:1"}]},
            },
        },
    }
    rs: dict[str, Any] = client.AppsV1Api(api).create_namespaced_replica_set("default", body).to_dict()
    return rs


def _owned_pods(
    api: client.ApiClient, make_pod: Callable[..., dict[str, Any]], names: list[str], ready: list[str]
) -> client.CoreV1Api:
    core = client.CoreV1Api(api)
    rs = _replica_set(api, len(names))
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "infer",
        "uid": rs["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    for name in names:
        body = make_pod(name, labels={"app": "infer"}, node="n1")
        body["metadata"]["ownerReferences"] = [owner]
        core.create_namespaced_pod("default", body)
        if name in ready:
            core.patch_namespaced_pod_status(name, "default", _READY)
    return core


@pytest.fixture
def core(api: client.ApiClient, make_pod: Callable[..., dict[str, Any]]) -> client.CoreV1Api:
    """Three Running+Ready pods labelled app=infer and one Pending one, of a ReplicaSet of 4."""
    return _owned_pods(api, make_pod, ["a", "b", "c", "pending"], ["a", "b", "c"])


def _exists(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, "default")
    except ApiException as exc:
        assert exc.status == 404
        return False
    return True


def test_eviction_within_budget_deletes_and_beyond_it_is_429(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget("default", _pdb("keep-two", minAvailable=2))
    core.create_namespaced_pod_eviction("a", "default", _eviction("a"))
    assert not _exists(core, "a")
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("b", "default", _eviction("b"))
    assert exc.value.status == 429
    status = json.loads(exc.value.body)
    assert status["reason"] == "TooManyRequests"
    assert status["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert _exists(core, "b")
    pdb = policy.read_namespaced_pod_disruption_budget_status("keep-two", "default")
    assert (pdb.status.current_healthy, pdb.status.desired_healthy, pdb.status.disruptions_allowed) == (
        2,
        2,
        0,
    )


def test_pods_that_are_not_running_are_always_evictable(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", _pdb("all", minAvailable="100%")
    )
    core.create_namespaced_pod_eviction("pending", "default", _eviction("pending"))
    assert not _exists(core, "pending")
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("a", "default", _eviction("a"))
    assert exc.value.status == 429


@pytest.mark.parametrize(
    ("spec", "evictable"),
    [
        ({"maxUnavailable": 1}, 0),  # the Pending pod already takes the one allowed unavailability
        ({"maxUnavailable": "25%"}, 0),  # 25% of 4 expected pods rounds up to 1
        ({"maxUnavailable": 0}, 0),
        ({"minAvailable": "75%"}, 0),  # 3 of 4 must stay healthy, and 3 are
        ({"minAvailable": "50%"}, 1),
        ({"minAvailable": 0}, 3),
    ],
)
def test_budget_forms(
    api: client.ApiClient, core: client.CoreV1Api, spec: dict[str, Any], evictable: int
) -> None:
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget("default", _pdb("budget", **spec))
    evicted = 0
    for name in ("a", "b", "c"):
        try:
            core.create_namespaced_pod_eviction(name, "default", _eviction(name))
            evicted += 1
        except ApiException as exc:
            assert exc.status == 429
    assert evicted == evictable


def test_without_a_budget_eviction_is_deletion(core: client.CoreV1Api) -> None:
    for name in ("a", "b", "c"):
        core.create_namespaced_pod_eviction(name, "default", _eviction(name))
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["pending"]


def test_two_budgets_over_one_pod_is_an_error(api: client.ApiClient, core: client.CoreV1Api) -> None:
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget("default", _pdb("one", minAvailable=0))
    policy.create_namespaced_pod_disruption_budget("default", _pdb("two", minAvailable=0))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("a", "default", _eviction("a"))
    assert exc.value.status == 500
    assert _exists(core, "a")


def test_evicting_a_missing_pod_is_404(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("ghost", "default", _eviction("ghost"))
    assert exc.value.status == 404


def test_a_drain_under_max_unavailable_one_stops_after_one_eviction(
    api: client.ApiClient, make_pod: Callable[..., dict[str, Any]]
) -> None:
    names = [f"p{i}" for i in range(6)]
    core = _owned_pods(api, make_pod, names, names)
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget("default", _pdb("one", maxUnavailable=1))
    outcomes = []
    for name in names:
        try:
            core.create_namespaced_pod_eviction(name, "default", _eviction(name))
            outcomes.append(201)
        except ApiException as exc:
            outcomes.append(exc.status)
            assert json.loads(exc.body)["message"] == (
                "Cannot evict pod as it would violate the pod's disruption budget."
            )
    assert outcomes == [201, 429, 429, 429, 429, 429]
    status = policy.read_namespaced_pod_disruption_budget_status("one", "default").status
    # The ReplicaSet still wants 6: the evicted pod counts as expected until it is replaced.
    assert (status.expected_pods, status.current_healthy, status.desired_healthy) == (6, 5, 5)
    assert status.disruptions_allowed == 0
    assert [(c.type, c.status, c.reason) for c in status.conditions] == [
        ("DisruptionAllowed", "False", "InsufficientPods")
    ]


def test_an_eviction_is_recorded_until_the_pod_is_gone(
    cluster: Any, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget("default", _pdb("keep-one", minAvailable=1))
    # A finalizer keeps the evicted pod visible (being deleted) so the record can be seen.
    core.patch_namespaced_pod("a", "default", {"metadata": {"finalizers": ["example.com/hold"]}})
    core.create_namespaced_pod_eviction("a", "default", _eviction("a"))
    status = policy.read_namespaced_pod_disruption_budget_status("keep-one", "default").status
    assert list(status.disrupted_pods) == ["a"]
    # The eviction spends one allowed disruption; counting healthy pods is the next sync's work.
    assert (status.current_healthy, status.desired_healthy, status.disruptions_allowed) == (3, 1, 1)
    # The next eviction recomputes: the pod being deleted leaves disruptedPods and one more may go.
    core.create_namespaced_pod_eviction("b", "default", _eviction("b"))
    status = policy.read_namespaced_pod_disruption_budget_status("keep-one", "default").status
    assert list(status.disrupted_pods) == ["b"]
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("c", "default", _eviction("c"))
    assert exc.value.status == 429
    cause = json.loads(exc.value.body)["details"]["causes"][0]
    assert cause == {
        "reason": "DisruptionBudget",
        "message": "The disruption budget keep-one needs 1 healthy pods and has 1 currently",
    }


def test_dry_run_eviction_decides_and_changes_nothing(api: client.ApiClient, core: client.CoreV1Api) -> None:
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget("default", _pdb("keep-two", minAvailable=2))
    dry = client.V1Eviction(
        metadata=client.V1ObjectMeta(name="a", namespace="default"),
        delete_options=client.V1DeleteOptions(dry_run=["All"]),
    )
    core.create_namespaced_pod_eviction("a", "default", dry)
    core.create_namespaced_pod_eviction("a", "default", _eviction("a"), dry_run="All")
    assert _exists(core, "a")
    untouched = policy.read_namespaced_pod_disruption_budget_status("keep-two", "default")
    assert untouched.status is None  # not even the recomputed status is written by a dry run
    core.create_namespaced_pod_eviction("a", "default", _eviction("a"))
    dry.metadata.name = "b"
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("b", "default", dry)
    assert exc.value.status == 429
    assert _exists(core, "b")


def test_a_budget_over_pods_of_an_unknown_controller_fails_its_sync(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    client.AppsV1Api(api).delete_namespaced_replica_set("infer", "default")
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget("default", _pdb("pct", minAvailable="50%"))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("a", "default", _eviction("a"))
    assert exc.value.status == 429
    condition = policy.read_namespaced_pod_disruption_budget_status("pct", "default").status.conditions[0]
    assert (condition.status, condition.reason) == ("False", "SyncFailed")
    assert "found no controllers for pod" in condition.message
