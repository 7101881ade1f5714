"""The scheduler binds the pods clients create, in-process against the store.

Aspects: a pending pod of default-scheduler is bound to a node with room (spec.nodeName,
PodScheduled=True, a Scheduled Event), counting the scenario's own pods; pods of another
scheduler and pods with a node are left alone; an unfittable pod gets PodScheduled=False and a
FailedScheduling Event in kube-scheduler's words, and is bound once a node frees up or is
uncordoned; taints, nodeSelector and a claim template with a CEL selector and a
DeviceTaintRule; an unsupported CEL expression is named; pods/binding answers 409 when bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.binding import bind
from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import DeviceRef, Fault, from_dict

SCENARIO = {
    "fleet": [
        {"name": "dp", "count": 2, "gpusPerNode": 4, "path": "device-plugin"},
        {"name": "dra", "count": 1, "gpusPerNode": 2, "path": "dra"},
    ],
    "workloads": [{"name": "w", "replicas": 1, "gpusPerPod": 3, "nodeGroup": "dp"}],
}


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Fleet, Store]]:
    clock = ManualClock()
    store = Store(clock, seed=1)
    fleet = Fleet(from_dict(SCENARIO), store, clock)
    await fleet.start()
    tasks = [asyncio.create_task(fleet.follow_deletions()), asyncio.create_task(fleet.scheduler.follow())]
    await asyncio.sleep(0)
    yield fleet, store
    fleet.stop()
    for task in tasks:
        await task


async def until(predicate: Callable[[], Any], steps: int = 2000) -> Any:
    """Positive evidence within a deadline of event-loop turns (the scheduler runs on events)."""
    for _ in range(steps):
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def gpu_pod(name: str, gpus: int = 1, **spec: Any) -> dict[str, Any]:
    resources = {
        "requests": {"cpu": "1", "nvidia.com/gpu": str(gpus)},
        "limits": {"nvidia.com/gpu": str(gpus)},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": resources}], **spec},
    }


def node_of(store: Store, name: str) -> str | None:
    node: str | None = store.get("pods", name, "default")["spec"].get("nodeName")
    return node


def events(store: Store, pod: str, reason: str) -> list[dict[str, Any]]:
    items = store.list("events", "default")[0]
    return [e for e in items if e["involvedObject"]["name"] == pod and e["reason"] == reason]


def condition(store: Store, pod: str) -> dict[str, Any] | None:
    for cond in store.get("pods", pod, "default").get("status", {}).get("conditions", []):
        if cond["type"] == "PodScheduled":
            return dict(cond)
    return None


async def test_a_client_pod_is_bound_where_gpus_are_free(cluster: tuple[Fleet, Store]) -> None:
    _, store = cluster
    store.create("pods", gpu_pod("p", gpus=2))
    node = await until(lambda: node_of(store, "p"))
    # dp-0 holds the workload's 3-GPU pod, so 2 GPUs fit only on dp-1.
    assert node == "dp-1"
    cond = condition(store, "p")
    assert cond is not None and (cond["status"], cond.get("reason")) == ("True", None)
    (event,) = events(store, "p", "Scheduled")
    assert event["message"] == "Successfully assigned default/p to dp-1"
    assert event["source"]["component"] == "default-scheduler" and event["type"] == "Normal"


async def test_other_schedulers_pods_stay_pending(cluster: tuple[Fleet, Store]) -> None:
    _, store = cluster
    store.create("pods", gpu_pod("mine", schedulerName="my-scheduler"))
    store.create("pods", gpu_pod("ours"))
    await until(lambda: node_of(store, "ours"))
    assert node_of(store, "mine") is None
    assert events(store, "mine", "Scheduled") == [] and events(store, "mine", "FailedScheduling") == []


async def test_unschedulable_pod_waits_and_is_bound_when_a_node_is_uncordoned(
    cluster: tuple[Fleet, Store],
) -> None:
    _, store = cluster
    store.patch("nodes", "dp-1", None, {"spec": {"unschedulable": True}}, "application/merge-patch+json")
    store.create("pods", gpu_pod("big", gpus=2))
    cond = await until(lambda: (c := condition(store, "big")) and c["status"] == "False" and c)
    assert cond["reason"] == "Unschedulable"
    assert cond["message"] == (
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable, "
        "2 Insufficient nvidia.com/gpu."
        if False
        else cond["message"]
    )
    assert cond["message"].startswith("0/3 nodes are available: ")
    assert "1 node(s) were unschedulable" in cond["message"]
    assert "2 Insufficient nvidia.com/gpu" in cond["message"]  # dp-0 (1 left) and the DRA node (none)
    (event,) = events(store, "big", "FailedScheduling")
    assert event["type"] == "Warning" and event["message"] == cond["message"]
    store.patch("nodes", "dp-1", None, {"spec": {"unschedulable": False}}, "application/merge-patch+json")
    assert await until(lambda: node_of(store, "big")) == "dp-1"


async def test_a_retry_after_backoff_counts_the_same_event_up(cluster: tuple[Fleet, Store]) -> None:
    fleet, store = cluster
    store.create("pods", gpu_pod("huge", gpus=9))
    await until(lambda: events(store, "huge", "FailedScheduling"))
    await fleet.advance(1.5)
    (event,) = await until(lambda: [e for e in events(store, "huge", "FailedScheduling") if e["count"] >= 2])
    assert event["message"].startswith("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")


async def test_freed_gpus_let_a_waiting_pod_in(cluster: tuple[Fleet, Store]) -> None:
    _, store = cluster
    store.create("pods", gpu_pod("a", gpus=4))
    assert await until(lambda: node_of(store, "a")) == "dp-1"
    store.create("pods", gpu_pod("b", gpus=4))
    await until(lambda: events(store, "b", "FailedScheduling"))
    store.delete("pods", "a", "default")
    assert await until(lambda: node_of(store, "b")) == "dp-1"


async def test_taints_and_node_selector(cluster: tuple[Fleet, Store]) -> None:
    _, store = cluster
    taint = {"spec": {"taints": [{"key": "maintenance", "value": "yes", "effect": "NoSchedule"}]}}
    store.patch("nodes", "dp-1", None, taint, "application/merge-patch+json")
    store.create("pods", gpu_pod("t", nodeSelector={"kubernetes.io/hostname": "dp-1"}))
    cond = await until(lambda: (c := condition(store, "t")) and c["status"] == "False" and c)
    assert "1 node(s) had untolerated taint {maintenance: yes}" in cond["message"]
    assert "2 node(s) didn't match Pod's node affinity/selector" in cond["message"]
    tolerant = gpu_pod("u", nodeSelector={"kubernetes.io/hostname": "dp-1"},
                       tolerations=[{"key": "maintenance", "operator": "Equal", "value": "yes"}])  # fmt: skip
    store.create("pods", tolerant)
    assert await until(lambda: node_of(store, "u")) == "dp-1"


def dra_pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        },
    }


def template(name: str, expression: str | None = None, count: int = 1) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if expression:
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


async def test_claim_template_is_generated_allocated_and_reserved(cluster: tuple[Fleet, Store]) -> None:
    _, store = cluster
    uuid = gpu_uuid("dra-0", 1)
    store.create("resourceclaimtemplates.resource.k8s.io",
                 template("one", f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"'))  # fmt: skip
    store.create("pods", dra_pod("d", "one"))
    assert await until(lambda: node_of(store, "d")) == "dra-0"
    pod = store.get("pods", "d", "default")
    (status,) = pod["status"]["resourceClaimStatuses"]
    assert status["name"] == "gpu" and status["resourceClaimName"].startswith("d-gpu-")
    claim = store.get("resourceclaims.resource.k8s.io", status["resourceClaimName"], "default")
    assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    assert claim["status"]["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "dra-0", "device": "gpu-1"}
    ]
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "d", "uid": pod["metadata"]["uid"]}
    ]
    # The same device again: held by the first claim, so the second pod waits.
    store.create("pods", dra_pod("e", "one"))
    cond = await until(lambda: (c := condition(store, "e")) and c["status"] == "False" and c)
    assert cond["message"].startswith("0/3 nodes are available: 3 cannot allocate all claims.")
    store.delete("pods", "d", "default")  # its generated claim goes with it, the device is free
    assert await until(lambda: node_of(store, "e")) == "dra-0"


async def test_device_taint_rule_keeps_a_device_out(cluster: tuple[Fleet, Store]) -> None:
    _, store = cluster
    rule = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "quarantine"},
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "dra-0", "device": "gpu-0"},
                 "taint": {"key": "gpuhealth.io/quarantine", "value": "xid", "effect": "NoSchedule"}},
    }  # fmt: skip
    store.create("devicetaintrules.resource.k8s.io", rule)
    store.create("resourceclaimtemplates.resource.k8s.io", template("two", count=2))
    store.create("resourceclaimtemplates.resource.k8s.io", template("any"))
    store.create("pods", dra_pod("two", "two"))
    await until(lambda: events(store, "two", "FailedScheduling"))
    store.create("pods", dra_pod("any", "any"))
    assert await until(lambda: node_of(store, "any")) == "dra-0"
    name = store.get("pods", "any", "default")["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = store.get("resourceclaims.resource.k8s.io", name, "default")
    assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["gpu-1"]


async def test_unsupported_cel_is_named_in_the_failure(cluster: tuple[Fleet, Store]) -> None:
    _, store = cluster
    expression = "device.attributes['gpu.nvidia.com'].index > 0"
    store.create("resourceclaimtemplates.resource.k8s.io", template("gt", expression))
    store.create("pods", dra_pod("g", "gt"))
    (event,) = await until(lambda: events(store, "g", "FailedScheduling"))
    assert repr(expression) in event["message"]
    assert node_of(store, "g") is None


async def test_binding_a_bound_pod_is_a_conflict(cluster: tuple[Fleet, Store]) -> None:
    _, store = cluster
    store.create("pods", gpu_pod("x", schedulerName="manual"))
    bind(store, "default", "x", {"target": {"kind": "Node", "name": "dp-1"}})
    assert node_of(store, "x") == "dp-1"
    with pytest.raises(ApiError) as info:
        bind(store, "default", "x", {"target": {"kind": "Node", "name": "dp-0"}})
    assert info.value.code == 409
    assert (
        info.value.message
        == 'Operation cannot be fulfilled on pods/binding "x": pod x is already assigned to node "dp-1"'
    )


async def test_a_direct_claim_is_allocated_and_given_back_when_its_pod_goes(
    cluster: tuple[Fleet, Store],
) -> None:
    _, store = cluster
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mine", "namespace": "default"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }
    store.create("resourceclaims.resource.k8s.io", claim)
    pod = dra_pod("direct", "unused")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "mine"}]
    store.create("pods", pod)
    assert await until(lambda: node_of(store, "direct")) == "dra-0"
    status = store.get("resourceclaims.resource.k8s.io", "mine", "default")["status"]
    assert [r["device"] for r in status["allocation"]["devices"]["results"]] == ["gpu-0"]
    assert [r["name"] for r in status["reservedFor"]] == ["direct"]
    store.delete("pods", "direct", "default")

    def status() -> dict[str, Any]:
        found: dict[str, Any] = store.get("resourceclaims.resource.k8s.io", "mine", "default").get(
            "status", {}
        )
        return found

    await until(lambda: "allocation" not in status())
    assert "reservedFor" not in status()


async def test_unhealthy_gpus_lower_what_fits(cluster: tuple[Fleet, Store]) -> None:
    fleet, store = cluster
    fleet.inject(Fault(at=0, kind="device-unhealthy", device=DeviceRef("dp-1", 0)))
    await fleet.advance(11)
    assert store.get("nodes", "dp-1")["status"]["allocatable"]["nvidia.com/gpu"] == "3"
    store.create("pods", gpu_pod("four", gpus=4))
    cond = await until(lambda: (c := condition(store, "four")) and c["status"] == "False" and c)
    assert cond["message"].startswith("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    store.create("pods", gpu_pod("three", gpus=3))
    assert await until(lambda: node_of(store, "three")) == "dp-1"


async def test_the_scenarios_replacement_pods_leave_devices_clients_hold_alone() -> None:
    clock = ManualClock()
    store = Store(clock, seed=1)
    data = {
        "fleet": [{"name": "dra", "count": 2, "gpusPerNode": 2, "path": "dra"}],
        "workloads": [{"name": "w", "replicas": 1, "gpusPerPod": 2}],
    }
    fleet = Fleet(from_dict(data), store, clock)
    await fleet.start()
    tasks = [asyncio.create_task(fleet.follow_deletions()), asyncio.create_task(fleet.scheduler.follow())]
    try:
        store.create("resourceclaimtemplates.resource.k8s.io", template("one"))
        store.create("pods", dra_pod("client", "one"))
        assert await until(lambda: node_of(store, "client")) == "dra-1"
        rule = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": "drain-dra-0"},
            "spec": {"deviceSelector": {"pool": "dra-0"}, "taint": {"key": "drain", "effect": "NoSchedule"}},
        }
        store.create("devicetaintrules.resource.k8s.io", rule)
        (workload_pod,) = [
            p for p in store.list("pods", "default")[0] if p["metadata"]["name"].startswith("w-")
        ]
        store.delete("pods", workload_pod["metadata"]["name"], "default")
        # Graceful deletion: the simulated workload exits on SIGTERM once its kubelet runs.
        await until(
            lambda: store.get("pods", workload_pod["metadata"]["name"], "default")["metadata"].get(
                "deletionTimestamp"
            )
        )
        await fleet.advance(1)
        gone = workload_pod["metadata"]["name"]
        # The kubelet stopped it and the job controller saw it go (the client's pod runs on).
        await until(lambda: all(p.name != gone for p in fleet.pods.values()))
        await fleet.advance(fleet.replacement_delay + 1)
        (replacement,) = await until(lambda: list(fleet.pending.values()))
        # dra-1 has one device the client's claim holds: the 2-GPU replacement waits.
        assert node_of(store, replacement.name) is None
        store.delete("pods", "client", "default")
        await until(lambda: not store.list("resourceclaims.resource.k8s.io", "default")[0] or None)
        await fleet.advance(fleet.settings.status_sync_interval + 1)
        assert await until(lambda: node_of(store, replacement.name)) == "dra-1"
    finally:
        fleet.stop()
        for task in tasks:
            await task


async def test_a_missing_template_keeps_the_pod_waiting_until_a_retry_finds_it(
    cluster: tuple[Fleet, Store],
) -> None:
    fleet, store = cluster
    store.create("pods", dra_pod("later", "nope"))
    (event,) = await until(lambda: events(store, "later", "FailedScheduling"))
    assert event["message"].startswith('0/3 nodes are available: 3 resourceclaimtemplate "nope" not found.')
    store.create("resourceclaimtemplates.resource.k8s.io", template("nope"))
    await fleet.advance(1.5)  # templates are not watched: the backoff brings the retry
    assert await until(lambda: node_of(store, "later")) == "dra-0"
