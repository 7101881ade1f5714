"""Which free devices a device-plugin pod gets (`simulator.fleet.device_manager`).

Aspects: the choice is always right-sized, distinct, free and Healthy, and over many seeds every
free healthy device gets picked (the device manager's set is unordered, never the lowest free
index); time-slicing replicas spread over the least-used cards, choosing among equals at random;
one seed and node repeat exactly. On the fleet: a pod bound through the API, a replacement the
simulated scheduler binds, and a pod run by node agents of a control plane the fleet does not
own all get the kubelet's choice, the same on every run with the same seed, while the scenario's
initial pods keep the model's first-fit layout: on the simulated control plane as written, and
beside another control plane (whose controllers make them) as the node agents admit them before
the timeline starts; a further pod of the workload, or one admitted once a fault was applied,
gets the kubelet's choice there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.device_manager import kubelet_rng, preferred_allocation
from simulator.fleet.node_api import StoreNodeApi
from simulator.fleet.objects import WORKLOAD_LABEL, gpu_uuid
from simulator.model import Slot
from simulator.scenario import DeviceRef, Fault, from_dict


@st.composite
def node_state(draw: st.DrawFn) -> tuple[list[Slot], set[int], int, int]:
    """(free slots, healthy GPUs, replicas per GPU (0: whole GPUs), count wanted)."""
    gpus = draw(st.integers(1, 8))
    replicas = draw(st.sampled_from([0, 0, 2, 4]))
    every = (
        [Slot(g, r) for g in range(gpus) for r in range(replicas)]
        if replicas
        else [Slot(g) for g in range(gpus)]
    )
    free = draw(st.lists(st.sampled_from(every), unique=True))
    healthy = draw(st.sets(st.integers(0, gpus - 1)))
    usable = [s for s in free if s.gpu in healthy]
    count = draw(st.integers(0, len(usable) + 1))
    return free, healthy, replicas, count


@given(node_state(), st.integers(0, 2**32))
def test_the_choice_is_always_free_healthy_distinct_and_right_sized(
    state: tuple[list[Slot], set[int], int, int], seed: int
) -> None:
    free, healthy, replicas, count = state
    usable = [s for s in free if s.gpu in healthy]
    picked = preferred_allocation(usable, count, random.Random(seed), replicas=replicas)
    if count > len(usable):
        assert picked is None
        return
    assert picked is not None
    assert len(picked) == count
    assert len(set(picked)) == count
    assert all(s in free and s.gpu in healthy for s in picked)


@given(node_state())
def test_over_many_seeds_every_free_healthy_device_is_picked_sometimes(
    state: tuple[list[Slot], set[int], int, int],
) -> None:
    free, healthy, replicas, _ = state
    usable = [s for s in free if s.gpu in healthy]
    if not usable:
        return
    seen = Counter(
        s
        for seed in range(400)
        for s in preferred_allocation(usable, 1, random.Random(seed), replicas=replicas) or ()
    )
    if replicas:
        # One replica goes to a least-used card; every such card's replicas get picked.
        least = min(replicas - sum(s.gpu == g for s in usable) for g in {s.gpu for s in usable})
        wanted = {s for s in usable if replicas - sum(t.gpu == s.gpu for t in usable) == least}
        assert {s.gpu for s in seen} == {s.gpu for s in wanted}
    else:
        assert set(seen) == set(usable)


def test_one_seed_and_node_repeat_exactly_and_nodes_draw_apart() -> None:
    usable = [Slot(g) for g in range(8)]

    def run(seed: int, node: str) -> list[tuple[Slot, ...] | None]:
        rng = kubelet_rng(seed, node)
        return [preferred_allocation(usable, 2, rng) for _ in range(20)]

    assert run(7, "n-0") == run(7, "n-0")
    assert run(7, "n-0") != run(7, "n-1")
    assert run(7, "n-0") != run(8, "n-0")
    # The caller's list order does not matter, only the set and the draws.
    assert preferred_allocation(usable, 3, random.Random(1)) == preferred_allocation(
        list(reversed(usable)), 3, random.Random(1)
    )


def test_time_slicing_spreads_replicas_over_the_least_used_cards() -> None:
    every = [Slot(g, r) for g in range(4) for r in range(2)]
    for seed in range(50):
        picked = preferred_allocation(every, 4, random.Random(seed), replicas=2)
        assert picked is not None
        assert sorted(s.gpu for s in picked) == [0, 1, 2, 3]  # one replica of each card first
    # Cards 0 and 1 each have one replica in use: a one-replica pod goes to card 2 or 3, both.
    free = [s for s in every if s not in (Slot(0, 0), Slot(1, 1))]
    cards = {
        s.gpu
        for seed in range(100)
        for s in preferred_allocation(free, 1, random.Random(seed), replicas=2) or ()
    }
    assert cards == {2, 3}


# ----------------------------------------------------------------------------- on the fleet


def scenario(seed: int, *, replicas: int = 0, gpus: int = 8) -> dict[str, Any]:
    group: dict[str, Any] = {"name": "n", "count": 1, "gpusPerNode": gpus, "path": "device-plugin"}
    if replicas:
        group["sharedReplicas"] = replicas
    return {
        "settings": {"statusSyncInterval": "10s", "seed": seed},
        "fleet": [group],
        "workloads": [{"name": "w", "namespace": "default", "replicas": 1, "gpusPerPod": 1}],
    }


def api_pod(name: str, gpus: int = 1) -> dict[str, Any]:
    limits = {"memory": "1Gi", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": "n-0",
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "resources": {"requests": {"cpu": "1"}, "limits": limits},
                }
            ],
        },
    }


def workload_pod(name: str, pod_hash: str = "6b9f4d") -> dict[str, Any]:
    """A pod of the scenario's workload `w` as a Deployment controller makes it (owned by its
    ReplicaSet, labelled), bound to `n-0` by a scheduler."""
    pod = api_pod(name)
    pod["metadata"]["labels"] = {"app": "w", WORKLOAD_LABEL: "w", "pod-template-hash": pod_hash}
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": f"w-{pod_hash}",
        "uid": "u-1",
        "controller": True,
    }
    pod["metadata"]["ownerReferences"] = [owner]
    pod["spec"]["restartPolicy"] = "Always"
    return pod


def allocated(store: Store, name: str) -> list[str]:
    status = store.get("pods", name, "default")["status"]
    (cs,) = status["containerStatuses"]
    return [r["resourceID"] for r in cs["allocatedResourcesStatus"][0]["resources"]]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def running(data: dict[str, Any], *, agents: bool = False) -> AsyncIterator[tuple[Fleet, Store]]:
    """The fleet of `data` following its pods. `agents`: its nodes are the node agents of a
    control plane the fleet does not own (reached through `node_api`), as beside a real
    kube-apiserver."""
    clock = ManualClock()
    store = Store(clock, seed=5)
    if agents:
        fleet = Fleet(from_dict(data), None, clock, node_api=StoreNodeApi(store))
    else:
        fleet = Fleet(from_dict(data), store, clock)
    await fleet.start()
    task = asyncio.create_task(fleet.follow_deletions())
    await asyncio.sleep(0)
    try:
        yield fleet, store
    finally:
        fleet.stop()
        await task


async def api_pods_devices(seed: int, *, agents: bool = False) -> list[list[str]]:
    """The devices three API pods get on a node whose GPU 1 is Unhealthy (the workload holds
    GPU 0 on the simulated control plane; beside another control plane there is none)."""
    data = scenario(seed)
    if agents:
        data["workloads"] = []
    async with running(data, agents=agents) as (fleet, store):
        fleet.inject(Fault(at=fleet.now(), kind="device-unhealthy", device=DeviceRef("n-0", 1)))
        await fleet.advance(1)
        out = []
        for name in ("a", "b", "c"):
            store.create("pods", api_pod(name), namespace="default")
            await settle()
            await fleet.advance(2)
            out.append(allocated(store, name))
        return out


async def test_api_pods_get_the_kubelets_choice_repeatably_on_both_control_planes() -> None:
    unhealthy = gpu_uuid("n-0", 1)
    picked: set[str] = set()
    for agents in (False, True):
        for seed in range(6):
            run = await api_pods_devices(seed, agents=agents)
            assert run == await api_pods_devices(seed, agents=agents)  # the same seed repeats
            devices = [d for ids in run for d in ids]
            assert len(set(devices)) == 3 and unhealthy not in devices
            if not agents:
                assert gpu_uuid("n-0", 0) not in devices  # the initial pod holds it
            picked.update(devices)
    # Not the lowest free indexes every time: the choice reaches past GPUs 2, 3 and 4.
    assert picked - {gpu_uuid("n-0", i) for i in (0, 2, 3, 4)}


async def test_the_initial_layout_stays_first_fit_and_replacements_get_the_kubelets_choice() -> None:
    landed: set[int] = set()
    for seed in range(8):
        async with running(scenario(seed)) as (fleet, store):
            (pod,) = fleet.nodes["n-0"].pods
            assert [s.gpu for s in pod.slots] == [0]  # where the scenario's layout put it
            store.evict(pod.name, "default")
            await settle()
            await fleet.advance(10)
            (replacement,) = [p for p in fleet.nodes["n-0"].pods if not p.terminated and p.name != pod.name]
            landed.update(s.gpu for s in replacement.slots)
    assert len(landed) > 1  # not always GPU 0, the lowest free index once its pod left


async def test_time_sliced_api_pods_spread_over_cards() -> None:
    data = scenario(3, replicas=2, gpus=4)
    data["workloads"] = []
    async with running(data) as (fleet, store):
        for name in ("a", "b", "c", "d"):
            store.create("pods", api_pod(name), namespace="default")
            await settle()
            await fleet.advance(2)
        ids = [allocated(store, name)[0] for name in ("a", "b", "c", "d")]
        assert sorted(i.split("::")[0] for i in ids) == sorted(gpu_uuid("n-0", g) for g in range(4))


async def workload_pods_devices(seed: int, *, fault_first: bool) -> list[list[str]]:
    """The devices three pods of the scenario's workload (2 replicas of 1 GPU) get from node agents
    of a control plane the fleet does not own, admitted one by one; `fault_first`: after the
    timeline applied a fault (an application XID on GPU 7, which changes no device's health)."""
    data = scenario(seed)
    data["workloads"][0]["replicas"] = 2
    async with running(data, agents=True) as (fleet, store):
        if fault_first:
            fleet.inject(Fault(at=fleet.now(), kind="xid", device=DeviceRef("n-0", 7), xid=13))
            await fleet.advance(1)
        out = []
        for name in ("w-a", "w-b", "w-c"):
            store.create("pods", workload_pod(name), namespace="default")
            await settle()
            await fleet.advance(2)
            out.append(allocated(store, name))
        return out


async def test_agents_give_initial_pods_the_layout_and_later_pods_the_kubelets_choice() -> None:
    layout = [[gpu_uuid("n-0", 0)], [gpu_uuid("n-0", 1)]]
    third: set[str] = set()
    after_fault: set[str] = set()
    for seed in range(8):
        first, second, extra = await workload_pods_devices(seed, fault_first=False)
        assert [first, second] == layout  # the layout's GPUs, whatever the seed
        assert extra[0] not in {d for ids in layout for d in ids}
        third.update(extra)
        run = await workload_pods_devices(seed, fault_first=True)
        assert len({d for ids in run for d in ids}) == 3
        after_fault.update(run[0])
    assert len(third) > 1  # a pod beyond the layout: the device manager's, not always the lowest free
    assert after_fault - {gpu_uuid("n-0", 0)}  # once the timeline started, no layout at all
