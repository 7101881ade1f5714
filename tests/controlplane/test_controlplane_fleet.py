"""The simulator's fleet as node agents of the real control plane (1.37), over HTTP only.

Aspects: the same kubelets, device plugins, DRA drivers and pod workers that run in-process
(`simulator.fleet`, here on `HttpNodeApi` with the admin kubeconfig) register their Nodes with
GPU capacity and renew their `kube-node-lease` Leases; the real node lifecycle controller keeps
them Ready, turns a node whose kubelet stopped Ready=Unknown with the unreachable taints and
lifts them once the kubelet posts Ready again. The scenario's workloads are real API objects: the
real Job and Deployment controllers make the pods, the real kube-scheduler binds them (counting
`nvidia.com/gpu` for the device-plugin pod, allocating the DRA claim from the agents'
ResourceSlice), and the agents run them with `allocatedResourcesStatus`; a fault on a GPU turns
its device Unhealthy in the pod's status and out of the node's allocatable.

Time: the agents run at speed 1 (real seconds), so their Lease period (10 s) and duration
(40 s) meet kube-controller-manager's own defaults (node-monitor-grace-period 50 s) unchanged.
The plane is this module's own, so no other test's pods land on these nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.resources import LEASE, NODE, POD, RESOURCE_CLAIM, RESOURCE_SLICE, Resource
from gpuhealth.testing.loopback import wait_until
from simulator.controlplane import ControlPlane, ControlPlaneSettings
from simulator.testing import AgentsHandle, started
from tests.controlplane.conftest import require_builds
from tests.support.agents import allocated_statuses, running_by_node, scenario
from tests.support.controlplane import admin

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

EVENTS = Resource("", "v1", "events", namespaced=True)
SCENARIO = scenario("agent")
NODES = ("agent-dp-0", "agent-dra-0")
TIMEOUT = 60.0
NODE_MONITOR_GRACE = 50.0
"""kube-controller-manager's default --node-monitor-grace-period (1.37)."""


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    require_builds("1.37")
    workdir = tmp_path_factory.mktemp("controlplane-fleet")
    with ControlPlane(ControlPlaneSettings(kubernetes="1.37", workdir=workdir)) as cp:
        yield cp


@pytest.fixture(scope="module")
def agents(plane: ControlPlane) -> Iterator[AgentsHandle]:
    with started(AgentsHandle(SCENARIO, Path(plane.kubeconfig_path), speed=1.0)) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(plane: ControlPlane) -> Iterator[KubeClient]:
    c = admin(plane)
    yield c
    c.close()


def wait(what: str, probe: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    return wait_until(what, probe, timeout=timeout, interval=0.5)


def ready(node: dict[str, Any]) -> str:
    return next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready")


def running_pods(client: KubeClient) -> dict[str, dict[str, Any]]:
    return running_by_node(client.list(POD).items)


def test_nodes_register_with_gpus_and_renew_their_leases(agents: AgentsHandle, client: KubeClient) -> None:
    nodes = wait("both nodes", lambda: {n["metadata"]["name"]: n for n in client.list(NODE).items})
    assert sorted(nodes) == list(NODES)
    assert [ready(nodes[n]) for n in NODES] == ["True", "True"]
    dp = nodes["agent-dp-0"]["status"]
    assert (dp["capacity"]["nvidia.com/gpu"], dp["allocatable"]["nvidia.com/gpu"]) == ("4", "4")
    (pool,) = [s["spec"] for s in client.list(RESOURCE_SLICE).items]
    assert (pool["nodeName"], pool["driver"], len(pool["devices"])) == ("agent-dra-0", "gpu.nvidia.com", 4)
    first = client.get(LEASE, "agent-dp-0", namespace="kube-node-lease")["spec"]
    assert first["holderIdentity"] == "agent-dp-0"
    renewed = wait(
        "a Lease renewal",
        lambda: (
            client.get(LEASE, "agent-dp-0", namespace="kube-node-lease")["spec"]["renewTime"]
            != first["renewTime"]
        ),
        timeout=30,
    )
    assert renewed


def test_real_controllers_and_scheduler_place_the_workloads_and_the_agents_run_them(
    agents: AgentsHandle, client: KubeClient
) -> None:
    pods = wait("both pods Running with allocatedResourcesStatus", lambda: running_pods(client))
    assert sorted(pods) == list(NODES)
    assert [r["name"] for r in allocated_statuses(pods["agent-dp-0"])] == ["nvidia.com/gpu"]
    assert [r["name"] for r in allocated_statuses(pods["agent-dra-0"])] == ["claim:gpus/gpus"]
    for pod in pods.values():
        for entry in allocated_statuses(pod):
            assert [r["health"] for r in entry["resources"]] == ["Healthy", "Healthy"]
    owners = {p["metadata"]["ownerReferences"][0]["kind"] for p in pods.values()}
    assert owners == {"Job", "ReplicaSet"}  # made by the real Job and ReplicaSet controllers
    scheduled = [
        e
        for e in client.list(EVENTS).items
        if e.get("reason") == "Scheduled"
        and e["involvedObject"]["name"] in {p["metadata"]["name"] for p in pods.values()}
    ]
    assert len(scheduled) == 2
    assert {e.get("reportingComponent") or e["source"].get("component") for e in scheduled} == {
        "default-scheduler"
    }
    # The real scheduler allocated the claim from the agents' slice; the pod holds what it allocated.
    (claim,) = client.list(RESOURCE_CLAIM, namespace="research").items
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["pool"] for r in results} == {"agent-dra-0"}
    # allocatedResourcesStatus names each device by its CDI id, `<claim uid>-gpu-<i>`.
    held = {
        "gpu-" + r["resourceID"].rsplit("-", 1)[1]
        for e in allocated_statuses(pods["agent-dra-0"])
        for r in e["resources"]
    }
    assert held == {r["device"] for r in results}


def test_a_fault_turns_the_device_unhealthy_in_the_pods_status(
    agents: AgentsHandle, client: KubeClient
) -> None:
    pods = wait("both pods Running", lambda: running_pods(client))
    rid = allocated_statuses(pods["agent-dp-0"])[0]["resources"][0]["resourceID"]
    gpu = agents.call(lambda a: next(g.index for g in a.fleet.nodes["agent-dp-0"].gpus if g.uuid == rid))
    agents.inject({"fault": "device-unhealthy", "device": {"node": "agent-dp-0", "gpu": gpu}})

    def unhealthy() -> bool:
        pod = client.get(POD, pods["agent-dp-0"]["metadata"]["name"], namespace="inference")
        return any(
            r["resourceID"] == rid and r["health"] == "Unhealthy"
            for e in allocated_statuses(pod)
            for r in e["resources"]
        )

    wait("the device Unhealthy in the pod's status", unhealthy)
    wait(
        "allocatable nvidia.com/gpu lowered to 3",
        lambda: client.get(NODE, "agent-dp-0")["status"]["allocatable"]["nvidia.com/gpu"] == "3",
    )


@pytest.mark.timeout(240)  # the controller's own 50 s grace period, in real time
def test_a_stopped_kubelet_is_unknown_under_the_real_node_lifecycle_controller_until_it_posts_ready(
    agents: AgentsHandle, client: KubeClient
) -> None:
    agents.inject({"fault": "kubelet-stop", "node": "agent-dra-0"})  # until recovered below

    def unknown_and_tainted() -> dict[str, Any] | None:
        node = client.get(NODE, "agent-dra-0")
        # Two passes of the controller: the NoSchedule taint first, the NoExecute one after.
        taints = {(t["key"], t["effect"]) for t in node["spec"].get("taints") or ()}
        wanted = {("node.kubernetes.io/unreachable", e) for e in ("NoSchedule", "NoExecute")}
        return node if ready(node) == "Unknown" and taints == wanted else None

    unknown = wait(
        "Ready=Unknown and the unreachable taints", unknown_and_tainted, timeout=NODE_MONITOR_GRACE * 2
    )
    assert [c["reason"] for c in unknown["status"]["conditions"] if c["type"] == "Ready"] == [
        "NodeStatusUnknown"
    ]
    assert ready(client.get(NODE, "agent-dp-0")) == "True"  # the other kubelet kept renewing

    agents.inject({"fault": "recover", "node": "agent-dra-0"})

    def ready_untainted() -> dict[str, Any] | None:
        node = client.get(NODE, "agent-dra-0")
        return node if ready(node) == "True" and not node["spec"].get("taints") else None

    back = wait("Ready=True again, taints lifted", ready_untainted)
    assert [c["reason"] for c in back["status"]["conditions"] if c["type"] == "Ready"] == ["KubeletReady"]
