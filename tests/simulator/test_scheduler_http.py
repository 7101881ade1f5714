"""The scheduler over HTTP: pods/binding through the official client, and a scheduler extender.

Aspects: `POST .../pods/NAME/binding` binds a pending pod (201) and answers 409 with the
apiserver's words once it is bound; a KubeSchedulerConfiguration's extender is called with
`ExtenderArgs` (the pod and NodeNames, nodeCacheCapable) only for pods requesting its managed
resource, its FailedNodes keep nodes out and its priorities choose among the rest; a filter
error or timeout leaves the pod Pending with a FailedScheduling event saying so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuhealth.clock import ManualClock
from simulator.runner import SimulatedCluster

pytestmark = pytest.mark.integration

SCENARIO = {
    "fleet": [{"name": "dp", "count": 3, "gpusPerNode": 4, "path": "device-plugin"}],
    "workloads": [{"name": "w", "replicas": 1, "gpusPerPod": 1}],
}


class FakeExtender:
    """An extender on loopback: filters out dp-1, prefers dp-2; or fails, as told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.mode = "ok"

    async def filter(self, request: web.Request) -> web.Response:
        args = await request.json()
        self.calls.append(("filter", args))
        if self.mode == "error":
            return web.json_response({"Error": "quarantine store unavailable"})
        if self.mode == "slow":
            await asyncio.sleep(1)
        failed = {"dp-1": "GPU quarantined"}
        if args["NodeNames"] is None:  # not nodeCacheCapable: whole Node objects both ways
            items = [n for n in args["Nodes"]["items"] if n["metadata"]["name"] != "dp-1"]
            return web.json_response({"Nodes": {"items": items}, "FailedNodes": failed})
        names = [n for n in args["NodeNames"] if n != "dp-1"]
        return web.json_response({"NodeNames": names, "FailedNodes": failed, "Error": ""})

    async def prioritize(self, request: web.Request) -> web.Response:
        args = await request.json()
        self.calls.append(("prioritize", args))
        return web.json_response([{"Host": n, "Score": 10 if n == "dp-2" else 0} for n in node_names(args)])


def node_names(args: dict[str, Any]) -> list[str]:
    if args["NodeNames"] is not None:
        return sorted(args["NodeNames"])
    return sorted(n["metadata"]["name"] for n in args["Nodes"]["items"])


@pytest.fixture
async def served(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[SimulatedCluster, FakeExtender]]:
    extender = FakeExtender()
    app = web.Application()
    app.router.add_post("/ext/filter", extender.filter)
    app.router.add_post("/ext/prioritize", extender.prioritize)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "extenders": [
            {
                "urlPrefix": f"http://127.0.0.1:{port}/ext",
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": 1,
                "nodeCacheCapable": getattr(request, "param", True),
                "httpTimeout": "300ms",
                "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}],
            }
        ],
    }
    path = tmp_path / "scheduler.yaml"
    path.write_text(json.dumps(config))
    cluster = SimulatedCluster(SCENARIO, clock=ManualClock(), scheduler_config=path)
    async with cluster:
        yield cluster, extender
    await runner.cleanup()


def pod(name: str, gpus: int | None = 1) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {"requests": {"cpu": "100m"}}
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]},
    }


async def until(predicate: Callable[[], Any], seconds: float = 10.0) -> Any:
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def core(cluster: SimulatedCluster) -> tuple[client.ApiClient, client.CoreV1Api]:
    from kubernetes import config as kconfig

    api = kconfig.new_client_from_config(config_file=str(cluster.kubeconfig_path))
    return api, client.CoreV1Api(api)


async def test_binding_subresource_through_the_official_client(
    served: tuple[SimulatedCluster, FakeExtender],
) -> None:
    cluster, _ = served
    api, v1 = core(cluster)
    with api:
        await asyncio.to_thread(v1.create_namespaced_pod, "default", {**pod("b"), "spec": {
            **pod("b")["spec"], "schedulerName": "elsewhere"}})  # fmt: skip
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "b"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "dp-2"}}  # fmt: skip
        resp = await asyncio.to_thread(
            v1.create_namespaced_pod_binding, "b", "default", body, _preload_content=False
        )
        assert resp.status == 201
        got = await asyncio.to_thread(v1.read_namespaced_pod, "b", "default")
        assert got.spec.node_name == "dp-2"
        assert [c.status for c in got.status.conditions if c.type == "PodScheduled"] == ["True"]
        with pytest.raises(ApiException) as info:
            await asyncio.to_thread(
                v1.create_namespaced_pod_binding, "b", "default", body, _preload_content=False
            )
        assert info.value.status == 409
        assert json.loads(info.value.body)["message"] == (
            'Operation cannot be fulfilled on pods/binding "b": pod b is already assigned to node "dp-2"'
        )


@pytest.mark.parametrize("served", [True, False], indirect=True, ids=["node-names", "node-list"])
async def test_extender_filters_and_prioritizes_gpu_pods(
    served: tuple[SimulatedCluster, FakeExtender],
) -> None:
    cluster, extender = served
    api, v1 = core(cluster)
    with api:
        await asyncio.to_thread(v1.create_namespaced_pod, "default", pod("cpu-only", gpus=None))
        await until(lambda: cluster.store.get("pods", "cpu-only", "default")["spec"].get("nodeName"))
        assert extender.calls == []  # it manages nvidia.com/gpu only
        await asyncio.to_thread(v1.create_namespaced_pod, "default", pod("g"))
        node = await until(lambda: cluster.store.get("pods", "g", "default")["spec"].get("nodeName"))
    assert node == "dp-2"
    verb, args = extender.calls[0]
    assert verb == "filter" and args["Pod"]["metadata"]["name"] == "g"
    assert node_names(args) == ["dp-0", "dp-1", "dp-2"]
    if args["NodeNames"] is None:
        assert args["Nodes"]["kind"] == "NodeList" and args["Nodes"]["items"][0]["kind"] == "Node"
    assert extender.calls[1][0] == "prioritize" and node_names(extender.calls[1][1]) == ["dp-0", "dp-2"]


@pytest.mark.parametrize(("mode", "words"), [("error", "quarantine store unavailable"), ("slow", "timeout")])
async def test_extender_failure_keeps_the_pod_pending(
    served: tuple[SimulatedCluster, FakeExtender], mode: str, words: str
) -> None:
    cluster, extender = served
    extender.mode = mode
    cluster.store.create("pods", pod("p"), namespace="default")

    def failed() -> list[dict[str, Any]]:
        items = cluster.store.list("events", "default")[0]
        return [e for e in items if e["involvedObject"]["name"] == "p" and e["reason"] == "FailedScheduling"]

    (event,) = await until(failed)
    assert words in event["message"]
    assert cluster.store.get("pods", "p", "default")["spec"].get("nodeName") is None
