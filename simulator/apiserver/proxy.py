"""The pods/proxy subresource: the apiserver forwards a request to a port of a pod.

`kubectl get --raw /api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH` and clients like
`kubectl gpuhealth devices` reach a pod's HTTP endpoint this way, with the cluster's
authentication and RBAC (`pods/proxy`) instead of a network path to the pod. The target is
`[SCHEME:]NAME[:PORT]` as the real apiserver parses it: the port a number or a container
port's name (80 when none is given), the scheme `http` or `https` (the pod's certificate not
verified, as the real apiserver's proxy does not verify it).
The request goes to `status.podIP`, method, query and body unchanged; the pod's answer comes
back with its status, content type and body. A pod without an IP, a port that names nothing
and a pod that does not answer are 503 ServiceUnavailable / 400 BadRequest Status errors, the
codes the real apiserver gives.

Simulated pods carry fake addresses, so in practice the pod answering is one a test created
with a loopback `status.podIP` (an exporter on 127.0.0.1 standing in for a DaemonSet pod).
`add_proxy_route(app, store)` registers the route before the catch-all API routes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from simulator.apiserver.errors import ApiError, bad_request, not_found

if TYPE_CHECKING:
    from simulator.apiserver.store import Store

PROXY_PATH = "/api/v1/namespaces/{namespace}/pods/{target}/proxy{path:(/.*)?}"
DEFAULT_PORT = 80
TIMEOUT_SECONDS = 30.0
_FORWARDED_HEADERS = ("Accept", "Accept-Encoding", "Content-Type")


def split_target(target: str) -> tuple[str, str, str]:
    """(scheme, name, port) of `[SCHEME:]NAME[:PORT]`; scheme and port empty when not given."""
    parts = target.split(":")
    if len(parts) == 1:
        return "", parts[0], ""
    if len(parts) == 2:
        return "", parts[0], parts[1]
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    raise bad_request(f"invalid pod request {target!r}")


def resolve(pod: dict[str, Any], target: str) -> tuple[str, int]:
    """(host, port) a proxied request for `target` goes to; ApiError when it goes nowhere."""
    scheme, name, port_text = split_target(target)
    if scheme not in ("", "http", "https"):
        raise bad_request(f"{target!r}: unsupported scheme {scheme!r} (http or https)")
    status = pod.get("status") or {}
    host = status.get("podIP")
    if not isinstance(host, str) or not host:
        raise ApiError(503, "ServiceUnavailable", f'pod "{name}" has no IP yet: nothing to proxy to')
    if not port_text:
        return host, DEFAULT_PORT
    if port_text.isascii() and port_text.isdigit():
        port = int(port_text)
        if 0 < port <= 65535:
            return host, port
        raise bad_request(f"invalid port {port_text!r} in {target!r}")
    for container in (pod.get("spec") or {}).get("containers") or ():
        for declared in container.get("ports") or ():
            if declared.get("name") == port_text and isinstance(declared.get("containerPort"), int):
                return host, int(declared["containerPort"])
    raise bad_request(f'pod "{name}" has no container port named {port_text!r}')


def _handler(store: Store) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        namespace, target = request.match_info["namespace"], request.match_info["target"]
        scheme, name, _ = split_target(target)
        try:
            pod = store.get("pods", name, namespace)
        except ApiError as err:
            raise not_found("pods", "", name) from err
        host, port = resolve(pod, target)
        url = f"{scheme or 'http'}://{host}:{port}{request.match_info['path'] or '/'}"
        headers = {h: request.headers[h] for h in _FORWARDED_HEADERS if h in request.headers}
        body = await request.read()
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)) as session,
                session.request(
                    request.method,
                    url,
                    params=request.query,
                    data=body or None,
                    headers=headers,
                    auto_decompress=False,
                    ssl=False,
                ) as answer,
            ):
                payload = await answer.read()
                forwarded = {
                    h: answer.headers[h] for h in ("Content-Type", "Content-Encoding") if h in answer.headers
                }
                return web.Response(status=answer.status, body=payload, headers=forwarded)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(
                503, "ServiceUnavailable", f"error trying to reach service: {host}:{port}: {exc}"
            ) from exc

    return handle


def add_proxy_route(app: web.Application, store: Store) -> None:
    """Serve pods/proxy; call before the catch-all `/api/{path}` route is added."""
    app.router.add_route("*", PROXY_PATH, _handler(store))
