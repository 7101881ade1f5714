"""The simulated kubelet runs every pod bound to its node, stepped with a ManualClock.

Aspects: a pod created with `spec.nodeName` is admitted (Pending, ContainerCreating), then
Running with the status shape of a real kubelet (conditions, container statuses, IPs, QoS,
allocatedResourcesStatus of a Healthy free GPU) and the events Pulled/Created/Started; device
health changes reach it like any pod; admission refuses what does not fit (OutOfcpu,
OutOfnvidia.com/gpu); finite runs (`sleep N`, annotations) end Succeeded or Failed, or restart
with a back-off under restartPolicy Always; DRA pods get their claim's allocated devices as
CDI ids. The device manager hands out any free device its plugin reports Healthy, whatever
gpuhealth's node annotation or a pod's annotations say, and never an Unhealthy one. As the
NVIDIA container runtime does, a pod with no GPU request reaches the GPUs its
`NVIDIA_VISIBLE_DEVICES` names (uuids, indexes, `all`, `none`; an unknown one fails the
container at start), unknown to the kubelet. A GPU program (the CUDA sample `vectorAdd`)
succeeds when every GPU it reached stayed Healthy and fails when one broke during its run,
even briefly, when DCGM fails one of its health watches (a plugin-Healthy card), or when it
reached none: on a DRA pod that is the device its claim's allocation
names, whatever its selectors asked for. A pod worker's step whose write the API server refused
(503: an apiserver restarting) runs again a status sync later, the admission's own write too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.objects import gpu_uuid
from simulator.fleet.pod_runner_spec import visible_gpus
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


def check_pod(
    name: str, visible: str | None, *, command: list[str] | None = None, **kw: Any
) -> dict[str, Any]:
    """A pod with no GPU request running a GPU program, the runtime told which GPU to expose.
    (DCGM's diagnostic is no model of its own: tests/simulator/test_kubelet_programs.py.)"""
    body = api_pod(name, gpus=0, command=command or ["/cuda-samples/vectorAdd"], **kw)
    if visible is not None:
        body["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": visible}]
    return body


def exit_code(store: Store, name: str) -> tuple[str, int]:
    status = get(store, name)["status"]
    return status["phase"], status["containerStatuses"][0]["state"]["terminated"]["exitCode"]


def test_nvidia_visible_devices_is_read_as_the_nvidia_runtime_reads_it() -> None:
    uuids = ("GPU-a", "GPU-b", "GPU-c")
    assert visible_gpus(("all",), uuids) == (0, 1, 2)
    for nothing in ("none", "void", "", " "):
        assert visible_gpus((nothing,), uuids) == ()
    assert visible_gpus(("GPU-c,GPU-a",), uuids) == (0, 2)
    assert visible_gpus(("1, GPU-c",), uuids) == (1, 2)
    assert visible_gpus(("GPU-b", "0"), uuids) == (0, 1)  # two containers: what either sees
    assert visible_gpus(("GPU-x",), uuids) is None
    assert visible_gpus(("3",), uuids) is None
    assert visible_gpus(("GPU-a,MIG-1",), uuids) is None


async def test_a_pod_without_a_gpu_request_reaches_the_gpu_its_env_names(dp: tuple[Fleet, Store]) -> None:
    fleet, store = dp
    good, bad = gpu_uuid("n-0", 2), gpu_uuid("n-0", 3)
    await create(store, check_pod("diag-good", good))
    await create(store, check_pod("diag-bad", bad))
    await fleet.advance(4)
    (cs,) = get(store, "diag-bad")["status"]["containerStatuses"]
    assert "running" in cs["state"]
    assert "allocatedResourcesStatus" not in cs  # the kubelet allocated nothing: it knows nothing
    # So the device plugin still hands out the very GPUs the runtime exposed to them.
    await create(store, api_pod("tenant", gpus=2))
    await fleet.advance(2)
    (tenant,) = get(store, "tenant")["status"]["containerStatuses"]
    assert {r["resourceID"] for r in tenant["allocatedResourcesStatus"][0]["resources"]} == {good, bad}
    fleet.inject(Fault(at=fleet.now(), kind="device-unhealthy", device=DeviceRef("n-0", 3), duration=2.0))
    await fleet.advance(10)  # the device came back before the diagnostic ended: it still fails
    assert exit_code(store, "diag-good") == ("Succeeded", 0)
    assert exit_code(store, "diag-bad") == ("Failed", 1)


async def test_a_diagnostic_follows_the_exposed_gpu_not_an_annotation(dp: tuple[Fleet, Store]) -> None:
    fleet, store = dp
    broken, healthy = gpu_uuid("n-0", 3), gpu_uuid("n-0", 2)
    fleet.inject(Fault(at=fleet.now(), kind="device-unhealthy", device=DeviceRef("n-0", 3)))
    await fleet.advance(1)
    old = {"gpuhealth.io/probe-device": healthy}
    # The annotation pins nothing: the runtime exposes the broken GPU, so the diagnostic fails.
    await create(store, check_pod("exposed", broken, annotations=old))
    # Without the env it sees no GPU at all, annotated or not, and fails too.
    await create(store, check_pod("annotated", None, annotations=old))
    # A pod asking for a GPU gets a free Healthy one, never the one its annotation names.
    await create(store, api_pod("asks", annotations={"gpuhealth.io/probe-device": broken}))
    await fleet.advance(12)
    assert exit_code(store, "exposed") == ("Failed", 1)
    assert exit_code(store, "annotated") == ("Failed", 1)
    (cs,) = get(store, "asks")["status"]["containerStatuses"]
    [row] = cs["allocatedResourcesStatus"][0]["resources"]
    assert row["resourceID"] != broken and row["health"] == "Healthy"


async def test_a_diagnostic_fails_on_a_gpu_dcgm_fails_though_its_plugin_reports_it_healthy(
    dp: tuple[Fleet, Store],
) -> None:
    fleet, store = dp
    failing, passing = gpu_uuid("n-0", 1), gpu_uuid("n-0", 2)
    fleet.inject(Fault(at=fleet.now(), kind="health-watch", device=DeviceRef("n-0", 1), watch="PCIE"))
    await fleet.advance(1)
    await create(store, check_pod("watch-failing", failing))
    await create(store, check_pod("watch-passing", passing))
    await fleet.advance(12)
    assert fleet.gpu("n-0", 1).reported == "Healthy"  # nothing the plugin or the kubelet sees
    assert exit_code(store, "watch-failing") == ("Failed", 1)
    assert exit_code(store, "watch-passing") == ("Succeeded", 0)
    fleet.inject(Fault(at=fleet.now(), kind="recover", device=DeviceRef("n-0", 1)))
    await fleet.advance(1)
    await create(store, check_pod("watch-recovered", failing))
    await fleet.advance(12)
    assert exit_code(store, "watch-recovered") == ("Succeeded", 0)


async def test_the_canary_workload_and_all_and_unknown_gpus(dp: tuple[Fleet, Store]) -> None:
    fleet, store = dp
    vector_add = ["/cuda-samples/vectorAdd"]
    await create(store, check_pod("every", "all", command=vector_add))
    await create(store, check_pod("one", gpu_uuid("n-0", 1), command=vector_add))
    await create(store, check_pod("elsewhere", gpu_uuid("n-1", 0)))  # not this node's GPU
    await fleet.advance(1)
    # The runtime refuses a GPU the node lacks: the container never runs.
    assert exit_code(store, "elsewhere") == ("Failed", 128)
    fleet.inject(Fault(at=fleet.now(), kind="xid", device=DeviceRef("n-0", 0), xid=79, unhealthy=False))
    await fleet.advance(12)
    assert exit_code(store, "one") == ("Succeeded", 0)
    assert exit_code(store, "every") == ("Failed", 1)  # it saw GPU 0's fatal XID


async def test_a_dra_pod_runs_on_the_device_its_allocation_names(dra: tuple[Fleet, Store]) -> None:
    fleet, store = dra
    # Its selector asks for GPU 2, but the allocation (the scheduler's word) gave it GPU 3:
    # what the pod runs on, and what its outcome follows, is GPU 3.
    wanted = f'device.attributes["gpu.nvidia.com"].uuid == "{gpu_uuid("n-0", 2)}"'
    request = {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": wanted}}]}
    for name, device in (("on-3", "gpu-3"), ("on-2", "gpu-2")):
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        }
        store.create("resourceclaims.resource.k8s.io", claim, namespace="default")
        result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n-0", "device": device}
        allocation = {"allocation": {"devices": {"results": [result]}}}
        store.mutate(
            "resourceclaims.resource.k8s.io", name, "default",
            lambda o, a=allocation: {**o, "status": a}, subresource="status",
        )  # fmt: skip
        body = check_pod(name, None)
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
        body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
        await create(store, body)
    await fleet.advance(2)
    fleet.inject(Fault(at=fleet.now(), kind="device-unhealthy", device=DeviceRef("n-0", 3), message="xid 79"))
    await fleet.advance(10)
    assert exit_code(store, "on-3") == ("Failed", 1)
    assert exit_code(store, "on-2") == ("Succeeded", 0)


async def test_a_start_the_api_server_refused_runs_again_a_status_sync_later(dp: tuple[Fleet, Store]) -> None:
    """An apiserver restarting refuses the pod worker's write (503): the pod is started on a later
    sync, as a real kubelet's pod worker syncs again, never left in ContainerCreating."""
    fleet, store = dp
    mutate = fleet.node_api.mutate
    writes: list[str] = []
    refused: list[str] = []

    def unavailable_once(resource: str, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "client":
            writes.append(name)
            if len(writes) == 2:  # the first is the admission's Pending, the second the start
                refused.append(name)
                raise ApiError(503, "ServiceUnavailable", "the apiserver is restarting")
        return mutate(resource, name, *args, **kwargs)

    fleet.node_api.mutate = unavailable_once  # type: ignore[method-assign]
    await create(store, api_pod("client", gpus=1))
    await fleet.advance(1)
    assert refused == ["client"]
    assert get(store, "client")["status"]["containerStatuses"][0]["state"] == {
        "waiting": {"reason": "ContainerCreating"}
    }
    await fleet.advance(10)  # the scenario's statusSyncInterval
    assert get(store, "client")["status"]["phase"] == "Running"


async def test_an_admission_the_api_server_refused_runs_the_pod_a_status_sync_later(
    dp: tuple[Fleet, Store],
) -> None:
    """The admission's own write (Pending, ContainerCreating) refused by an apiserver restarting:
    the pod still starts, a status sync later. It was left admitted but never started, its
    start never scheduled: a check pod bound just before a kube-apiserver restart that never
    finished (`docs/reliability.md`, "On the real control plane")."""
    fleet, store = dp
    mutate = fleet.node_api.mutate
    refused: list[str] = []

    def unavailable_once(resource: str, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "client" and not refused:
            refused.append(name)
            raise ApiError(503, "ServiceUnavailable", "the apiserver is restarting")
        return mutate(resource, name, *args, **kwargs)

    fleet.node_api.mutate = unavailable_once  # type: ignore[method-assign]
    await create(store, api_pod("client", gpus=1))
    await fleet.advance(1)
    assert refused == ["client"]
    await fleet.advance(10)  # the scenario's statusSyncInterval
    assert get(store, "client")["status"]["phase"] == "Running"
    assert [r for r, _ in events(store, "client")].count("Started") == 1


async def test_a_readiness_gate_holds_ready_until_its_condition_is_true_and_takes_it_back_when_false(
    dp: tuple[Fleet, Store],
) -> None:
    # As a real kubelet: Ready needs every readiness gate's condition True (reason
    # ReadinessGatesNotReady otherwise), a condition written by someone else through pods/status
    # is read into Ready at the kubelet's next sync, and the kubelet's own status writes keep it.
    fleet, store = dp
    gate = {"conditionType": "example.com/serving"}
    await create(store, api_pod("gated", gpus=0, readinessGates=[gate]))
    await fleet.advance(1)
    status = get(store, "gated")["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Running" and conditions["ContainersReady"]["status"] == "True"
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "ReadinessGatesNotReady"
    assert conditions["Ready"]["message"] == (
        'corresponding condition of pod readiness gate "example.com/serving" does not exist.'
    )

    def serving(value: str) -> dict[str, Any]:
        pod = get(store, "gated")
        kept = [c for c in pod["status"]["conditions"] if c["type"] != "example.com/serving"]
        condition = {"type": "example.com/serving", "status": value, "reason": "Test"}
        return {
            "metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]},
            "status": {"conditions": [*kept, condition]},
        }

    store.patch(
        "pods", "gated", "default", serving("True"), "application/merge-patch+json", subresource="status"
    )
    await fleet.advance(1)
    conditions = {c["type"]: c for c in get(store, "gated")["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True" and "reason" not in conditions["Ready"]

    store.patch(
        "pods", "gated", "default", serving("False"), "application/merge-patch+json", subresource="status"
    )
    await fleet.advance(30)  # status syncs pass: the gate's condition stays, Ready follows it
    conditions = {c["type"]: c for c in get(store, "gated")["status"]["conditions"]}
    assert conditions["example.com/serving"]["status"] == "False"
    assert conditions["Ready"]["status"] == "False" and conditions["ContainersReady"]["status"] == "True"
    assert conditions["Ready"]["message"] == (
        'the status of pod readiness gate "example.com/serving" is not "True", but False'
    )
