"""A DRA health stream that dies unnoticed (`health-stream-stale`), stepped with a ManualClock.

Aspects: each DRA node runs the driver's kubelet plugin as a pod (its chart's namespace and
labels), bound to the node and run by its kubelet: Running and Ready; a device-plugin node has
none. The fault crash-loops the plugin (its probes fail: not Ready, CrashLoopBackOff) while the
kubelet keeps the Healthy it last heard in pod status long past the DRA health timeout and
through every status sync (the lazy expiry), and a report the driver makes meanwhile never
reaches pod status; the kubelet's Lease keeps being renewed. When the fault ends the stream's
reports reach pod status again and the plugin is Ready after its next restart. A scenario that
names a device-plugin node for the fault is refused, naming the fault it means.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.objects import DRA_PLUGIN_LABELS, DRA_PLUGIN_NAMESPACE
from simulator.scenario import DeviceRef, Fault, ScenarioError, from_dict

SCENARIO = {
    "settings": {"statusSyncInterval": "10s", "leaseRenewInterval": "10s"},
    "fleet": [
        {"name": "dra", "count": 1, "gpusPerNode": 2, "path": "dra"},
        {"name": "dp", "count": 1, "gpusPerNode": 2, "path": "device-plugin"},
    ],
    "workloads": [{"name": "w", "replicas": 1, "gpusPerPod": 2, "path": "dra"}],
}


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[Fleet, Store]]:
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
        for _ in range(3):
            await asyncio.sleep(0)


def plugin(store: Store) -> dict[str, Any]:
    pods, _ = store.list("pods", namespace=DRA_PLUGIN_NAMESPACE)
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def ready(pod: dict[str, Any]) -> str:
    return next(c["status"] for c in pod["status"].get("conditions", []) if c["type"] == "Ready")


def workload_health(store: Store) -> list[str]:
    pods, _ = store.list("pods", namespace="default")
    (pod,) = [p for p in pods if p["metadata"]["name"].startswith("w-")]
    (cs,) = pod["status"]["containerStatuses"]
    return [r["health"] for g in cs.get("allocatedResourcesStatus", []) for r in g["resources"]]


async def test_the_plugin_crash_loops_and_pod_status_keeps_its_last_healthy(
    fleet: tuple[Fleet, Store],
) -> None:
    fleet_, store = fleet
    await advance(fleet_, 3)
    pod = plugin(store)
    assert pod["spec"]["nodeName"] == "dra-0"  # one plugin, on the DRA node only
    assert DRA_PLUGIN_LABELS.items() <= pod["metadata"]["labels"].items()
    assert (pod["status"]["phase"], ready(pod)) == ("Running", "True")
    assert workload_health(store) == ["Healthy", "Healthy"]

    fleet_.inject(Fault(at=fleet_.now(), kind="health-stream-stale", node="dra-0", duration=300.0))
    await advance(fleet_, 1)
    pod = plugin(store)
    assert ready(pod) == "False"
    assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    # The driver sees GPU 1 fail: nothing reaches the kubelet, whose cache still says Healthy.
    fleet_.inject(Fault(at=fleet_.now(), kind="device-unhealthy", device=DeviceRef("dra-0", 1)))
    renewed = store.get("leases.coordination.k8s.io", "dra-0", "kube-node-lease")["spec"]["renewTime"]
    await advance(fleet_, 120)  # four times the 30 s DRA health timeout, a dozen status syncs
    assert workload_health(store) == ["Healthy", "Healthy"]
    assert ready(plugin(store)) == "False"
    assert store.get("leases.coordination.k8s.io", "dra-0", "kube-node-lease")["spec"]["renewTime"] > renewed

    # The fault ends: the stream is back, its news reaches pod status; the plugin restarts.
    await advance(fleet_, 180)
    assert workload_health(store) == ["Healthy", "Unhealthy"]
    await advance(fleet_, 300)  # the crash-loop back-off runs out (at most 5 minutes)
    assert ready(plugin(store)) == "True"


def test_a_device_plugin_node_is_refused_for_the_fault() -> None:
    data = {**SCENARIO, "timeline": [{"at": "10s", "fault": "health-stream-stale", "node": "dp-0"}]}
    with pytest.raises(ScenarioError, match=r"needs a DRA node .* health-stream-broken"):
        from_dict(data)
