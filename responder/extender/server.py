"""`POST /scheduler/filter`: kube-scheduler's extender filter over HTTP (an adapter).

Read-only by design, so it takes no token (kube-scheduler's extender client sends none): it
changes nothing and reveals only which nodes fit. The decision is `responder.extender.filter`'s; the
capacity view is the `responder.extender.capacity` cache, never an API call. With the `Nodes` form the
Node objects the scheduler sent are read for allocatable and the annotation (what it saw), and
the cache for the pods bound there; with `NodeNames` (nodeCacheCapable) the cache answers for
both, and a node it has not seen passes.

Answers: 200 with an `ExtenderFilterResult`; 400 with its `Error` set for a body that is not
ExtenderArgs; 413 (aiohttp's) beyond the app's `client_max_size`. kube-scheduler fails the
pod's scheduling attempt on either (a non-200 or a non-empty `Error`), unless the extender is
configured `ignorable`, and retries it with its backoff: a malformed request is a bug to see,
not a reason to place a pod unfiltered.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuhealth import instruments
from responder import metrics
from responder.extender.capacity import CapacityCache
from responder.extender.filter import Args, ArgsError, NodeCapacity, error_result, filter_nodes, parse_args

FILTER_PATH = "/scheduler/filter"
"""`urlPrefix` `.../scheduler` plus `filterVerb` `filter` (`docs/quarantine.md`)."""


def answer(body: bytes, cache: CapacityCache) -> tuple[int, dict[str, Any]]:
    """(HTTP status, ExtenderFilterResult) for one request body (blocking: JSON of many nodes)."""
    try:
        args = parse_args(orjson.loads(body))
    except orjson.JSONDecodeError as exc:
        return 400, error_result(f"gpuhealth: the body is not JSON: {exc}")
    except ArgsError as exc:
        return 400, error_result(f"gpuhealth: not ExtenderArgs: {exc}")
    return 200, filter_nodes(args, capacity_of(args, cache))


def capacity_of(args: Args, cache: CapacityCache) -> Any:
    sent = {name: node for name, node in zip(args.node_names, args.nodes or (), strict=False)}

    def capacity(name: str) -> NodeCapacity | None:
        return cache.capacity(name, sent.get(name))

    return capacity


def add_filter(app: web.Application, cache: CapacityCache, registry: CollectorRegistry | None = None) -> None:
    """`registry`: where the requests are counted (`gpuhealth_extender_requests_total`)."""
    requests = instruments.counter(metrics.EXTENDER_REQUESTS, registry or CollectorRegistry())
    for outcome in ("ok", "error"):
        requests.labels(outcome)  # from zero: increase() sees the first request

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        # A NodeList of thousands of nodes takes a while to decode: off the loop, so the
        # webhook and the probes are answered meanwhile.
        status, result = await asyncio.to_thread(answer, body, cache)
        requests.labels("ok" if status == 200 else "error").inc()
        return web.Response(status=status, body=orjson.dumps(result), content_type="application/json")

    app.router.add_post(FILTER_PATH, handle)
