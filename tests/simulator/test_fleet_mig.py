"""MIG cards in the simulated fleet (`simulator.fleet.mig`): one identity for every view.

Aspects: a node group partitioned with strategy single advertises every partition as one
`nvidia.com/gpu` (capacity and allocatable), gives each pod a partition whose device ID is its
MIG UUID, lists those UUIDs in the kubelet's pod-resources answer and in NVML under their card;
a fault of the card is a fault of every partition (each pod on it reads Unhealthy, the node's
allocatable and pod-resources lose the whole card) and its recovery brings them all back; the
container runtime reaches a card through any of its MIG UUIDs; with strategy mixed the same
partitions are `nvidia.com/mig-<profile>`, which the node advertises, its workloads' pods
request and the kubelet names in their `allocatedResourcesStatus` and pod-resources answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.mig import partition_uuids
from simulator.fleet.objects import gpu_uuid
from simulator.fleet.pod_runner_spec import visible_gpus
from simulator.model import MigLayout
from simulator.nvml import FakeNvml
from simulator.pod_resources import allocatable_ids
from simulator.scenario import DeviceRef, Fault, from_dict

LAYOUT = MigLayout(strategy="single", profile="1g.10gb", partitions=3)
DATA = {
    "fleet": [
        {
            "name": "m",
            "count": 1,
            "gpusPerNode": 2,
            "path": "device-plugin",
            "mig": {"strategy": "single", "profile": "1g.10gb", "partitions": 3},
        }
    ],
    "workloads": [{"name": "w", "replicas": 3, "gpusPerPod": 1}],
}
CARD, OTHER = gpu_uuid("m-0", 0), gpu_uuid("m-0", 1)


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    clock = ManualClock()
    running = Fleet(from_dict(DATA), Store(clock, seed=5), clock)
    await running.start()
    yield running
    running.stop()


def gpu_entries(fleet: Fleet, resource: str = "nvidia.com/gpu") -> dict[str, tuple[str, str]]:
    """pod name -> (resourceID, health) of its one device, as the kubelet wrote them."""
    out = {}
    for pod in fleet.store.list("pods")[0]:
        (group,) = pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"]
        assert group["name"] == resource
        (entry,) = group["resources"]
        out[pod["metadata"]["name"]] = (entry["resourceID"], entry["health"])
    return out


def allocatable(fleet: Fleet) -> str:
    return str(fleet.store.get("nodes", "m-0")["status"]["allocatable"]["nvidia.com/gpu"])


async def test_every_view_names_a_partition_by_its_mig_uuid(fleet: Fleet) -> None:
    card_parts, other_parts = partition_uuids(CARD, LAYOUT), partition_uuids(OTHER, LAYOUT)
    assert all(p.startswith("MIG-") for p in card_parts) and len({*card_parts, *other_parts}) == 6
    node = fleet.store.get("nodes", "m-0")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "6" and allocatable(fleet) == "6"
    # First fit fills card 0's three partitions.
    assert sorted(rid for rid, _ in gpu_entries(fleet).values()) == sorted(card_parts)
    assert sorted(allocatable_ids(fleet, "m-0")["nvidia.com/gpu"]) == sorted((*card_parts, *other_parts))
    nvml = FakeNvml(fleet, "m-0")
    assert nvml.start()
    listed = {r.uuid: tuple(m.uuid for m in r.mig_devices) for r in nvml.read()}
    assert listed == {CARD: card_parts, OTHER: other_parts}


async def test_a_fault_of_the_card_is_a_fault_of_every_partition(fleet: Fleet) -> None:
    fleet.inject(Fault(at=fleet.now(), kind="device-unhealthy", device=DeviceRef("m-0", 0), message="XID 79"))
    await fleet.advance(11)
    assert {health for _, health in gpu_entries(fleet).values()} == {"Unhealthy"}
    assert allocatable(fleet) == "3"
    assert sorted(allocatable_ids(fleet, "m-0")["nvidia.com/gpu"]) == sorted(partition_uuids(OTHER, LAYOUT))
    fleet.inject(Fault(at=fleet.now(), kind="recover", device=DeviceRef("m-0", 0)))
    await fleet.advance(11)
    assert {health for _, health in gpu_entries(fleet).values()} == {"Healthy"}
    assert allocatable(fleet) == "6"


def test_the_runtime_reaches_a_card_through_its_mig_uuids() -> None:
    uuids = ("GPU-a", "GPU-b")
    parts = (("MIG-a0", "MIG-a1"), ("MIG-b0",))
    assert visible_gpus(("MIG-a1",), uuids, parts) == (0,)
    assert visible_gpus(("MIG-a0,MIG-a1",), uuids, parts) == (0,)
    assert visible_gpus(("MIG-b0", "GPU-a"), uuids, parts) == (0, 1)
    assert visible_gpus(("MIG-zz",), uuids, parts) is None


async def test_strategy_mixed_offers_the_partitions_as_their_profiles_resource() -> None:
    data = {
        "fleet": [
            {
                "name": "x",
                "count": 1,
                "gpusPerNode": 2,
                "path": "device-plugin",
                "mig": {"strategy": "mixed", "profile": "3g.40gb", "partitions": 2},
            }
        ],
        "workloads": [{"name": "w", "replicas": 2, "gpusPerPod": 1, "nodeGroup": "x"}],
    }
    clock = ManualClock()
    fleet = Fleet(from_dict(data), Store(clock, seed=5), clock)
    await fleet.start()
    try:
        resource = "nvidia.com/mig-3g.40gb"
        node = fleet.store.get("nodes", "x-0")
        assert (
            node["status"]["capacity"][resource] == "4" and "nvidia.com/gpu" not in node["status"]["capacity"]
        )
        pod = fleet.store.list("pods")[0][0]
        assert pod["spec"]["containers"][0]["resources"]["requests"][resource] == "1"
        card = gpu_uuid("x-0", 0)
        layout = MigLayout(strategy="mixed", profile="3g.40gb", partitions=2)
        assert sorted(rid for rid, _ in gpu_entries(fleet, resource).values()) == sorted(
            partition_uuids(card, layout)
        )
        assert set(allocatable_ids(fleet, "x-0")) == {resource}
    finally:
        fleet.stop()


async def test_a_pod_bound_through_the_api_gets_a_partition_of_the_resource_it_asks_for() -> None:
    data = {
        "fleet": [
            {
                "name": "x",
                "count": 1,
                "gpusPerNode": 1,
                "path": "device-plugin",
                "mig": {"strategy": "mixed", "profile": "3g.40gb", "partitions": 2},
            }
        ],
        "workloads": [],
    }
    clock = ManualClock()
    store = Store(clock, seed=5)
    fleet = Fleet(from_dict(data), store, clock)
    await fleet.start()
    task = asyncio.create_task(fleet.follow_deletions())
    await asyncio.sleep(0)
    try:
        for name, resource in (("fits", "nvidia.com/mig-3g.40gb"), ("other", "nvidia.com/gpu")):
            container = {
                "name": "main",
                "image": "busybox:1.36",
                "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    "limits": {"memory": "1Gi", resource: "1"},
                },
            }
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"containers": [container], "restartPolicy": "Never", "nodeName": "x-0"},
            }
            store.create("pods", body, namespace="default")
            for _ in range(5):
                await asyncio.sleep(0)
        await fleet.advance(1)
        fits = store.get("pods", "fits", "default")["status"]
        (group,) = fits["containerStatuses"][0]["allocatedResourcesStatus"]
        assert fits["phase"] == "Running" and group["name"] == "nvidia.com/mig-3g.40gb"
        assert group["resources"][0]["resourceID"] in partition_uuids(
            gpu_uuid("x-0", 0), MigLayout(strategy="mixed", profile="3g.40gb", partitions=2)
        )
        other = store.get("pods", "other", "default")["status"]
        assert other["phase"] == "Failed" and "nvidia.com/gpu" in other["message"]
    finally:
        fleet.stop()
        await task
