"""Pods deleted or evicted through the API are replaced, on devices the scheduler may use.

Aspects: a deleted pod frees its devices and its generated claim; its Deployment gets a new
pod after the replacement delay; the new pod avoids devices the device plugin reports
Unhealthy, cordoned nodes, and DRA devices tainted by a DeviceTaintRule; with nowhere to go it
stays Pending (PodScheduled=False) and is bound, same uid, once a device is usable again. As on
a real kubelet, a device listed in the node's `gpuhealth.io/quarantined-devices` annotation that
the plugin still reports Healthy is handed out like any other (only a scheduler extender that
counts it out keeps pods away: tests/responder/test_service_extender.py). With extenders
configured, a replacement bound for a device-plugin node goes where they pass (the pod as
stored, with its labels, is what they are asked about), and waits while they pass none.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from gpuhealth.clock import ManualClock
from gpuhealth.testing.loopback import free_port
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.extender_client import ExtenderConfig
from simulator.fleet.objects import DRA_PLUGIN_NAMESPACE, gpu_uuid
from simulator.scenario import DeviceRef, Fault, from_dict


def scenario(path: str) -> dict[str, Any]:
    return {
        "fleet": [{"name": "n", "count": 2, "gpusPerNode": 2, "path": path}],
        "workloads": [{"name": "w", "replicas": 1, "gpusPerPod": 2}],
    }


@pytest.fixture
async def dp() -> AsyncIterator[tuple[Fleet, Store]]:
    async for pair in _running(scenario("device-plugin")):
        yield pair


@pytest.fixture
async def dra() -> AsyncIterator[tuple[Fleet, Store]]:
    async for pair in _running(scenario("dra")):
        yield pair


async def _running(data: dict[str, Any]) -> AsyncIterator[tuple[Fleet, Store]]:
    clock = ManualClock()
    store = Store(clock, seed=3)
    fleet = Fleet(from_dict(data), store, clock)
    await fleet.start()
    task = asyncio.create_task(fleet.follow_deletions())
    await asyncio.sleep(0)
    yield fleet, store
    fleet.stop()
    await task


def pods(store: Store) -> list[dict[str, Any]]:
    """The scenario's pods (not the DRA driver's kubelet plugin pods)."""
    return [p for p in store.list("pods")[0] if p["metadata"]["namespace"] != DRA_PLUGIN_NAMESPACE]


def health(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_deleted_pod_is_replaced_away_from_an_unhealthy_device_plugin_gpu(
    dp: tuple[Fleet, Store],
) -> None:
    fleet, store = dp
    (old,) = pods(store)
    assert old["spec"]["nodeName"] == "n-0"
    fleet.inject(Fault(at=0, kind="device-unhealthy", device=DeviceRef("n-0", 0)))
    await fleet.advance(1)
    store.delete("pods", old["metadata"]["name"], "default")
    await settle()
    assert fleet.nodes["n-0"].pods == []
    await fleet.advance(6)
    (new,) = pods(store)
    assert new["metadata"]["name"] != old["metadata"]["name"]
    # n-0's GPUs are free again, but one is Unhealthy: first fit moves on to n-1.
    assert new["spec"]["nodeName"] == "n-1"
    assert new["status"]["phase"] == "Running"
    ids = [
        r["resourceID"]
        for r in new["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"]
    ]
    assert ids == [gpu_uuid("n-1", 0), gpu_uuid("n-1", 1)]
    assert [r["health"] for r in health(new)] == ["Healthy", "Healthy"]


async def test_the_quarantine_annotation_keeps_nothing_away_but_unhealthy_and_cordon_keep_pods_pending(
    dp: tuple[Fleet, Store],
) -> None:
    fleet, store = dp
    (old,) = pods(store)
    assert old["spec"]["nodeName"] == "n-0"

    def annotate(value: str) -> None:
        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            obj["metadata"].setdefault("annotations", {})["gpuhealth.io/quarantined-devices"] = value
            return obj

        store.mutate("nodes", "n-0", None, fn)

    # The annotation names a device its plugin reports Healthy: the replacement gets it anyway.
    annotate(f'["{gpu_uuid("n-0", 1)}"]')
    store.patch("nodes", "n-1", None, {"spec": {"unschedulable": True}}, "application/merge-patch+json")
    store.evict(old["metadata"]["name"], "default")
    await settle()
    await fleet.advance(10)
    (annotated,) = pods(store)
    assert annotated["spec"]["nodeName"] == "n-0"
    assert annotated["status"]["phase"] == "Running"
    assert [r["resourceID"] for r in health(annotated)] == [gpu_uuid("n-0", 0), gpu_uuid("n-0", 1)]

    # The plugin reports that device Unhealthy: the kubelet keeps it away; with n-1 cordoned the
    # next replacement has nowhere to go.
    fleet.inject(Fault(at=fleet.now(), kind="device-unhealthy", device=DeviceRef("n-0", 1)))
    await fleet.advance(1)
    store.evict(annotated["metadata"]["name"], "default")
    await settle()
    await fleet.advance(30)
    (pending,) = pods(store)
    assert pending["status"]["phase"] == "Pending"
    assert pending["status"]["conditions"][0]["reason"] == "Unschedulable"
    assert "nodeName" not in pending["spec"]
    store.patch("nodes", "n-1", None, {"spec": {"unschedulable": False}}, "application/merge-patch+json")
    await fleet.advance(10)
    (bound,) = pods(store)
    assert bound["metadata"]["uid"] == pending["metadata"]["uid"]
    assert bound["spec"]["nodeName"] == "n-1"
    assert bound["status"]["phase"] == "Running"


async def test_dra_replacement_avoids_devices_tainted_by_a_device_taint_rule(
    dra: tuple[Fleet, Store],
) -> None:
    fleet, store = dra
    (old,) = pods(store)
    claim_name = old["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    store.create(
        "devicetaintrules.resource.k8s.io",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": "quarantine-n-0-gpu-1"},
            "spec": {
                "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n-0", "device": "gpu-1"},
                "taint": {"key": "gpuhealth.io/quarantine", "value": "xid-79", "effect": "NoSchedule"},
            },
        },
    )
    store.delete("pods", old["metadata"]["name"], "default")
    await settle()
    claims = store.list("resourceclaims.resource.k8s.io")[0]
    assert claim_name not in [c["metadata"]["name"] for c in claims]
    await fleet.advance(6)
    (new,) = pods(store)
    assert new["spec"]["nodeName"] == "n-1"
    claim = store.get(
        "resourceclaims.resource.k8s.io",
        new["status"]["resourceClaimStatuses"][0]["resourceClaimName"],
        "default",
    )
    assert [r["pool"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["n-1", "n-1"]
    assert claim["status"]["reservedFor"][0]["uid"] == new["metadata"]["uid"]


class FakeExtender:
    """A scheduler extender on loopback that passes only the nodes in `allowed`, and keeps the
    pods it was asked about."""

    def __init__(self) -> None:
        self.allowed: set[str] = set()
        self.asked: list[dict[str, Any]] = []

    async def filter(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.asked.append(body["Pod"])
        names = body["NodeNames"]
        return web.json_response(
            {
                "NodeNames": [n for n in names if n in self.allowed],
                "FailedNodes": {n: "fake: not allowed" for n in names if n not in self.allowed},
                "Error": "",
            }
        )


def names(*objs: dict[str, Any]) -> set[str]:
    return {o["metadata"]["name"] for o in objs}


def bound_other_than(store: Store, *gone: dict[str, Any]) -> list[dict[str, Any]]:
    """The bound pods but `gone` (evicted, maybe still terminating)."""
    return [p for p in pods(store) if p["metadata"]["name"] not in names(*gone) and p["spec"].get("nodeName")]


async def until(what: str, condition: Any) -> Any:
    """Let the loop run (the extender's answers arrive over HTTP) until `condition()` is truthy."""
    for _ in range(500):
        found = condition()
        if found:
            return found
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_device_plugin_replacement_goes_where_the_extenders_pass() -> None:
    extender = FakeExtender()
    app = web.Application()
    app.router.add_post("/scheduler/filter", extender.filter)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    config = ExtenderConfig(
        url_prefix=f"http://127.0.0.1:{port}/scheduler",
        filter_verb="filter",
        node_cache_capable=True,
        managed_resources=(("nvidia.com/gpu", False),),
    )
    data = scenario("device-plugin")
    data["workloads"][0]["canary"] = True
    clock = ManualClock()
    store = Store(clock, seed=3)
    fleet = Fleet(from_dict(data), store, clock, extenders=[config])
    await fleet.start()
    tasks = [asyncio.create_task(fleet.follow_deletions()), asyncio.create_task(fleet.scheduler.follow())]
    try:
        await fleet.advance(1)  # one tick first, as above: the deletes below are then carried out at once
        (old,) = pods(store)
        assert old["spec"]["nodeName"] == "n-0"
        # First fit would take n-0 again; the extender passes only n-1.
        extender.allowed = {"n-1"}
        store.delete("pods", old["metadata"]["name"], "default")
        await settle()
        await fleet.advance(10)
        (moved,) = await until("the replacement bound", lambda: bound_other_than(store, old))
        assert moved["spec"]["nodeName"] == "n-1"
        asked = extender.asked[-1]
        assert asked["metadata"]["name"] == moved["metadata"]["name"]
        assert asked["metadata"]["labels"]["gpuhealth.io/canary-ok"] == "true"  # the pod as stored

        # The extender passes nothing: the next replacement is asked about, and waits.
        extender.allowed = set()
        store.delete("pods", moved["metadata"]["name"], "default")
        await settle()
        await fleet.advance(6)
        await until(
            "the extender asked", lambda: extender.asked[-1]["metadata"]["name"] not in names(old, moved)
        )
        pending = store.get("pods", extender.asked[-1]["metadata"]["name"], "default")
        assert "nodeName" not in pending["spec"]

        # Once it passes n-0, the pod waiting (same uid) is bound there at its next try.
        extender.allowed = {"n-0"}
        await fleet.advance(10)
        (placed,) = await until("the waiting pod bound", lambda: bound_other_than(store, old, moved))
        assert placed["metadata"]["uid"] == pending["metadata"]["uid"]
        assert placed["spec"]["nodeName"] == "n-0"
    finally:
        fleet.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runner.cleanup()


async def test_an_extended_resource_replacement_gets_a_new_special_claim_away_from_a_tainted_device() -> None:
    data = {
        "fleet": [{"name": "n", "count": 2, "gpusPerNode": 2, "path": "dra", "extendedResource": True}],
        "workloads": [{"name": "w", "replicas": 1, "gpusPerPod": 2, "extendedResource": True}],
    }
    async for fleet, store in _running(data):
        (old,) = pods(store)
        # Written for device plugins: `nvidia.com/gpu` on a node that advertises none of it.
        assert old["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "2"
        assert "resourceClaims" not in old["spec"]
        assert "nvidia.com/gpu" not in store.get("nodes", "n-0")["status"]["allocatable"]
        assert "allocatedResourcesStatus" not in old["status"]["containerStatuses"][0]
        mapping = old["status"]["extendedResourceClaimStatus"]
        assert mapping["requestMappings"] == [
            {
                "containerName": "server",
                "resourceName": "nvidia.com/gpu",
                "requestName": "container-0-request-2",
            }
        ]
        special = store.get("resourceclaims.resource.k8s.io", mapping["resourceClaimName"], "default")
        assert special["metadata"]["annotations"] == {
            "resource.kubernetes.io/extended-resource-claim": "true"
        }
        assert special["metadata"]["ownerReferences"][0]["uid"] == old["metadata"]["uid"]
        assert [r["request"] for r in special["status"]["allocation"]["devices"]["results"]] == [
            "container-0-request-2",
            "container-0-request-2",
        ]
        device_class = store.get("deviceclasses.resource.k8s.io", "gpu.nvidia.com")
        assert device_class["spec"]["extendedResourceName"] == "nvidia.com/gpu"
        store.create(
            "devicetaintrules.resource.k8s.io",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceTaintRule",
                "metadata": {"name": "quarantine-n-0-gpu-1"},
                "spec": {
                    "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n-0", "device": "gpu-1"},
                    "taint": {"key": "gpuhealth.io/quarantine", "value": "xid-79", "effect": "NoSchedule"},
                },
            },
        )
        store.delete("pods", old["metadata"]["name"], "default")
        await settle()
        claims = [c["metadata"]["name"] for c in store.list("resourceclaims.resource.k8s.io")[0]]
        assert mapping["resourceClaimName"] not in claims
        await fleet.advance(6)
        (new,) = pods(store)
        assert new["spec"]["nodeName"] == "n-1"
        renewed = new["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        assert renewed.startswith(new["metadata"]["name"] + "-extended-resources-")
        claim = store.get("resourceclaims.resource.k8s.io", renewed, "default")
        assert [r["pool"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["n-1", "n-1"]
        assert claim["status"]["reservedFor"][0]["uid"] == new["metadata"]["uid"]
