"""The pods/binding subresource: how a scheduler assigns a pending pod to a node.

`bind(store, namespace, name, body)` checks a `v1.Binding` and writes `spec.nodeName` with the
PodScheduled=True condition in one write, as the real registry does; a pod that already has a
node gets 409 Conflict. `add_binding_route(app, store)` serves
`POST /api/v1/namespaces/{namespace}/pods/{name}/binding` (registered before the catch-all
API routes). The simulated scheduler calls `bind` in-process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from simulator.apiserver.errors import ApiError, bad_request, invalid, not_found
from simulator.apiserver.store import format_timestamp

if TYPE_CHECKING:
    from simulator.apiserver.store import Store

BINDING_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/binding"


def bind(store: Store, namespace: str, name: str, body: Any) -> dict[str, Any]:
    """Bind the pod to `body.target.name`; the Status the apiserver answers (201 Success)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a v1 Binding object")
    if body.get("kind") not in (None, "Binding"):
        raise bad_request(f"the kind of the object ({body.get('kind')}) must be Binding")
    meta: dict[str, Any] = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
    if meta.get("name") not in (None, "", name):
        raise bad_request(f"name in URL does not match name in Binding object ({meta['name']} != {name})")
    target: dict[str, Any] = body["target"] if isinstance(body.get("target"), dict) else {}
    node = target.get("name")
    if not isinstance(node, str) or not node:
        raise invalid("Binding", "", name, [("target.name", "Required value")])
    if target.get("kind") not in (None, "", "Node"):
        raise invalid("Binding", "", name, [("target.kind", f'Unsupported value: "{target["kind"]}"')])
    try:
        pod = store.get("pods", name, namespace)
    except ApiError as err:
        raise not_found("pods", "", name) from err
    uid = meta.get("uid")
    if uid and uid != pod["metadata"].get("uid"):
        raise ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on pods/binding "{name}": Precondition failed: '
            f"UID in precondition: {uid}, UID in object meta: {pod['metadata'].get('uid')}",
            details={"name": name, "kind": "pods/binding"},
        )
    now = format_timestamp(store.clock.now())

    def apply(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"].get("deletionTimestamp"):
            raise _already(name, "", "the pod is being deleted")
        assigned = (obj.get("spec") or {}).get("nodeName")
        if assigned:
            raise _already(name, assigned)
        obj["spec"]["nodeName"] = node
        status = obj.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or () if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": now})
        status["conditions"] = conditions
        return obj

    store.mutate("pods", name, namespace, apply)
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _already(name: str, node: str, why: str = "") -> ApiError:
    message = why or f'pod {name} is already assigned to node "{node}"'
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on pods/binding "{name}": {message}',
        details={"name": name, "kind": "pods/binding"},
    )


def _handler(store: Store) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"the request body is not valid JSON: {exc}") from exc
        result = bind(store, request.match_info["namespace"], request.match_info["name"], body)
        return web.Response(body=orjson.dumps(result), status=201, content_type="application/json")

    return handle


def add_binding_route(app: web.Application, store: Store) -> None:
    """Serve pods/binding; call before the catch-all `/api/{path}` route is added."""
    app.router.add_post(BINDING_PATH, _handler(store))
