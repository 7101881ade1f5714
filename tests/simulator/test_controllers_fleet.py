"""The controllers inside a running fleet: the scenario's workloads keep their pods and placement.

Aspects: a scenario Deployment has its Deployment and ReplicaSet in the API (fleet-managed),
its pods' owner reference resolves to that ReplicaSet, so the garbage collector keeps them;
the ReplicaSet and Deployment status count the pods; a claim generated for a DRA pod goes
with its pod; a ReplicaSet created through the API gets its pods next to the scenario's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.objects import DRA_PLUGIN_NAMESPACE, MANAGED_BY_FLEET
from simulator.scenario import from_dict
from tests.support.controllers import template


@pytest.fixture
async def running() -> AsyncIterator[tuple[Fleet, Store]]:
    data = {
        "fleet": [{"name": "n", "count": 2, "gpusPerNode": 4, "path": "dra"}],
        "workloads": [{"name": "w", "replicas": 2, "gpusPerPod": 2}],
    }
    clock = ManualClock()
    store = Store(clock, seed=3)
    fleet = Fleet(from_dict(data), store, clock)
    await fleet.start()
    task = asyncio.create_task(fleet.follow_deletions())
    yield fleet, store
    fleet.stop()
    await task


async def _until(check: Any, rounds: int = 2000) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)
        if check():
            return
    raise AssertionError("not reached")


async def test_scenario_workloads_are_owned_and_kept(running: tuple[Fleet, Store]) -> None:
    _, store = running
    (rs,) = store.list("replicasets.apps", "default")[0]
    deployment = store.get("deployments.apps", "w", "default")
    assert rs["metadata"]["annotations"][MANAGED_BY_FLEET] == "true"
    assert rs["metadata"]["ownerReferences"][0]["uid"] == deployment["metadata"]["uid"]
    pods = store.list("pods", "default")[0]
    assert len(pods) == 2
    assert {p["metadata"]["ownerReferences"][0]["uid"] for p in pods} == {rs["metadata"]["uid"]}

    def rs_status() -> dict[str, Any]:
        return store.get("replicasets.apps", rs["metadata"]["name"], "default").get("status") or {}

    await _until(lambda: rs_status().get("readyReplicas") == 2)
    await _until(
        lambda: (
            (store.get("deployments.apps", "w", "default").get("status") or {}).get("availableReplicas") == 2
        )
    )
    # The garbage collector has looked at every pod and claim by now and kept them all.
    assert len(store.list("pods", "default")[0]) == 2
    assert len(store.list("resourceclaims.resource.k8s.io", "default")[0]) == 2
    assert store.finalizing_controllers


async def test_an_api_replica_set_runs_beside_the_scenario(running: tuple[Fleet, Store]) -> None:
    _, store = running
    store.create(
        "replicasets.apps",
        {
            "metadata": {"name": "extra", "namespace": "default"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "extra"}},
                "template": template("extra"),
            },
        },
    )
    await _until(lambda: len(store.list("pods", "default", label_selector="app=extra")[0]) == 2)
    assert len(store.list("pods", "default", label_selector="app=w")[0]) == 2


async def test_a_no_execute_device_taint_rule_moves_a_scenario_pod(running: tuple[Fleet, Store]) -> None:
    fleet, store = running
    claims = store.list("resourceclaims.resource.k8s.io", "default")[0]
    claim = claims[0]
    (victim,) = [r["name"] for r in claim["status"]["reservedFor"]]
    result = claim["status"]["allocation"]["devices"]["results"][0]
    store.create(
        "devicetaintrules.resource.k8s.io",
        {
            "metadata": {"name": "quarantine"},
            "spec": {
                "deviceSelector": {
                    "driver": result["driver"],
                    "pool": result["pool"],
                    "device": result["device"],
                },
                "taint": {"key": "gpuhealth.io/quarantine", "value": "xid-79", "effect": "NoExecute"},
            },
        },
    )

    def names() -> set[str]:
        return {p["metadata"]["name"] for p in store.list("pods", "default")[0]}

    await _until(lambda: f"default/{victim}" not in fleet.pods)  # the fleet saw the deletion
    await fleet.advance(fleet.replacement_delay + 1)
    await _until(lambda: len(names()) == 2)
    held = {
        (r["pool"], r["device"])
        for c in store.list("resourceclaims.resource.k8s.io", "default")[0]
        for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
    }
    assert (result["pool"], result["device"]) not in held
    rule = store.get("devicetaintrules.resource.k8s.io", "quarantine")
    (condition,) = rule["status"]["conditions"]
    assert (condition["type"], condition["reason"]) == ("EvictionInProgress", "Completed")
    assert condition["message"] == "1 pod evicted since starting the controller."


async def test_deleting_a_scenario_deployment_takes_its_pods_for_good(running: tuple[Fleet, Store]) -> None:
    fleet, store = running
    store.delete("deployments.apps", "w", "default")  # background: the garbage collector cascades
    await _until(
        lambda: (
            not store.list("pods", "default")[0]
            and all(p.namespace == DRA_PLUGIN_NAMESPACE for p in fleet.pods.values())
        )
    )
    await fleet.advance(fleet.replacement_delay * 3)
    await _until(lambda: not store.list("replicasets.apps", "default")[0])
    assert store.list("pods", "default")[0] == []
