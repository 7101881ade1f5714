"""The simulated kubelets' `List` (`simulator.pod_resources`): each running pod's devices.

Aspects: on a device-plugin node whose kubelet writes no `allocatedResourcesStatus`
(`resourceHealthStatus: false`, as before Kubernetes 1.36) `List` still names every pod's GPUs,
the ones its device manager gave it, under the container that asked and the resource it asked
for, as the exporter decodes them; a time-sliced node names replicas (`<uuid>::<n>`); a DRA node
names no device-plugin device; a pod that ended is no longer listed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from exporter.podresources import Assigned, decode_assignments
from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.pod_resources import assigned, list_message
from simulator.scenario import from_dict

DATA = {
    "fleet": [
        {"name": "old", "count": 1, "gpusPerNode": 4, "path": "device-plugin", "resourceHealthStatus": False},
        {"name": "shared", "count": 1, "gpusPerNode": 2, "path": "device-plugin", "sharedReplicas": 4},
        {"name": "dra", "count": 1, "gpusPerNode": 2, "path": "dra"},
    ],
    "workloads": [
        {"name": "serve", "namespace": "inference", "replicas": 2, "gpusPerPod": 2, "nodeGroup": "old"},
        {"name": "tiny", "namespace": "inference", "replicas": 1, "gpusPerPod": 2, "nodeGroup": "shared"},
        {"name": "train", "namespace": "research", "replicas": 1, "gpusPerPod": 1, "path": "dra"},
    ],
}


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    clock = ManualClock()
    running = Fleet(from_dict(DATA), Store(clock, seed=5), clock)
    await running.start()
    yield running
    running.stop()


def _uuids(fleet: Fleet, name: str) -> list[str]:
    pod = fleet.pods[f"inference/{name}"]
    return [fleet.nodes[pod.node].gpus[slot.gpu].uuid for slot in pod.slots]


async def test_an_old_kubelet_lists_every_pods_gpus_though_no_status_names_them(fleet: Fleet) -> None:
    pods = [p for p in fleet.store.list("pods")[0] if p["spec"]["nodeName"] == "old-0"]
    assert len(pods) == 2
    assert not any("allocatedResourcesStatus" in cs for p in pods for cs in p["status"]["containerStatuses"])
    listed = assigned(fleet, "old-0")
    assert {name for _, name, _ in listed} == {p["metadata"]["name"] for p in pods}
    decoded = decode_assignments(list_message(fleet, "old-0")).pods
    for namespace, name, containers in listed:
        assert namespace == "inference"
        assert containers == [("server", "nvidia.com/gpu", _uuids(fleet, name))]
        assert decoded[(namespace, name)] == tuple(
            Assigned("server", "nvidia.com/gpu", u) for u in _uuids(fleet, name)
        )
    # The GPUs are the pods' own: no two pods share one.
    everyone = [u for _, _, containers in listed for _, _, ids in containers for u in ids]
    assert len(everyone) == len(set(everyone)) == 4


async def test_replicas_are_listed_as_the_kubelet_names_them_and_dra_pods_not_at_all(fleet: Fleet) -> None:
    ((_, _, [(_, _, ids)]),) = assigned(fleet, "shared-0")
    assert len(ids) == 2 and all("::" in i for i in ids)
    assert assigned(fleet, "dra-0") == []
    assert decode_assignments(list_message(fleet, "dra-0")).pods == {}


async def test_a_pod_that_ended_is_no_longer_listed(fleet: Fleet) -> None:
    (namespace, name, _), _ = assigned(fleet, "old-0")
    fleet.pods[f"{namespace}/{name}"].terminated = True
    remaining = [n for _, n, _ in assigned(fleet, "old-0")]
    assert len(remaining) == 1 and name not in remaining
