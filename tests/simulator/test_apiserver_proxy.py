"""The simulated apiserver's pods/proxy subresource (`simulator.apiserver.proxy`).

Aspects: a GET through `pods/NAME:PORT/proxy/PATH` reaches the pod's IP and port with the query,
and the pod's status, content type and body come back unchanged (a 404 of the pod stays a 404);
the port may be a container port's name; the method and body of a POST are forwarded; a missing
pod is 404 NotFound, a pod without an IP and a pod nobody answers for are 503
ServiceUnavailable, a port that names nothing or is out of range is 400 BadRequest, all as
Status objects; the target grammar `[SCHEME:]NAME[:PORT]`; the route needs the token like
every other one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpuhealth.clock import ManualClock
from gpuhealth.testing.loopback import free_port
from simulator.apiserver.app import create_app
from simulator.apiserver.errors import ApiError
from simulator.apiserver.proxy import split_target
from simulator.apiserver.store import Store

pytestmark = pytest.mark.integration

TOKEN = "proxy-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _echo(request: web.Request) -> web.Response:
    body = await request.text()
    return web.json_response(
        {"method": request.method, "path": request.path, "query": dict(request.query), "body": body}
    )


async def _missing(request: web.Request) -> web.Response:
    return web.Response(status=404, text="no such page\n")


@pytest.fixture
async def backend() -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_route("*", "/echo", _echo)
    app.router.add_get("/missing", _missing)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


def pod(name: str, *, ip: str | None, port: int = 0) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "exporter"}
    if port:
        container["ports"] = [{"name": "metrics", "containerPort": port}]
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [container]},
        "status": {"phase": "Running"},
    }
    if ip is not None:
        obj["status"]["podIP"] = ip
    return obj


@pytest.fixture
async def api(backend: int) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    store = Store(ManualClock(), seed=3)
    store.create("pods", pod("exporter", ip="127.0.0.1", port=backend), validate=False)
    store.create("pods", pod("pending", ip=None), validate=False)
    async with TestClient(TestServer(create_app(store, token=TOKEN))) as client:
        yield client


async def test_a_get_reaches_the_pod_port_and_comes_back_unchanged(
    api: TestClient[web.Request, web.Application], backend: int
) -> None:
    path = f"/api/v1/namespaces/default/pods/exporter:{backend}/proxy/echo?x=1"
    response = await api.get(path, headers=AUTH)
    assert response.status == 200
    assert await response.json() == {"method": "GET", "path": "/echo", "query": {"x": "1"}, "body": ""}
    by_name = await api.get("/api/v1/namespaces/default/pods/http:exporter:metrics/proxy/echo", headers=AUTH)
    assert by_name.status == 200 and (await by_name.json())["path"] == "/echo"
    missing = await api.get(f"/api/v1/namespaces/default/pods/exporter:{backend}/proxy/missing", headers=AUTH)
    assert (missing.status, await missing.text()) == (404, "no such page\n")


async def test_a_post_carries_its_body(api: TestClient[web.Request, web.Application], backend: int) -> None:
    response = await api.post(
        f"/api/v1/namespaces/default/pods/exporter:{backend}/proxy/echo", data=b"hello", headers=AUTH
    )
    assert (await response.json())["method"] == "POST"
    assert (await response.json())["body"] == "hello"


@pytest.mark.parametrize(
    ("target", "code", "reason", "message"),
    [
        ("ghost:80", 404, "NotFound", 'pods "ghost" not found'),
        ("pending:80", 503, "ServiceUnavailable", 'pod "pending" has no IP yet'),
        ("exporter:grpc", 400, "BadRequest", "no container port named 'grpc'"),
        ("exporter:70000", 400, "BadRequest", "invalid port '70000'"),
        ("ftp:exporter:443", 400, "BadRequest", "unsupported scheme"),
    ],
)
async def test_a_target_that_goes_nowhere_is_a_status_error(
    api: TestClient[web.Request, web.Application], target: str, code: int, reason: str, message: str
) -> None:
    response = await api.get(f"/api/v1/namespaces/default/pods/{target}/proxy/echo", headers=AUTH)
    status = await response.json()
    assert (response.status, status["kind"], status["reason"]) == (code, "Status", reason)
    assert message in status["message"]


async def test_a_pod_nobody_answers_for_is_503(api: TestClient[web.Request, web.Application]) -> None:
    closed = free_port()
    response = await api.get(f"/api/v1/namespaces/default/pods/exporter:{closed}/proxy/echo", headers=AUTH)
    status = await response.json()
    assert (response.status, status["reason"]) == (503, "ServiceUnavailable")
    assert status["message"].startswith(f"error trying to reach service: 127.0.0.1:{closed}")


async def test_the_proxy_needs_the_token(api: TestClient[web.Request, web.Application], backend: int) -> None:
    response = await api.get(f"/api/v1/namespaces/default/pods/exporter:{backend}/proxy/echo")
    assert response.status == 401


def test_the_target_grammar() -> None:
    assert split_target("pod") == ("", "pod", "")
    assert split_target("pod:9401") == ("", "pod", "9401")
    assert split_target("http:pod:metrics") == ("http", "pod", "metrics")
    with pytest.raises(ApiError, match="invalid pod request"):
        split_target("a:b:c:d")
