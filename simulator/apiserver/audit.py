"""The simulated apiserver's audit log: who asked for what, as RBAC sees a request.

Every request for a resource is recorded with the attributes an authorizer decides on
(user, verb, API group, resource, subresource, namespace), derived from the URL the way the
real apiserver's request-info parsing does; discovery and other non-resource paths are not
recorded (every authenticated user may read them). Recorded when the request arrives,
whatever its answer: RBAC must allow an attempt, not only a success.

Users: the simulated cluster has no token review. When it accepts any request (no cluster
token), the bearer token a client presents *is* its user name, so a test gives each service
a kubeconfig whose token names its service account and reads back what each one called;
when a cluster token is set, every caller is `cluster-token` (the token is never recorded).

`GET /simulator/v1/audit` returns the log (`?clear=true` empties it after reading), for
tests that run the services as child processes. `install(app)` is the one hook in `app.py`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass

from aiohttp import web

ANONYMOUS = "system:anonymous"
TOKEN_USER = "cluster-token"
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_LIMIT = 100_000
"""Events kept; older ones are dropped (a test reads the log long before this)."""


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One resource request, as an RBAC authorizer sees it."""

    user: str
    verb: str
    """get, list, watch, create, update, patch, delete, deletecollection."""
    group: str
    """API group; "" for the core group."""
    resource: str
    subresource: str
    namespace: str
    """"" for cluster-scoped requests and requests across all namespaces."""
    name: str


def request_attributes(
    method: str, path: str, query: Mapping[str, str]
) -> tuple[str, str, str, str, str, str] | None:
    """(verb, group, resource, subresource, namespace, name) of a resource request; None otherwise."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None  # discovery: /api/v1, /apis/GROUP/VERSION
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if resource == "namespaces" and namespace == name:
        namespace = ""  # a Namespace object itself is cluster-scoped
    verb = _verb(method.upper(), bool(name), query.get("watch", "").lower() in ("true", "1"))
    if verb is None:
        return None
    return verb, group, resource, subresource, namespace, name


def _verb(method: str, named: bool, watch: bool) -> str | None:
    if method == "GET":
        return "watch" if watch else ("get" if named else "list")
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method)


class AuditLog:
    """The events since the cluster started (or since the last clear), oldest first."""

    def __init__(self) -> None:
        self._events: list[AuditEvent] = []

    def record(self, event: AuditEvent) -> None:
        self._events.append(event)
        if len(self._events) > _LIMIT:
            del self._events[: len(self._events) - _LIMIT]

    def events(self, *, clear: bool = False) -> list[AuditEvent]:
        events = list(self._events)
        if clear:
            self._events.clear()
        return events


AUDIT: web.AppKey[AuditLog] = web.AppKey("gpuhealth_sim_audit", AuditLog)
_HAS_CLUSTER_TOKEN: web.AppKey[bool] = web.AppKey("gpuhealth_sim_audit_token", bool)


def install(app: web.Application, *, cluster_token: bool) -> None:
    """Record every resource request `app` receives, and serve the log."""
    app[AUDIT] = AuditLog()
    app[_HAS_CLUSTER_TOKEN] = cluster_token
    app.middlewares.insert(0, _middleware)
    app.router.add_get("/simulator/v1/audit", _serve)


def _user(request: web.Request) -> str:
    if request.app[_HAS_CLUSTER_TOKEN]:
        return TOKEN_USER
    given = request.headers.get("Authorization", "")
    return given[7:].strip() or ANONYMOUS if given.startswith("Bearer ") else ANONYMOUS


@web.middleware
async def _middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    attributes = request_attributes(request.method, request.path, request.query)
    if attributes is not None:
        request.app[AUDIT].record(AuditEvent(_user(request), *attributes))
    return await handler(request)


async def _serve(request: web.Request) -> web.Response:
    clear = request.query.get("clear", "").lower() in ("true", "1")
    events = request.app[AUDIT].events(clear=clear)
    return web.json_response({"events": [asdict(e) for e in events]})
