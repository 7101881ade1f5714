"""Conformance of the pods/eviction subresource and PodDisruptionBudgets, through the official client.

Aspects: an eviction that keeps a budget satisfied deletes the pod (201); one that would break
it is 429 TooManyRequests with a DisruptionBudget cause and keeps the pod; minAvailable and
maxUnavailable as integers and percentages; pods that are not Running are always evictable;
the PDB status is updated; no PDB means plain deletion; two PDBs over one pod is a 500 as in the
real API; evicting a missing pod is 404.
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


@pytest.fixture
def core(api: client.ApiClient, make_pod: Callable[..., dict[str, Any]]) -> client.CoreV1Api:
    """Three Running+Ready pods labelled app=infer and one Pending one."""
    core = client.CoreV1Api(api)
    ready = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    for name in ("a", "b", "c", "pending"):
        core.create_namespaced_pod("default", make_pod(name, labels={"app": "infer"}, node="n1"))
        if name != "pending":
            core.patch_namespaced_pod_status(name, "default", ready)
    return core


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
