"""`POST /scheduler/filter` in process (responder.extender.server), over a cache fed by hand.

Aspects: no token is asked for; names in, names out from the cache; Node objects in, their
own annotation read; a body that is not JSON or not ExtenderArgs answers 400 with `Error` set
(kube-scheduler then fails the pod's attempt), never a 500.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpuhealth.kube.reflector import Listed
from responder.enforce.node_annotation import NODE_ANNOTATION
from responder.extender.capacity import NODES, PODS, CapacityCache
from responder.extender.server import FILTER_PATH, add_filter


def node(name: str, listed: int) -> dict[str, Any]:
    devices = json.dumps([f"GPU-{i}" for i in range(listed)])
    return {
        "metadata": {"name": name, "annotations": {NODE_ANNOTATION: devices}},
        "status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "4"}},
    }


POD = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}


async def test_the_filter_answers_from_the_cache_and_refuses_junk_with_error() -> None:
    cache = CapacityCache()
    cache.apply(Listed(NODES, [node("a", 1), node("b", 0)]))
    cache.apply(Listed(PODS, []))
    app = web.Application()
    add_filter(app, cache)
    async with TestClient(TestServer(app)) as client:
        response = await client.post(FILTER_PATH, json={"Pod": POD, "NodeNames": ["a", "b"]})
        assert response.status == 200
        result = await response.json()
        assert result["NodeNames"] == ["b"] and list(result["FailedNodes"]) == ["a"]

        # Node objects: what the scheduler sent is read, not the cache (b now has one listed).
        sent = {"items": [node("a", 0), node("b", 1)]}
        response = await client.post(FILTER_PATH, json={"Pod": POD, "Nodes": sent})
        result = await response.json()
        assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["a"]

        response = await client.post(FILTER_PATH, data=b"{not json")
        assert response.status == 400
        assert (await response.json())["Error"].startswith("gpuhealth: the body is not JSON")
        response = await client.post(FILTER_PATH, json={"Pod": POD, "NodeNames": "a"})
        assert response.status == 400
        assert (await response.json())[
            "Error"
        ] == "gpuhealth: not ExtenderArgs: NodeNames: expected a list of node names (or Nodes)"
