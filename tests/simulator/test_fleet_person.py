"""A person's timeline actions, done through the API and answered by the controllers.

Aspects: `scale` patches the Deployment's `spec.replicas` and the fleet's controller of the
scenario's workloads follows it: up, new pods are placed at once; down, the surplus goes
gracefully, newest first, and is not replaced; a pod deleted after a scale down is replaced up
to the new count only. `delete-pods` deletes the pods its selector (and node) picks, in one
namespace only, and their workload replaces them; a selector that matches nothing changes
nothing. Both are scheduled from the scenario's timeline and injected at run time alike.
(The same actions beside the real control plane: tests/controlplane/test_controlplane_scenarios.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.scenario import fault_from_dict, from_dict

SCENARIO: dict[str, Any] = {
    "fleet": [{"name": "n", "count": 2, "gpusPerNode": 4, "path": "device-plugin"}],
    "workloads": [
        {"name": "svc", "namespace": "inference", "replicas": 2, "gpusPerPod": 1},
        {"name": "other", "namespace": "batch", "replicas": 1, "gpusPerPod": 1},
    ],
    "timeline": [
        {"at": "10s", "action": "scale", "namespace": "inference", "workload": "svc", "replicas": 4},
        {"at": "30s", "action": "scale", "namespace": "inference", "workload": "svc", "replicas": 1},
    ],
}


@pytest.fixture
async def running() -> AsyncIterator[tuple[Fleet, Store]]:
    clock = ManualClock()
    store = Store(clock, seed=3)
    fleet = Fleet(from_dict(SCENARIO), store, clock)
    await fleet.start()
    task = asyncio.create_task(fleet.follow_deletions())
    await asyncio.sleep(0)
    yield fleet, store
    fleet.stop()
    await task


async def advance(fleet: Fleet, seconds: float) -> None:
    for _ in range(int(seconds)):
        await fleet.advance(1)
        for _ in range(5):
            await asyncio.sleep(0)


def running_pods(store: Store, namespace: str) -> list[dict[str, Any]]:
    return [
        p
        for p in store.list("pods", namespace)[0]
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


async def test_scale_up_then_down_follows_the_deployment(running: tuple[Fleet, Store]) -> None:
    fleet, store = running
    first = {p["metadata"]["name"] for p in running_pods(store, "inference")}
    assert len(first) == 2
    await advance(fleet, 15)
    assert store.get("deployments.apps", "svc", "inference")["spec"]["replicas"] == 4
    assert len(running_pods(store, "inference")) == 4
    await advance(fleet, 30)  # the scale down at 30 s, and well past any replacement delay
    left = running_pods(store, "inference")
    assert len(left) == 1
    # The newest go first: one of the two pods the scenario started with stays.
    assert left[0]["metadata"]["name"] in first
    assert len(running_pods(store, "batch")) == 1  # another workload is not touched


async def test_a_pod_deleted_after_a_scale_down_is_replaced_up_to_the_new_count(
    running: tuple[Fleet, Store],
) -> None:
    fleet, store = running
    await advance(fleet, 35)
    (pod,) = running_pods(store, "inference")
    fleet.inject(
        fault_from_dict(
            {"action": "delete-pods", "namespace": "inference", "selector": "app=svc"},
            fleet.scenario,
            now=fleet.now(),
        )
    )
    await advance(fleet, 15)
    (again,) = running_pods(store, "inference")
    assert again["metadata"]["name"] != pod["metadata"]["name"]


async def test_delete_pods_picks_by_selector_namespace_and_node(running: tuple[Fleet, Store]) -> None:
    fleet, store = running
    before = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in running_pods(store, "inference")}
    node = next(iter(before.values()))
    fleet.inject(
        fault_from_dict(
            {"action": "delete-pods", "namespace": "inference", "selector": "app=svc", "node": node},
            fleet.scenario,
            now=fleet.now(),
        )
    )
    await advance(fleet, 1)
    gone = {name for name, on in before.items() if on == node}
    now = {p["metadata"]["name"] for p in running_pods(store, "inference")}
    assert gone and not gone & now
    assert len(running_pods(store, "batch")) == 1
    await advance(fleet, 8)  # the replacement delay (5 s) and a start
    assert len(running_pods(store, "inference")) == 2
    # A selector matching nothing deletes nothing.
    fleet.inject(
        fault_from_dict(
            {"action": "delete-pods", "namespace": "batch", "selector": "app=svc"},
            fleet.scenario,
            now=fleet.now(),
        )
    )
    await advance(fleet, 8)
    assert len(running_pods(store, "batch")) == 1
    assert [a.fault.kind for a in fleet.applied] == ["delete-pods", "delete-pods", "scale"]
