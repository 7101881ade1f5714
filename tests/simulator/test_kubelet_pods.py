"""The simulated kubelet runs every pod bound to its node, stepped with a ManualClock.

Aspects: a pod created with `spec.nodeName` is admitted (Pending, ContainerCreating), then
Running with the status shape of a real kubelet (conditions, container statuses, IPs, QoS,
allocatedResourcesStatus of a Healthy free GPU) and the events Pulled/Created/Started; device
health changes reach it like any pod; admission refuses what does not fit (OutOfcpu,
OutOfnvidia.com/gpu); finite runs (`sleep N`, annotations) end Succeeded or Failed, or restart
with a back-off under restartPolicy Always; DRA pods get their claim's allocated devices as
CDI ids; a probe pinned to a device succeeds on a Healthy device and fails on one that breaks.
The device manager hands out any free device its plugin reports Healthy, whatever gpuhealth's
node annotation says, and never an Unhealthy one; the one exception, a simulator-only
affordance (docs/simulator.md, "The fleet's seam and the two control planes"), is a probe pinned to its
device by `gpuhealth.io/probe-device`, which gets that device even when it is Unhealthy.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import DeviceRef, Fault, from_dict


def scenario(path: str, gpus: int = 4) -> dict[str, Any]:
    return {
        "settings": {"statusSyncInterval": "10s"},
        "fleet": [{"name": "n", "count": 1, "gpusPerNode": gpus, "path": path}],
        "workloads": [{"name": "w", "replicas": 1, "gpusPerPod": 2}],
    }


async def running(data: dict[str, Any]) -> AsyncIterator[tuple[Fleet, Store]]:
    clock = ManualClock()
    store = Store(clock, seed=5)
    fleet = Fleet(from_dict(data), store, clock)
    await fleet.start()
    task = asyncio.create_task(fleet.follow_deletions())
    await asyncio.sleep(0)
    yield fleet, store
    fleet.stop()
    await task


@pytest.fixture
async def dp() -> AsyncIterator[tuple[Fleet, Store]]:
    async for pair in running(scenario("device-plugin")):
        yield pair


@pytest.fixture
async def dra() -> AsyncIterator[tuple[Fleet, Store]]:
    async for pair in running(scenario("dra")):
        yield pair


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def api_pod(
    name: str,
    *,
    node: str | None = "n-0",
    gpus: int = 1,
    cpu: str = "1",
    command: list[str] | None = None,
    restart: str = "Never",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    container: dict[str, Any] = {"name": "main", "image": "busybox:1.36", "resources": resources}
    if command is not None:
        container["command"] = command
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
        "spec": {"containers": [container], "restartPolicy": restart, **spec},
    }
    if labels:
        body["metadata"]["labels"] = labels
    if node is not None:
        body["spec"]["nodeName"] = node
    return body


async def create(store: Store, body: dict[str, Any]) -> None:
    store.create("pods", body, namespace="default")
    await settle()


def get(store: Store, name: str) -> dict[str, Any]:
    return store.get("pods", name, "default")


def events(store: Store, name: str) -> list[tuple[str, str]]:
    items, _ = store.list("events", "default")
    return [(e["reason"], e["type"]) for e in items if e["involvedObject"]["name"] == name]


async def test_a_pod_bound_by_the_api_runs_with_the_status_a_kubelet_writes(dp: tuple[Fleet, Store]) -> None:
    fleet, store = dp
    scenario_ids = {
        r["resourceID"]
        for p in store.list("pods")[0]
        for r in p["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"]
    }
    await create(store, api_pod("client", gpus=1))
    pending = get(store, "client")
    assert pending["status"]["phase"] == "Pending"
    assert pending["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}
    await fleet.advance(1)
    pod = get(store, "client")
    status = pod["status"]
    assert status["phase"] == "Running"
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {
        "PodScheduled": "True", "Initialized": "True", "ContainersReady": "True", "Ready": "True",
        "PodReadyToStartContainers": "True",
    }  # fmt: skip
    assert status["hostIP"] == "10.0.0.0" and status["podIP"] and status["startTime"]
    assert status["qosClass"] == "Burstable"
    (cs,) = status["containerStatuses"]
    assert cs["ready"] and cs["started"] and cs["restartCount"] == 0
    assert cs["state"]["running"]["startedAt"]
    assert cs["image"] == "busybox:1.36" and cs["imageID"].startswith("busybox:1.36@sha256:")
    assert cs["containerID"].startswith("containerd://")
    [(name, rows)] = [(a["name"], a["resources"]) for a in cs["allocatedResourcesStatus"]]
    assert name == "nvidia.com/gpu"
    [row] = rows
    assert row["health"] == "Healthy" and row["resourceID"] not in scenario_ids
    assert [r for r, _ in events(store, "client")] == ["Pulled", "Created", "Started"]

    # Health changes reach it as they reach the scenario's pods.
    index = next(i for i in range(4) if gpu_uuid("n-0", i) == row["resourceID"])
    fleet.inject(Fault(at=fleet.now(), kind="device-unhealthy", device=DeviceRef("n-0", index)))
    await fleet.advance(0)
    cs = get(store, "client")["status"]["containerStatuses"][0]
    assert cs["allocatedResourcesStatus"][0]["resources"][0]["health"] == "Unhealthy"
    assert fleet.status()["pods"] == 2


async def test_admission_refuses_what_does_not_fit(dp: tuple[Fleet, Store]) -> None:
    fleet, store = dp
    await create(store, api_pod("hungry", gpus=0, cpu="500"))
    status = get(store, "hungry")["status"]
    assert status["phase"] == "Failed"
    assert status["reason"] == "OutOfcpu"
    assert status["message"] == (
        "Pod was rejected: Node didn't have enough resource: cpu, "
        "requested: 500000, used: 4000, capacity: 191500"
    )
    assert events(store, "hungry") == [("OutOfcpu", "Warning")]
    await create(store, api_pod("greedy", gpus=3))
    status = get(store, "greedy")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "OutOfnvidia.com/gpu")
    assert "requested: 3, used: 2, capacity: 4" in status["message"]
    await fleet.advance(30)
    assert get(store, "greedy")["status"]["phase"] == "Failed"  # never retried


async def test_finite_runs_succeed_fail_or_restart_as_the_restart_policy_says(
    dp: tuple[Fleet, Store],
) -> None:
    fleet, store = dp
    await create(store, api_pod("job", gpus=0, command=["sh", "-c", "sleep 30"]))
    await create(store, api_pod("bad", gpus=0, annotations={"sim.gpuhealth.io/run-seconds": "5s",
                                                          "sim.gpuhealth.io/exit-code": "3"}))  # fmt: skip
    await create(
        store,
        api_pod("server", gpus=1, restart="Always", annotations={"sim.gpuhealth.io/run-seconds": "5"}),
    )
    await fleet.advance(1)
    assert get(store, "job")["status"]["phase"] == "Running"
    await fleet.advance(6)
    bad = get(store, "bad")["status"]
    assert bad["phase"] == "Failed"
    assert bad["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    server = get(store, "server")["status"]
    assert server["phase"] == "Running"
    (cs,) = server["containerStatuses"]
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert cs["lastState"]["terminated"]["exitCode"] == 0
    assert ("BackOff", "Warning") in events(store, "server")
    await fleet.advance(10)  # the first back-off is 10 s
    (cs,) = get(store, "server")["status"]["containerStatuses"]
    assert cs["restartCount"] == 1 and "running" in cs["state"] and cs["ready"]
    assert cs["lastState"]["terminated"]["reason"] == "Completed"
    await fleet.advance(20)
    job = get(store, "job")["status"]
    assert job["phase"] == "Succeeded"
    terminated = job["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    ready = next(c for c in job["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PodCompleted")


async def test_dra_pods_get_their_claims_allocated_devices(dra: tuple[Fleet, Store]) -> None:
    fleet, store = dra
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mine", "namespace": "default"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }
    created = store.create("resourceclaims.resource.k8s.io", claim, namespace="default")
    allocation = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n-0", "device": "gpu-3"}]
            }
        }
    }
    store.mutate(
        "resourceclaims.resource.k8s.io", "mine", "default",
        lambda o: {**o, "status": allocation}, subresource="status",
    )  # fmt: skip
    body = api_pod("dra-client", gpus=0)
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "mine"}]
    body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    await create(store, body)
    await fleet.advance(1)
    (cs,) = get(store, "dra-client")["status"]["containerStatuses"]
    [entry] = cs["allocatedResourcesStatus"]
    assert entry["name"] == "claim:gpu"
    assert entry["resources"] == [
        {"resourceID": f"k8s.gpu.nvidia.com/claim={created['metadata']['uid']}-gpu-3", "health": "Healthy"}
    ]
    fleet.inject(Fault(at=fleet.now(), kind="device-unhealthy", device=DeviceRef("n-0", 3), message="xid 79"))
    await fleet.advance(0)
    (cs,) = get(store, "dra-client")["status"]["containerStatuses"]
    assert cs["allocatedResourcesStatus"][0]["resources"][0]["health"] == "Unhealthy"


async def test_the_device_manager_ignores_the_annotation_and_only_a_pinned_probe_picks_its_device(
    dp: tuple[Fleet, Store],
) -> None:
    fleet, store = dp
    quarantined, broken = gpu_uuid("n-0", 2), gpu_uuid("n-0", 3)

    def annotate(obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"].setdefault("annotations", {})["gpuhealth.io/quarantined-devices"] = (
            f'["{quarantined}"]'
        )
        return obj

    store.mutate("nodes", "n-0", None, annotate)
    await create(store, api_pod("plain"))
    await fleet.advance(2)
    (cs,) = get(store, "plain")["status"]["containerStatuses"]
    # The first free device its plugin reports Healthy: the quarantined one, as on a real node.
    assert [r["resourceID"] for r in cs["allocatedResourcesStatus"][0]["resources"]] == [quarantined]

    fleet.inject(Fault(at=fleet.now(), kind="device-unhealthy", device=DeviceRef("n-0", 3)))
    await fleet.advance(1)
    assert store.get("nodes", "n-0")["status"]["allocatable"]["nvidia.com/gpu"] == "3"
    await create(store, api_pod("plain-2"))
    await fleet.advance(2)
    refused = get(store, "plain-2")["status"]
    assert (refused["phase"], refused["reason"]) == ("Failed", "OutOfnvidia.com/gpu")

    # The affordance: a probe named after the Unhealthy device gets it (a real kubelet cannot be told).
    await create(store, api_pod("probe", annotations={"gpuhealth.io/probe-device": broken}))
    await fleet.advance(2)
    (cs,) = get(store, "probe")["status"]["containerStatuses"]
    resources = cs["allocatedResourcesStatus"][0]["resources"]
    assert [(r["resourceID"], r["health"]) for r in resources] == [(broken, "Unhealthy")]


async def test_a_probe_pinned_to_a_device_judges_its_health(dp: tuple[Fleet, Store]) -> None:
    fleet, store = dp
    good, bad = gpu_uuid("n-0", 2), gpu_uuid("n-0", 3)
    await create(store, api_pod("probe-good", annotations={"gpuhealth.io/probe-device": good}))
    await create(store, api_pod("probe-bad", annotations={"gpuhealth.io/probe-device": bad}))
    await fleet.advance(4)
    (cs,) = get(store, "probe-bad")["status"]["containerStatuses"]
    assert cs["allocatedResourcesStatus"][0]["resources"][0]["resourceID"] == bad
    fleet.inject(Fault(at=fleet.now(), kind="device-unhealthy", device=DeviceRef("n-0", 3), duration=2.0))
    await fleet.advance(10)  # the device came back before the probe ended: the probe still fails
    good_status, bad_status = get(store, "probe-good")["status"], get(store, "probe-bad")["status"]
    assert good_status["phase"] == "Succeeded"
    assert bad_status["phase"] == "Failed"
    assert bad_status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
