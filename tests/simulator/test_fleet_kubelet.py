"""The simulated kubelet's quirks, stepped with a ManualClock (no sleeping).

Aspects: device plugins report only Healthy/Unhealthy (no message, no Unknown) and lower node
allocatable; health changes are pushed promptly; DRA devices turn Unknown 30 s after their last
report, but only at a status sync (a stale Healthy lingers until then); a broken DRA health
stream makes all the driver's devices Unknown; init containers are never filled; terminated
pods are not updated; DRA messages are cut at 1024 characters; the Lease stops while the node
is partitioned (and the node goes Ready=Unknown) and resumes after; time-slicing replicas are
`<uuid>::<n>`; flapping; ResourceSlice taints; every object kind is a valid Kubernetes shape; a
kubelet without `ResourceHealthStatus` (before 1.36) writes no `allocatedResourcesStatus`.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import DeviceHealthChanged, Fleet, FleetEvent
from simulator.fleet.objects import DRA_PLUGIN_NAMESPACE, gpu_uuid
from simulator.scenario import Fault, from_dict


async def make_fleet(data: dict[str, Any]) -> tuple[Fleet, Store, ManualClock]:
    clock = ManualClock()
    store = Store(clock, seed=1)
    fleet = Fleet(from_dict(data), store, clock)
    await fleet.start()
    return fleet, store, clock


def one_node(path: str, gpus: int = 4, **group: Any) -> dict[str, Any]:
    return {
        "settings": {"statusSyncInterval": "10s", "leaseRenewInterval": "10s"},
        "fleet": [{"name": "n", "count": 1, "gpusPerNode": gpus, "path": path, **group}],
        "workloads": [{"name": "w", "replicas": 2, "gpusPerPod": 2}],
    }


def pod_named(store: Store, prefix: str = "w-") -> dict[str, Any]:
    pods, _ = store.list("pods")
    return next(p for p in pods if p["metadata"]["name"].startswith(prefix))


def health_rows(pod: dict[str, Any]) -> list[dict[str, Any]]:
    (cs,) = pod["status"]["containerStatuses"]
    return [r for entry in cs.get("allocatedResourcesStatus", []) for r in entry["resources"]]


def all_rows(store: Store) -> dict[str, dict[str, Any]]:
    pods, _ = store.list("pods")
    # The DRA driver's kubelet plugin pods hold no device (and nobody runs them here).
    workloads = [p for p in pods if p["metadata"]["namespace"] != DRA_PLUGIN_NAMESPACE]
    return {r["resourceID"]: r for p in workloads for r in health_rows(p)}


def inject(fleet: Fleet, **fault: Any) -> None:
    fleet.inject(Fault(at=fleet.now(), **fault))


def dev(node: str, gpu: int) -> Any:
    from simulator.scenario import DeviceRef

    return DeviceRef(node, gpu)


async def test_device_plugin_reports_healthy_or_unhealthy_only_and_lowers_allocatable() -> None:
    fleet, store, _ = await make_fleet(one_node("device-plugin"))
    assert {r["health"] for r in all_rows(store).values()} == {"Healthy"}
    inject(fleet, kind="device-unhealthy", device=dev("n-0", 1), message="driver says so")
    await fleet.advance(0)
    row = all_rows(store)[gpu_uuid("n-0", 1)]
    assert row == {"resourceID": gpu_uuid("n-0", 1), "health": "Unhealthy"}  # no message on this path
    node = store.get("nodes", "n-0")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "3"

    # A device plugin cannot say Unknown: a silent device stays Healthy, however long.
    inject(fleet, kind="device-unknown", device=dev("n-0", 2), duration=600.0)
    await fleet.advance(120)
    assert all_rows(store)[gpu_uuid("n-0", 2)]["health"] == "Healthy"
    # A broken ListAndWatch stream: the kubelet marks every device of the resource Unhealthy.
    inject(fleet, kind="health-stream-broken", node="n-0", duration=30.0)
    await fleet.advance(0)
    assert {r["health"] for r in all_rows(store).values()} == {"Unhealthy"}
    assert store.get("nodes", "n-0")["status"]["allocatable"]["nvidia.com/gpu"] == "0"
    await fleet.advance(30)
    assert store.get("nodes", "n-0")["status"]["allocatable"]["nvidia.com/gpu"] == "3"


async def test_a_kubelet_without_resource_health_status_names_no_pods_devices() -> None:
    fleet, store, _ = await make_fleet(one_node("device-plugin", resourceHealthStatus=False))
    pods, _ = store.list("pods")
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert len(running) == 2
    statuses = [cs for p in running for cs in p["status"]["containerStatuses"]]
    assert statuses and all("allocatedResourcesStatus" not in cs for cs in statuses)
    # Its plugin's word still lowers allocatable; a pod's status still says nothing of it.
    inject(fleet, kind="device-unhealthy", device=dev("n-0", 1), message="driver says so")
    await fleet.advance(30)
    assert store.get("nodes", "n-0")["status"]["allocatable"]["nvidia.com/gpu"] == "3"
    assert all_rows(store) == {}


async def test_device_plugin_health_change_is_pushed_without_waiting_for_a_sync() -> None:
    fleet, store, _ = await make_fleet(one_node("device-plugin"))
    await fleet.advance(3)  # between two periodic syncs (they fall at 5 s, 15 s, ...)
    pod = pod_named(store)
    rv = pod["metadata"]["resourceVersion"]
    first_gpu = health_rows(pod)[0]["resourceID"]
    index = next(i for i in range(4) if gpu_uuid("n-0", i) == first_gpu)
    inject(fleet, kind="xid", device=dev("n-0", index), xid=79, unhealthy=True)
    await fleet.advance(0)
    pod = pod_named(store)
    assert health_rows(pod)[0]["health"] == "Unhealthy"
    assert pod["metadata"]["resourceVersion"] != rv


async def test_dra_device_goes_unknown_after_the_timeout_but_only_at_a_sync() -> None:
    fleet, store, _ = await make_fleet(one_node("dra"))
    # One node: its periodic syncs fall at 5 s, 15 s, 25 s, ...
    await fleet.advance(7)
    inject(fleet, kind="device-unknown", device=dev("n-0", 0), duration=100.0)
    await fleet.advance(0)
    [gpu0] = [r for rid, r in all_rows(store).items() if rid.endswith("-gpu-0")]
    assert gpu0["health"] == "Healthy"
    await fleet.advance(33)  # t=40: the last report is 33 s old, past the 30 s timeout...
    [gpu0] = [r for rid, r in all_rows(store).items() if rid.endswith("-gpu-0")]
    assert gpu0["health"] == "Healthy"  # ...yet the stale Healthy lingers until the next sync
    await fleet.advance(5)  # t=45: the sync evaluates expiry
    [gpu0] = [r for rid, r in all_rows(store).items() if rid.endswith("-gpu-0")]
    assert gpu0["health"] == "Unknown"
    assert "message" not in gpu0
    await fleet.advance(62)  # t=107: reports resume; the stream pushes Healthy at once
    [gpu0] = [r for rid, r in all_rows(store).items() if rid.endswith("-gpu-0")]
    assert gpu0["health"] == "Healthy"


async def test_broken_dra_health_stream_makes_every_device_of_the_driver_unknown() -> None:
    fleet, store, _ = await make_fleet(one_node("dra"))
    inject(fleet, kind="health-stream-broken", node="n-0", duration=50.0)
    await fleet.advance(0)
    assert {r["health"] for r in all_rows(store).values()} == {"Unknown"}
    await fleet.advance(50)
    assert {r["health"] for r in all_rows(store).values()} == {"Healthy"}


async def test_dra_message_is_cut_at_1024_characters_and_names_use_the_pod_claim() -> None:
    data = one_node("dra")
    data["workloads"] = [
        {"name": "a", "replicas": 1, "gpusPerPod": 2, "draStatusName": "request"},
        {"name": "b", "replicas": 1, "gpusPerPod": 2, "draStatusName": "claim", "draClaim": "direct"},
    ]
    fleet, store, _ = await make_fleet(data)
    long_message = "".join(chr(ord("a") + i % 26) for i in range(3000))
    inject(fleet, kind="device-unhealthy", device=dev("n-0", 0), message=long_message)
    await fleet.advance(0)
    pod_a = pod_named(store, "a-")
    row = health_rows(pod_a)[0]
    assert row["health"] == "Unhealthy"
    assert row["message"] == long_message[:1024]
    assert pod_a["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["name"] == "claim:gpus/gpus"
    # The API: "claim_name" and "request" must match one of the claims of this container.
    assert pod_a["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpus", "request": "gpus"}]
    assert pod_a["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "a-gpus"
    claim_name = pod_a["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = store.get("resourceclaims.resource.k8s.io", claim_name, "default")
    assert row["resourceID"] == f"k8s.gpu.nvidia.com/claim={claim['metadata']['uid']}-gpu-0"
    assert claim["status"]["allocation"]["devices"]["results"][0] == {
        "request": "gpus",
        "driver": "gpu.nvidia.com",
        "pool": "n-0",
        "device": "gpu-0",
    }
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": pod_a["metadata"]["name"], "uid": pod_a["metadata"]["uid"]}
    ]
    pod_b = pod_named(store, "b-")
    assert pod_b["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["name"] == "claim:gpus"
    assert pod_b["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpus"}]
    assert pod_b["spec"]["resourceClaims"][0]["resourceClaimName"] == f"{pod_b['metadata']['name']}-gpus"


async def test_init_containers_never_get_allocated_resources_status() -> None:
    data = one_node("device-plugin")
    data["workloads"][0]["initContainer"] = True
    fleet, store, _ = await make_fleet(data)
    inject(fleet, kind="device-unhealthy", device=dev("n-0", 0))
    await fleet.advance(20)
    pods, _ = store.list("pods")
    for pod in pods:
        (init,) = pod["status"]["initContainerStatuses"]
        assert "allocatedResourcesStatus" not in init
        assert "allocatedResourcesStatus" in pod["status"]["containerStatuses"][0]


async def test_terminated_pods_are_not_updated() -> None:
    data = one_node("device-plugin")
    data["workloads"] = [
        {"name": "job", "kind": "Job", "replicas": 1, "gpusPerPod": 2, "completeAfter": "20s"}
    ]
    fleet, store, _ = await make_fleet(data)
    await fleet.advance(25)
    pod = pod_named(store, "job-")
    assert pod["status"]["phase"] == "Succeeded"
    assert "terminated" in pod["status"]["containerStatuses"][0]["state"]
    before = pod["metadata"]["resourceVersion"]
    for gpu in range(2):
        inject(fleet, kind="device-unhealthy", device=dev("n-0", gpu))
    await fleet.advance(30)
    pod = pod_named(store, "job-")
    assert pod["metadata"]["resourceVersion"] == before
    assert {r["health"] for r in health_rows(pod)} == {"Healthy"}
    job = store.get("jobs.batch", "job", "default")
    assert job["status"]["succeeded"] == 1


async def test_lease_stops_while_partitioned_and_resumes_after() -> None:
    fleet, store, _ = await make_fleet(one_node("device-plugin"))
    await fleet.advance(20)
    renewed = store.get("leases.coordination.k8s.io", "n-0", "kube-node-lease")["spec"]["renewTime"]
    assert renewed.endswith("Z") and "." in renewed  # MicroTime
    inject(fleet, kind="node-partition", node="n-0", duration=120.0)
    inject(fleet, kind="device-unhealthy", device=dev("n-0", 0))
    await fleet.advance(0)
    frozen = store.get("leases.coordination.k8s.io", "n-0", "kube-node-lease")["spec"]["renewTime"]
    await fleet.advance(60)
    assert store.get("leases.coordination.k8s.io", "n-0", "kube-node-lease")["spec"]["renewTime"] == frozen
    # No status writes: the device's Unhealthy is not in the API, the last status lingers.
    assert {r["health"] for r in all_rows(store).values()} == {"Healthy"}
    node = store.get("nodes", "n-0")
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "Unknown"
    assert {t["key"] for t in node["spec"]["taints"]} == {"node.kubernetes.io/unreachable"}
    await fleet.advance(60)
    lease = store.get("leases.coordination.k8s.io", "n-0", "kube-node-lease")
    assert lease["spec"]["renewTime"] > frozen
    assert lease["spec"]["holderIdentity"] == "n-0"
    assert lease["spec"]["leaseDurationSeconds"] == 40
    assert all_rows(store)[gpu_uuid("n-0", 0)]["health"] == "Unhealthy"
    node = store.get("nodes", "n-0")
    assert next(c for c in node["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
    assert node["spec"]["taints"] == []


async def test_time_slicing_replicas_are_uuid_double_colon_n() -> None:
    data = one_node("device-plugin", gpus=2, sharedReplicas=4)
    data["workloads"] = [{"name": "w", "replicas": 8, "gpusPerPod": 1}]
    fleet, store, _ = await make_fleet(data)
    ids = set(all_rows(store))
    assert ids == {f"{gpu_uuid('n-0', g)}::{r}" for g in range(2) for r in range(4)}
    node = store.get("nodes", "n-0")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    inject(fleet, kind="device-unhealthy", device=dev("n-0", 1))
    await fleet.advance(0)
    assert store.get("nodes", "n-0")["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    unhealthy = {rid for rid, r in all_rows(store).items() if r["health"] == "Unhealthy"}
    assert unhealthy == {f"{gpu_uuid('n-0', 1)}::{r}" for r in range(4)}


async def test_flapping_device_changes_health_each_half_period() -> None:
    fleet, _, _ = await make_fleet(one_node("device-plugin"))
    events: list[FleetEvent] = []
    fleet.listeners.append(events.append)
    inject(fleet, kind="flap", device=dev("n-0", 0), times=3, period=20.0)
    await fleet.advance(70)
    changes = [(e.old, e.new) for e in events if isinstance(e, DeviceHealthChanged)]
    assert changes == [("Healthy", "Unhealthy"), ("Unhealthy", "Healthy")] * 3


async def test_dra_driver_taints_slice_devices_on_fatal_xid_and_gpu_lost_and_recovery_clears() -> None:
    fleet, store, _ = await make_fleet(one_node("dra"))

    def taints() -> dict[str, list[str]]:
        (slice_,) = store.list("resourceslices.resource.k8s.io")[0]
        return {d["name"]: sorted(t["key"] for t in d.get("taints", [])) for d in slice_["spec"]["devices"]}

    inject(fleet, kind="xid", device=dev("n-0", 1), xid=13, unhealthy=False)
    await fleet.advance(0)
    assert taints()["gpu-1"] == []  # application XIDs are ignored
    inject(fleet, kind="xid", device=dev("n-0", 1), xid=79, unhealthy=True)
    inject(fleet, kind="gpu-lost", device=dev("n-0", 2))
    await fleet.advance(0)
    assert taints()["gpu-1"] == ["gpu.nvidia.com/xid"]
    assert taints()["gpu-2"] == ["gpu.nvidia.com/gpu-lost", "gpu.nvidia.com/xid"]
    (slice_,) = store.list("resourceslices.resource.k8s.io")[0]
    assert slice_["spec"]["pool"]["generation"] > 1
    inject(fleet, kind="recover", device=dev("n-0", 2))
    await fleet.advance(0)
    assert taints()["gpu-2"] == []
    row = next(r for rid, r in all_rows(store).items() if rid.endswith("-gpu-2"))
    assert row["health"] == "Healthy"


async def test_dra_driver_taints_a_device_it_reports_unhealthy_while_the_report_stands() -> None:
    """An idle device's failure stays visible on its slice: tainted with the Unhealthy report,
    lifted with the Healthy one (the end of a timed failure), and by a reset."""
    fleet, store, _ = await make_fleet(one_node("dra"))

    def taints() -> dict[str, list[tuple[str, str, str]]]:
        (slice_,) = store.list("resourceslices.resource.k8s.io")[0]
        return {
            d["name"]: sorted((t["key"], t.get("value", ""), t["effect"]) for t in d.get("taints", []))
            for d in slice_["spec"]["devices"]
        }

    inject(fleet, kind="device-unhealthy", device=dev("n-0", 1), message="bad", duration=60.0)
    inject(fleet, kind="device-unhealthy", device=dev("n-0", 2), message="bad")
    await fleet.advance(0)
    assert taints()["gpu-1"] == [("gpu.nvidia.com/unhealthy", "true", "NoSchedule")]
    assert taints()["gpu-0"] == []
    await fleet.advance(61)
    assert taints()["gpu-1"] == []
    assert taints()["gpu-2"] == [("gpu.nvidia.com/unhealthy", "true", "NoSchedule")]
    inject(fleet, kind="recover", device=dev("n-0", 2))
    await fleet.advance(0)
    assert taints()["gpu-2"] == []


async def test_device_plugin_failures_publish_no_slice_taint() -> None:
    fleet, store, _ = await make_fleet(one_node("device-plugin"))
    inject(fleet, kind="device-unhealthy", device=dev("n-0", 1), message="bad")
    await fleet.advance(0)
    assert store.list("resourceslices.resource.k8s.io")[0] == []


KINDS = [
    "pods",
    "nodes",
    "namespaces",
    "leases.coordination.k8s.io",
    "resourceslices.resource.k8s.io",
    "resourceclaims.resource.k8s.io",
    "jobs.batch",
    "deviceclasses.resource.k8s.io",
    "resourceclaimtemplates.resource.k8s.io",
    "runtimeclasses.node.k8s.io",
]


@pytest.mark.parametrize("kind", KINDS)
async def test_every_object_the_fleet_writes_is_a_valid_kubernetes_shape(kind: str) -> None:
    data = {
        "fleet": [
            {"name": "dp", "count": 1, "gpusPerNode": 4, "path": "device-plugin", "sharedReplicas": 2},
            {"name": "dra", "count": 1, "gpusPerNode": 4, "path": "dra"},
        ],
        "workloads": [
            {"name": "s", "replicas": 2, "gpusPerPod": 2, "path": "device-plugin", "initContainer": True},
            {"name": "j", "kind": "Job", "replicas": 1, "gpusPerPod": 2, "path": "dra", "completeAfter": 5},
            {"name": "d", "replicas": 1, "gpusPerPod": 2, "path": "dra", "draClaim": "direct"},
        ],
    }
    fleet, store, _ = await make_fleet(data)
    inject(fleet, kind="gpu-lost", device=dev("dra-0", 0))
    inject(fleet, kind="node-partition", node="dp-0", duration=100.0)
    await fleet.advance(60)
    objs, _ = store.list(kind)
    assert objs
    info = store.registry.get(kind)
    for obj in objs:
        store.validator.validate(info, obj)  # raises ApiError 422 on a bad shape


def test_each_container_reports_only_its_own_devices() -> None:
    # The device manager allocates per container: two GPU containers get their own cards, a
    # sidecar none; a claim's devices go to every container naming it.
    from simulator.fleet.objects import per_container

    def gpus(n: int) -> dict[str, Any]:
        return {"limits": {"nvidia.com/gpu": str(n)}}

    devices = [{"resourceID": f"GPU-{i}", "health": "Healthy"} for i in range(3)]
    pod = [{"name": "nvidia.com/gpu", "resources": devices}]
    mine = per_container(
        [{"name": "a", "resources": gpus(1)}, {"name": "side"}, {"name": "b", "resources": gpus(2)}], pod
    )
    assert [[r["resourceID"] for e in own for r in e["resources"]] for own in mine] == [
        ["GPU-0"],
        [],
        ["GPU-1", "GPU-2"],
    ]
    claim = [{"name": "claim:gpus", "resources": devices[:1]}]
    shared = {"claims": [{"name": "gpus"}]}
    both = per_container([{"name": "a", "resources": shared}, {"name": "b", "resources": shared}], claim)
    assert both == [claim, claim]
