"""The fleet's node agents over HTTP: the same kubelets, pod workers and drivers against a served apiserver.

Aspects: with the simulated control plane served on loopback (its scheduler and controllers on,
no nodes of its own) and the scenario's nodes as agents that reach it through `KubeClient` only,
a scenario behaves as on the in-process path: the Nodes are registered Ready with their GPU
capacity, Leases are renewed, the workloads (created as a Job with a ResourceClaimTemplate and a
Deployment asking for `nvidia.com/gpu`) are scheduled by the control plane and run by the agents
with `allocatedResourcesStatus` (the device-plugin pod on the GPUs the scenario's layout gives
it), and a fault on a GPU turns its device Unhealthy in the pod's
status (and out of the node's allocatable on the device-plugin path). Each observation is made
on both paths with the same checks; the agents' fleet holds no store at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from gpuhealth.testing.loopback import wait_until
from simulator.testing import running_agents, running_cluster
from tests.support.agents import allocated_statuses, running_by_node, scenario

pytestmark = pytest.mark.integration

SCENARIO = scenario("gpu")
SPEED = 5.0
DEADLINE = 60.0


@dataclass
class Run:
    """One way of running the scenario: what the checks read and how a fault is injected."""

    list: Callable[[str], list[dict[str, Any]]]
    inject: Callable[[dict[str, Any]], object]
    gpu_of: Callable[[str, str], int]
    """(node, device id in the pod's status) -> the GPU index the agents hold it as."""


def _gpu_index(nodes: dict[str, Any], node: str, resource_id: str) -> int:
    for gpu in nodes[node].gpus:
        if gpu.uuid in resource_id or resource_id.endswith(gpu.name):
            return int(gpu.index)
    raise AssertionError(f"{resource_id} is no GPU of {node}")


@contextmanager
def in_process() -> Iterator[Run]:
    with running_cluster(SCENARIO, speed=SPEED) as cluster:
        yield Run(
            list=lambda resource: cluster.list(resource),
            inject=cluster.inject,
            gpu_of=lambda node, rid: cluster.call(lambda c: _gpu_index(c.fleet.nodes, node, rid)),
        )


@contextmanager
def over_http() -> Iterator[Run]:
    with running_agents(SCENARIO, speed=SPEED) as (cluster, agents):
        # The control plane has no nodes of its own; the agents hold no store: HTTP is all they share.
        assert cluster.call(lambda c: len(c.fleet.nodes)) == 0
        assert agents.call(lambda a: (a.fleet.store, a.fleet.simulated_control_plane)) == (None, False)
        yield Run(
            list=lambda resource: cluster.list(resource),
            inject=agents.inject,
            gpu_of=lambda node, rid: agents.call(lambda a: _gpu_index(a.fleet.nodes, node, rid)),
        )


def _wait(what: str, probe: Callable[[], Any]) -> Any:
    return wait_until(what, probe, timeout=DEADLINE)


def _running_pods(path: Run) -> dict[str, dict[str, Any]]:
    return running_by_node(path.list("pods"))


@pytest.mark.parametrize("run", [in_process, over_http], ids=["in-process", "http"])
def test_nodes_ready_pods_running_and_a_fault_in_pod_status(run: Callable[[], Any]) -> None:
    with run() as path:
        nodes = {n["metadata"]["name"]: n for n in path.list("nodes")}
        assert sorted(nodes) == ["gpu-dp-0", "gpu-dra-0"]
        for node in nodes.values():
            ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
            assert [c["status"] for c in ready] == ["True"]
        assert nodes["gpu-dp-0"]["status"]["allocatable"]["nvidia.com/gpu"] == "4"
        leases = {lease["metadata"]["name"] for lease in path.list("leases.coordination.k8s.io")}
        assert {"gpu-dp-0", "gpu-dra-0"} <= leases
        slices = path.list("resourceslices.resource.k8s.io")
        assert [s["spec"]["nodeName"] for s in slices] == ["gpu-dra-0"]

        by_node = _wait("both pods Running with allocatedResourcesStatus", lambda: _running_pods(path))
        assert sorted(by_node) == ["gpu-dp-0", "gpu-dra-0"]
        dp_status = allocated_statuses(by_node["gpu-dp-0"])
        assert [s["name"] for s in dp_status] == ["nvidia.com/gpu"]
        # The scenario's initial pod on the GPUs its layout gives it (first fit: 0 and 1) on both
        # paths: written there in-process, given them by the agents' kubelet over HTTP.
        assert sorted(path.gpu_of("gpu-dp-0", r["resourceID"]) for r in dp_status[0]["resources"]) == [0, 1]
        dra_status = allocated_statuses(by_node["gpu-dra-0"])
        assert [s["name"] for s in dra_status] == ["claim:gpus/gpus"]
        for entry in dp_status + dra_status:
            assert [r["health"] for r in entry["resources"]] == ["Healthy", "Healthy"]
        claims = path.list("resourceclaims.resource.k8s.io")
        assert [c["status"]["allocation"]["devices"]["results"][0]["pool"] for c in claims] == ["gpu-dra-0"]

        # A device of each pod turns Unhealthy: the kubelet puts it in the pod's status.
        for node, entries in (("gpu-dp-0", dp_status), ("gpu-dra-0", dra_status)):
            rid = entries[0]["resources"][0]["resourceID"]
            gpu = path.gpu_of(node, rid)
            path.inject({"fault": "device-unhealthy", "device": {"node": node, "gpu": gpu}})

        def unhealthy() -> dict[str, str]:
            seen = {}
            for pod in path.list("pods"):
                for entry in allocated_statuses(pod):
                    for r in entry["resources"]:
                        if r["health"] == "Unhealthy":
                            seen[pod["spec"]["nodeName"]] = r["resourceID"]
            return seen if len(seen) == 2 else {}

        seen = _wait("the faulted devices Unhealthy in both pods' status", unhealthy)
        assert seen == {
            "gpu-dp-0": dp_status[0]["resources"][0]["resourceID"],
            "gpu-dra-0": dra_status[0]["resources"][0]["resourceID"],
        }
        # The device plugin's Unhealthy device leaves the node's allocatable (the kubelet's part).
        _wait(
            "allocatable nvidia.com/gpu lowered to 3",
            lambda: (
                next(n for n in path.list("nodes") if n["metadata"]["name"] == "gpu-dp-0")["status"][
                    "allocatable"
                ]["nvidia.com/gpu"]
                == "3"
            ),
        )
