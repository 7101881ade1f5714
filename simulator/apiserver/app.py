"""The HTTP face of the simulated cluster: an aiohttp app serving the Kubernetes REST API over the `Store`.

Routes: `/version`, `/api`, `/apis`, discovery per group/version, and every resource in the
registry at its real path (`/api/v1/namespaces/NS/pods/NAME/status`,
`/apis/resource.k8s.io/v1beta2/resourceslices`, custom resources once their CRD exists).
Lists and watch events are written from the stored bytes without parsing them. Every failure
becomes a `Status` body with the code a real apiserver sends; no input crashes a handler.

Writes take `dryRun=All` (answered as if done, nothing stored, no watch event) and
`fieldValidation=Strict|Warn|Ignore` (unknown and duplicate fields; warnings come back as
`Warning: 299 - "..."` headers); objects are defaulted and validated as by the apiserver
(`defaults.py`, `values.py`, `validation.py`).

Deviations from a real apiserver, on purpose: no server-side apply (415), no protobuf output
(JSON only; Tables and protobuf request bodies are `tables.py` and `protobuf.py`), no admission
plugins beyond the defaults they add, PUT without metadata.resourceVersion is an unconditional
update for every resource, and a list or watch from a resourceVersion newer than the store's
is answered 504 ResourceVersionTooLarge at once (the real one waits up to 3 s first). Which
state a list reads (`resourceVersionMatch`, continued pages as a snapshot) is decided in
`list_options.py` and served from the watch cache (`watch_cache.py`). The `/simulator/`
prefix belongs to the fleet half of the simulator, which adds
its routes to the returned app.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from simulator.apiserver import audit, openapi, protobuf, tables
from simulator.apiserver.binding import add_binding_route
from simulator.apiserver.errors import ApiError, bad_request, not_found, precondition_failed
from simulator.apiserver.faults import FaultInjector, FaultRule, Injection
from simulator.apiserver.list_options import ContinueExpired, ContinueToken, check_watch, read_at
from simulator.apiserver.propagation import deletion_policy
from simulator.apiserver.proxy import add_proxy_route
from simulator.apiserver.resources import CRD_KEY, ResourceInfo
from simulator.apiserver.selectors import parse_field_selector, parse_label_selector
from simulator.apiserver.store import Entry, Store, Watch
from simulator.apiserver.validation import FIELD_VALIDATIONS, WriteOptions, duplicate_fields
from simulator.apiserver.values import value as go_value

_JSON = "application/json"
_FOREIGN_PREFIX = "/simulator/"
"""Routes the fleet half adds; their responses are theirs, not Status objects."""
_AUTH_PREFIXES = ("/api", "/apis", "/version", "/openapi")
_RETURN_DELETED = frozenset({"pods", "namespaces", "customresourcedefinitions.apiextensions.k8s.io"})
"""Resources whose DELETE returns the deleted object; the others return a Success Status (as real)."""


@dataclass(frozen=True)
class ServerSettings:
    """How the HTTP layer behaves (the store holds all API state)."""

    token: str | None = None
    """Bearer token every API request must carry; None accepts any request."""
    bookmark_interval_seconds: float = 5.0
    """Seconds between BOOKMARK events on watches that allow them (real servers: about a minute)."""
    default_watch_timeout_seconds: float = 1800.0
    """A watch without timeoutSeconds ends after this long, like the apiserver's min-request-timeout."""
    max_body_bytes: int = 3 * 1024 * 1024
    """Largest request body accepted (etcd's object limit is 1.5 MiB; the apiserver allows 3 MiB)."""
    write_buffer_bytes: int = 256 * 1024
    """Watch events are flushed in chunks of about this size while more are ready."""


STORE: web.AppKey[Store] = web.AppKey("gpuhealth_sim_store", Store)
SETTINGS: web.AppKey[ServerSettings] = web.AppKey("gpuhealth_sim_settings", ServerSettings)


class OpenWatches:
    """The watches being streamed now, so shutdown can end them."""

    def __init__(self) -> None:
        self.watches: set[Watch] = set()


WATCHES: web.AppKey[OpenWatches] = web.AppKey("gpuhealth_sim_watches", OpenWatches)
OPENAPI: web.AppKey[openapi.OpenApiDocs] = web.AppKey("gpuhealth_sim_openapi", openapi.OpenApiDocs)
FAULTS: web.AppKey[FaultInjector] = web.AppKey("gpuhealth_sim_faults", FaultInjector)


def create_app(
    store: Store,
    *,
    token: str | None = None,
    settings: ServerSettings | None = None,
    faults: FaultInjector | None = None,
) -> web.Application:
    """The aiohttp application serving `store` as a Kubernetes API (`faults`: API faults to inject)."""
    settings = settings or ServerSettings()
    if token is not None:
        settings = ServerSettings(**{**settings.__dict__, "token": token})
    app = web.Application(
        middlewares=[_status_errors, _authenticate], client_max_size=settings.max_body_bytes
    )
    app[STORE] = store
    app[SETTINGS] = settings
    app[WATCHES] = OpenWatches()
    app[FAULTS] = faults if faults is not None else FaultInjector()
    app[FAULTS].end_watches = functools.partial(_end_watches, app)
    app[OPENAPI] = openapi.OpenApiDocs(store.kubernetes_version.info()["gitVersion"])
    app.router.add_route("*", "/version", _wrap(_version))
    app.router.add_route("*", "/version/", _wrap(_version))
    app.router.add_route("*", "/api", _wrap(_api_versions))
    app.router.add_route("*", "/api/", _wrap(_api_versions))
    app.router.add_route("*", "/apis", _wrap(_api_groups))
    app.router.add_route("*", "/apis/", _wrap(_api_groups))
    for probe in ("/healthz", "/livez", "/readyz"):
        app.router.add_route("GET", probe, _ok)
    add_binding_route(app, store)  # pods/binding, ahead of the catch-all resource routes
    add_proxy_route(app, store)  # pods/proxy, likewise
    app.router.add_route(
        "*", "/openapi/v2", _wrap_raw(lambda r: r.app[OPENAPI].serve_v2(r.app[STORE], _accept(r)))
    )
    app.router.add_route(
        "*",
        "/openapi/v3{path:(/.*)?}",
        _wrap_raw(
            lambda r: r.app[OPENAPI].serve_v3(r.app[STORE], r.match_info["path"].strip("/"), _accept(r))
        ),
    )
    app.router.add_route("*", "/api/{path:.+}", _core)
    app.router.add_route("*", "/apis/{path:.+}", _named_group)
    app.on_shutdown.append(_close_watches)
    audit.install(app, cluster_token=settings.token is not None)  # who called what (tests check RBAC with it)
    return app


async def _close_watches(app: web.Application) -> None:
    # Streaming handlers end on their own once their watch is closed; shutdown then completes.
    for watch in list(app[WATCHES].watches):
        watch.close()


def _end_watches(app: web.Application, rules: tuple[FaultRule, ...]) -> None:
    """End the open watches a watch fault matches: each client resumes from its resourceVersion,
    and the events the closed watch held back come again in the resumed one."""
    for watch in list(app[WATCHES].watches):
        info = watch.info
        if any(rule.matches("watch", info.key, info.plural, True, False) for rule in rules):
            watch.close()


# ---- middlewares ------------------------------------------------------------------------------


def _status_response(err: ApiError) -> web.Response:
    return web.Response(status=err.code, body=orjson.dumps(err.status()), content_type=_JSON)


@web.middleware
async def _status_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Turn every failure into a Status response, as the real apiserver does for any path."""
    if request.path.startswith(_FOREIGN_PREFIX):
        return await handler(request)
    try:
        return await handler(request)
    except ApiError as err:
        return _status_response(err)
    except web.HTTPRequestEntityTooLarge:
        return _status_response(ApiError(413, "RequestEntityTooLarge", "the request body is too large"))
    except web.HTTPMethodNotAllowed as exc:
        return _status_response(
            ApiError(405, "MethodNotAllowed", f"the server does not allow this method: {exc}")
        )
    except web.HTTPNotFound:
        return _status_response(ApiError(404, "NotFound", "the server could not find the requested resource"))
    except web.HTTPException as exc:
        return _status_response(ApiError(exc.status, exc.reason.replace(" ", ""), exc.text or exc.reason))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # a handler bug must become a 500 Status, not a dropped connection
        return _status_response(
            ApiError(500, "InternalError", f"internal error: {type(exc).__name__}: {exc}")
        )


@web.middleware
async def _authenticate(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    token = request.app[SETTINGS].token
    if token is not None and request.path.startswith(_AUTH_PREFIXES):
        given = request.headers.get("Authorization", "")
        if not (given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip(), token)):
            raise ApiError(401, "Unauthorized", "Unauthorized")
    return await handler(request)


def _wrap(fn: Callable[[web.Request], dict[str, Any]]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        if request.method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"the server does not allow the method {request.method}")
        return _json(fn(request))

    return handler


def _wrap_raw(fn: Callable[[web.Request], bytes]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        if request.method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"the server does not allow the method {request.method}")
        return _raw(fn(request))

    return handler


def _accept(request: web.Request) -> str | None:
    return request.headers.get("Accept")


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type=_JSON)


def _raw(data: bytes, status: int = 200) -> web.Response:
    return web.Response(status=status, body=data, content_type=_JSON)


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


# ---- discovery --------------------------------------------------------------------------------


def _version(request: web.Request) -> dict[str, Any]:
    return request.app[STORE].kubernetes_version.info()


def _api_versions(request: web.Request) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}],
    }


def _group_body(group: str, versions: tuple[str, ...]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def _api_groups(request: web.Request) -> dict[str, Any]:
    groups = request.app[STORE].registry.groups()
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group_body(g, vs) for g, vs in groups]}


def _resource_list(store: Store, group: str, version: str) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for info in store.registry.in_group_version(group, version):
        entry: dict[str, Any] = {
            "name": info.plural,
            "singularName": info.singular,
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": list(info.verbs),
        }
        if info.short_names:
            entry["shortNames"] = list(info.short_names)
        categories = [*info.categories, *(["all"] if info.key in tables.CATEGORY_ALL else [])]
        if categories:
            entry["categories"] = list(dict.fromkeys(categories))
        resources.append(entry)
        if info.has_status:
            resources.append(
                {
                    "name": f"{info.plural}/status",
                    "singularName": "",
                    "namespaced": info.namespaced,
                    "kind": info.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if "eviction" in info.subresources:
            resources.append(
                {
                    "name": f"{info.plural}/eviction",
                    "singularName": "",
                    "namespaced": info.namespaced,
                    "group": "policy",
                    "version": "v1",
                    "kind": "Eviction",
                    "verbs": ["create"],
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


# ---- routing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a resource URL names."""

    info: ResourceInfo
    version: str
    namespace: str | None
    name: str | None
    subresource: str | None


def resolve_path(store: Store, group: str, version: str, segments: list[str]) -> Target:
    """The resource target of a URL below /api/VERSION or /apis/GROUP/VERSION; ApiError 404 when none."""
    registry = store.registry
    if any(not s for s in segments):
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    namespace: str | None = None
    rest = segments
    if len(segments) >= 3 and segments[0] == "namespaces":
        candidate = registry.find(group, version, segments[2])
        if candidate is not None and candidate.namespaced:
            namespace, rest = segments[1], segments[2:]
    info = registry.find(group, version, rest[0])
    if info is None or len(rest) > 3:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    if info.namespaced and namespace is None and len(rest) > 1:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if sub is not None and sub not in info.subresources:
        raise ApiError(404, "NotFound", "the server could not find the requested resource", details={})
    return Target(info, version, namespace, name, sub)


async def _core(request: web.Request) -> web.StreamResponse:
    segments = request.match_info["path"].rstrip("/").split("/")
    version = segments[0]
    if version != "v1":
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    if len(segments) == 1:
        if request.method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"the server does not allow the method {request.method}")
        return _json(_resource_list(request.app[STORE], "", "v1"))
    return await _serve(request, resolve_path(request.app[STORE], "", version, segments[1:]))


async def _named_group(request: web.Request) -> web.StreamResponse:
    store = request.app[STORE]
    segments = request.match_info["path"].rstrip("/").split("/")
    group = segments[0]
    versions = dict(store.registry.groups()).get(group)
    if versions is None:
        # No handler serves an unknown group: the apiserver's mux answers, in plain text.
        return web.Response(status=404, text="404 page not found\n", content_type="text/plain")
    if len(segments) <= 2:
        if request.method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"the server does not allow the method {request.method}")
        if len(segments) == 1:
            return _json({"kind": "APIGroup", "apiVersion": "v1", **_group_body(group, versions)})
        if segments[1] not in versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _json(_resource_list(store, group, segments[1]))
    return await _serve(request, resolve_path(store, group, segments[1], segments[2:]))


def _method_not_allowed(method: str, what: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", f"the server does not allow the method {method} on {what}")


async def _serve(request: web.Request, target: Target) -> web.StreamResponse:
    method = request.method
    faults = request.app[FAULTS]
    fault = await faults.for_request(request, target) if faults.active else None  # fault-free: one test
    if fault is not None and (answer := await fault.answer()) is not None:
        return answer
    if target.name is None:
        if method == "GET":
            if _truthy(request.query.get("watch")):
                return await _watch(request, target, fault)
            return await _list(request, target)
        if method == "POST":
            return await _create(request, target)
        if method == "DELETE":
            return await _delete_collection(request, target)
        raise _method_not_allowed(method, f"{target.info.plural} (collection)")
    if target.subresource == "eviction":
        if method != "POST":
            raise _method_not_allowed(method, f"{target.info.plural}/eviction")
        return await _evict(request, target)
    if target.subresource == "status" and method in ("GET", "PUT", "PATCH"):
        pass
    elif target.subresource is not None or method not in ("GET", "PUT", "PATCH", "DELETE"):
        raise _method_not_allowed(method, target.info.plural)
    if method == "GET":
        table = _table(request, target)
        entry = request.app[STORE].get_entry(target.info.key, target.name, target.namespace)
        if table is not None:
            return _json(table.render([orjson.loads(_versioned(entry.data, target))], {}))
        return _raw(_versioned(entry.data, target))
    if method == "PUT":
        return await _update(request, target)
    if method == "PATCH":
        return await _patch(request, target)
    return await _delete(request, target)


@dataclass(frozen=True)
class _TableOutput:
    """A Table response was negotiated (kubectl get): how to print the target's objects now."""

    request: tables.TableRequest
    printer: tables.KindPrinter
    now: float

    def render(self, objects: list[dict[str, Any]], list_meta: dict[str, Any]) -> dict[str, Any]:
        return tables.render_table(self.printer, objects, self.request, now=self.now, list_meta=list_meta)


def _table(request: web.Request, target: Target) -> _TableOutput | None:
    """The Table output the Accept header asks for, or None for plain JSON (406 when neither fits)."""
    table = tables.table_request(request.headers.get("Accept"), request.query.get("includeObject"))
    if table is None:
        return None
    store = request.app[STORE]
    crd = None
    if target.info.custom:
        with contextlib.suppress(ApiError):
            crd = store.get(CRD_KEY, target.info.key)
    printer = tables.printer_for(target.info, target.version, crd)
    return _TableOutput(table, printer, store.clock.now())


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


def _versioned(data: bytes, target: Target) -> bytes:
    """Stored bytes as the requested version: only the apiVersion prefix differs between served versions."""
    info = target.info
    if target.version == info.version:
        return data
    prefix = b'{"apiVersion":"' + info.api_version().encode() + b'"'
    if data.startswith(prefix):
        return b'{"apiVersion":"' + info.api_version(target.version).encode() + b'"' + data[len(prefix) :]
    obj = orjson.loads(data)
    obj["apiVersion"] = info.api_version(target.version)
    return orjson.dumps(obj)


def _versioned_obj(obj: dict[str, Any], target: Target) -> dict[str, Any]:
    obj["apiVersion"] = target.info.api_version(target.version)
    return obj


# ---- reads ------------------------------------------------------------------------------------


def _int_param(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError as exc:
        raise bad_request(f"invalid value for {name}: {value!r}") from exc
    if number < 0:
        raise bad_request(f"{name} must not be negative")
    return number


async def _list(request: web.Request, target: Target) -> web.StreamResponse:
    store = request.app[STORE]
    info = target.info
    query = request.query
    table = _table(request, target)
    limit = _int_param(request, "limit")
    read = read_at(query, store.resource_version)
    try:
        # Every page of one list reads the state at the first page's resourceVersion, as from etcd.
        entries, rv = store.list_entries(
            info.key,
            target.namespace,
            label_selector=query.get("labelSelector"),
            field_selector=query.get("fieldSelector"),
            at=read.exact,
        )
    except ApiError as err:
        if err.code == 410 and query.get("continue"):
            raise ContinueExpired(ContinueToken.decode(query["continue"])) from err
        raise
    meta: dict[str, Any] = {}
    if read.after is not None:
        after = read.after
        entries = [e for e in entries if (e.namespace, e.name) > after]
    if limit:
        if len(entries) > limit:
            last = entries[limit - 1]
            meta["continue"] = ContinueToken(int(rv), (last.namespace, last.name)).encode()
            # Known only without selectors, as with the real apiserver (it does not count matches ahead).
            if not query.get("labelSelector") and not query.get("fieldSelector"):
                meta["remainingItemCount"] = len(entries) - limit
        entries = entries[:limit]
    meta["resourceVersion"] = rv
    if table is not None:
        return _json(table.render([orjson.loads(_versioned(e.data, target)) for e in entries], meta))
    head = orjson.dumps(
        {"kind": info.list_kind(), "apiVersion": info.api_version(target.version), "metadata": meta}
    )
    head = head[:-1] + b',"items":['
    chunk_bytes = request.app[SETTINGS].write_buffer_bytes
    if len(entries) * 2048 < chunk_bytes:
        return _raw(b"".join((head, b",".join(_versioned(e.data, target) for e in entries), b"]}")))
    # Big lists are streamed in chunks: neither a joined copy of the whole body nor a transport
    # buffer holding all of it (a 80,000-pod list is about 160 MiB of JSON).
    response = web.StreamResponse(status=200, headers={"Content-Type": _JSON})
    response.enable_chunked_encoding()
    await response.prepare(request)
    parts: list[bytes] = [head]
    size = len(head)
    for index, entry in enumerate(entries):
        data = _versioned(entry.data, target)
        parts.append(b"," + data if index else data)
        size += len(data) + 1
        if size >= chunk_bytes:
            await response.write(b"".join(parts))
            parts, size = [], 0
    parts.append(b"]}")
    await response.write(b"".join(parts))
    await response.write_eof()
    return response


async def _watch(request: web.Request, target: Target, fault: Injection | None = None) -> web.StreamResponse:
    store = request.app[STORE]
    settings = request.app[SETTINGS]
    query = request.query
    timeout = _int_param(request, "timeoutSeconds")
    bookmarks = _truthy(query.get("allowWatchBookmarks"))
    initial_end = bookmarks and _truthy(query.get("sendInitialEvents"))
    check_watch(query)
    # Parse selectors before committing to a 200 stream, so bad ones get a plain 400.
    parse_label_selector(query.get("labelSelector"))
    parse_field_selector(query.get("fieldSelector"), target.info.selectable_fields)
    table = _table(request, target)
    response = web.StreamResponse(status=200, headers={"Content-Type": _JSON})
    response.enable_chunked_encoding()
    try:
        if fault is not None and (
            gone := fault.expired(query.get("resourceVersion"), store.resource_version)
        ):
            raise gone
        watch = store.watch(
            target.info.key,
            target.namespace,
            resource_version=query.get("resourceVersion"),
            label_selector=query.get("labelSelector"),
            field_selector=query.get("fieldSelector"),
        )
    except ApiError as err:
        if err.code not in (410, 504):
            raise
        # Inside a watch, the real apiserver reports an expired resourceVersion as an ERROR event;
        # a future one too (504 ResourceVersionTooLarge), here at once instead of after its 3 s wait.
        await response.prepare(request)
        await response.write(b'{"type":"ERROR","object":' + orjson.dumps(err.status()) + b"}\n")
        await response.write_eof()
        return response
    watches = request.app[WATCHES].watches
    watches.add(watch)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (timeout if timeout else settings.default_watch_timeout_seconds)
    cut = fault.cut_at(loop.time(), deadline) if fault is not None else None
    deadline = cut or deadline
    try:
        await response.prepare(request)
        initial_pending = initial_end
        while not watch.closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if initial_pending and not watch.in_backlog:
                # Right after the last initial event and before any live one, at the
                # resourceVersion of the initial state (live events queued meanwhile are newer).
                initial_pending = False
                await response.write(_bookmark(target, watch.backlog_rv, initial_end=True))
            wait = min(remaining, settings.bookmark_interval_seconds) if bookmarks else remaining
            try:
                async with asyncio.timeout(wait):
                    item = await watch.next_entry()
            except TimeoutError:
                if bookmarks and loop.time() < deadline and not watch.pending():
                    await response.write(_bookmark(target, store.resource_version))
                continue
            if item is None:
                break
            chunk = [_event_line(item, target, table)]
            size = len(chunk[0])
            # Batch what is ready already: one write per chunk, not per event, for big initial lists;
            # a batch of initial events stops where they end, for the initial-events-end bookmark.
            while (
                size < settings.write_buffer_bytes
                and watch.pending()
                and not watch.closed
                and not (initial_pending and not watch.in_backlog)
            ):
                more = await watch.next_entry()
                if more is None:
                    break
                line = _event_line(more, target, table)
                chunk.append(line)
                size += len(line)
            await response.write(b"".join(chunk))
        if cut is not None and loop.time() >= cut and request.transport is not None:
            request.transport.abort()  # an injected drop: the connection goes, no end of stream
            return response
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away; nothing to tell it
    finally:
        watch.close()
        watches.discard(watch)
    return response


def _event_line(item: tuple[str, Entry], target: Target, table: _TableOutput | None = None) -> bytes:
    etype, entry = item
    data = _versioned(entry.data, target)
    if table is not None:
        # kubectl get -w: each event's object is a one-row Table (columns repeated; kubectl prints them once).
        data = orjson.dumps(table.render([orjson.loads(data)], {"resourceVersion": str(entry.rv)}))
    return b'{"type":"' + etype.encode() + b'","object":' + data + b"}\n"


def _bookmark(target: Target, rv: int, *, initial_end: bool = False) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    obj = {"kind": target.info.kind, "apiVersion": target.info.api_version(target.version), "metadata": meta}
    return b'{"type":"BOOKMARK","object":' + orjson.dumps(obj) + b"}\n"


# ---- writes -----------------------------------------------------------------------------------


async def _body(request: web.Request, *, patch: bool = False, duplicates: list[str] | None = None) -> Any:
    content_type = request.headers.get("Content-Type", _JSON).split(";", 1)[0].strip().lower()
    if content_type == protobuf.PROTOBUF and not patch:
        return protobuf.decode_body(await request.read())
    if not patch and content_type and "json" not in content_type:
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: {_JSON}",
        )
    raw = await request.read()
    if not raw.strip():
        raise bad_request("the request body is empty")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc
    if duplicates is not None and isinstance(body, dict):
        duplicates.extend(duplicate_fields(raw))
    return body


_OPTIONS_KIND = {
    "POST": "CreateOptions",
    "PUT": "UpdateOptions",
    "PATCH": "PatchOptions",
    "DELETE": "DeleteOptions",
}


def _options_invalid(request: web.Request, field: str, message: str) -> ApiError:
    # The apiserver validates query options as an object of their own: `CreateOptions.meta.k8s.io "" ...`.
    kind = _OPTIONS_KIND.get(request.method, "CreateOptions")
    return ApiError(
        422,
        "Invalid",
        f'{kind}.meta.k8s.io "" is invalid: {field}: {message}',
        details={
            "group": "meta.k8s.io",
            "kind": kind,
            "causes": [{"reason": "FieldValueNotSupported", "message": message, "field": field}],
        },
    )


def _dry_run(request: web.Request, extra: Any = None) -> bool:
    """Whether the request is a dry run; 422 for any value but "All" (query, or DeleteOptions' list)."""
    values = request.query.getall("dryRun", [])
    if isinstance(extra, list):
        values = [*values, *extra]
    elif extra is not None:
        values = [*values, extra]
    if any(v != "All" for v in values):
        shown = go_value([str(v) for v in values])  # the apiserver prints lists as JSON: ["Some"]
        raise _options_invalid(request, "dryRun", f'Unsupported value: {shown}: supported values: "All"')
    return bool(values)


def _write_options(request: web.Request) -> WriteOptions:
    mode = request.query.get("fieldValidation", "") or "Warn"
    if mode not in FIELD_VALIDATIONS:
        raise _options_invalid(
            request,
            "fieldValidation",
            f'Unsupported value: {go_value(mode)}: supported values: "", "Ignore", "Strict", "Warn"',
        )
    return WriteOptions(dry_run=_dry_run(request), field_validation=mode)


def _answer(body: Any, options: WriteOptions, status: int = 200) -> web.Response:
    response = _json(body, status=status)
    for text in options.warnings:
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        response.headers.add("Warning", f'299 - "{escaped}"')
    return response


def _check_object(body: Any, target: Target) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    info = target.info
    kind = body.get("kind")
    if kind not in (None, "", info.kind):
        raise bad_request(f"the kind of the object ({kind}) does not match the resource ({info.kind})")
    api_version = body.get("apiVersion")
    if api_version not in (None, "") and api_version not in tuple(info.api_version(v) for v in info.versions):
        raise bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version "
            f"({info.api_version(target.version)})"
        )
    meta = body.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise bad_request("metadata must be an object")
    return body


async def _create(request: web.Request, target: Target) -> web.Response:
    options = _write_options(request)
    body = _check_object(await _body(request, duplicates=options.duplicates), target)
    if target.info.namespaced and target.namespace is None:
        raise ApiError(405, "MethodNotAllowed", f"create {target.info.plural} needs a namespace in the URL")
    created = request.app[STORE].create(target.info.key, body, namespace=target.namespace, options=options)
    return _answer(_versioned_obj(created, target), options, status=201)


async def _update(request: web.Request, target: Target) -> web.Response:
    options = _write_options(request)
    body = _check_object(await _body(request, duplicates=options.duplicates), target)
    meta = body.setdefault("metadata", {})
    if meta.get("name") not in (None, target.name):
        raise bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name on the URL ({target.name})"
        )
    meta["name"] = target.name
    if target.info.namespaced:
        if meta.get("namespace") not in (None, "", target.namespace):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        meta["namespace"] = target.namespace
    updated = request.app[STORE].update(
        target.info.key, body, subresource=target.subresource, options=options
    )
    return _answer(_versioned_obj(updated, target), options)


APPLY_PATCH = ("application/apply-patch+yaml", "application/apply-patch+cbor")


async def _patch(request: web.Request, target: Target) -> web.Response:
    media = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if media in APPLY_PATCH:
        # Refused before the body is read: an apply body is YAML, and "not valid JSON" would
        # send a user looking in the wrong place.
        raise ApiError(
            415,
            "UnsupportedMediaType",
            "server-side apply is not supported by the simulated cluster: use client-side "
            "`kubectl apply` (without --server-side) or a merge patch (application/merge-patch+json)",
        )
    options = _write_options(request)
    body = await _body(request, patch=True, duplicates=options.duplicates)
    assert target.name is not None
    content_type = request.headers.get("Content-Type", "")
    patched = request.app[STORE].patch(
        target.info.key,
        target.name,
        target.namespace,
        body,
        content_type,
        subresource=target.subresource,
        options=options,
    )
    return _answer(_versioned_obj(patched, target), options)


async def _delete_options(request: web.Request) -> dict[str, Any]:
    # `read()`, never `can_read_body`: that is False once the body was read, and the fault
    # injector reads it first to tell a conditional delete (`faults.is_conditional`); `read()`
    # gives the same bytes again (b"" for no body).
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        options = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(options, dict):
        raise bad_request("DeleteOptions must be a JSON object")
    return options


def _grace_period(request: web.Request, options: dict[str, Any]) -> int | None:
    """DeleteOptions.gracePeriodSeconds, from the body or the query (the body wins, as real)."""
    value: Any = options.get("gracePeriodSeconds")
    if value is None and "gracePeriodSeconds" in request.query:
        try:
            value = int(request.query["gracePeriodSeconds"])
        except ValueError:
            raise bad_request(
                f"invalid value for gracePeriodSeconds: {request.query['gracePeriodSeconds']!r}"
            ) from None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise bad_request(f"gracePeriodSeconds must be an integer, got {value!r}")
    return value


async def _delete(request: web.Request, target: Target) -> web.Response:
    store = request.app[STORE]
    assert target.name is not None
    options = await _delete_options(request)
    dry_run = _dry_run(request, options.get("dryRun"))
    preconditions = options.get("preconditions") or {}
    if preconditions:
        if not isinstance(preconditions, dict):
            raise bad_request("preconditions must be an object")
        current = store.get(target.info.key, target.name, target.namespace)["metadata"]
        for field, word, consequence in (
            ("uid", "UID", "deleted and then recreated"),
            ("resourceVersion", "ResourceVersion", "modified"),
        ):
            if preconditions.get(field) not in (None, current.get(field)):
                raise precondition_failed(
                    target.info,
                    target.name,
                    f"the {word} in the precondition ({preconditions[field]}) "
                    f"does not match the {word} in record ({current.get(field)}). "
                    f"The object might have been {consequence}",
                )
    grace = _grace_period(request, options)
    policy = deletion_policy(options, request.query)
    obj = store.delete(
        target.info.key,
        target.name,
        target.namespace,
        grace_period_seconds=grace,
        dry_run=dry_run,
        policy=policy,
    )
    pending = bool(obj["metadata"].get("finalizers") or obj["metadata"].get("deletionTimestamp"))
    if pending or target.info.key in _RETURN_DELETED:
        return _json(_versioned_obj(obj, target))
    details: dict[str, Any] = {
        "name": target.name,
        "kind": target.info.plural,
        "uid": obj["metadata"].get("uid"),
    }
    if target.info.group:
        details["group"] = target.info.group
    return _json(
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
    )


async def _delete_collection(request: web.Request, target: Target) -> web.Response:
    store = request.app[STORE]
    info = target.info
    if info.namespaced and target.namespace is None:
        raise _method_not_allowed("DELETE", f"{info.plural} across all namespaces")
    options = await _delete_options(request)
    dry_run = _dry_run(request, options.get("dryRun"))
    entries, _ = store.list_entries(
        info.key,
        target.namespace,
        label_selector=request.query.get("labelSelector"),
        field_selector=request.query.get("fieldSelector"),
    )
    items: list[dict[str, Any]] = []
    for entry in entries:
        try:
            deleted = store.delete(info.key, entry.name, target.namespace, dry_run=dry_run)
            items.append(_versioned_obj(deleted, target))
        except ApiError as err:
            if err.code != 404:
                raise
    body = {
        "kind": info.list_kind(),
        "apiVersion": info.api_version(target.version),
        "metadata": {"resourceVersion": str(store.resource_version)},
        "items": items,
    }
    return _json(body)


async def _evict(request: web.Request, target: Target) -> web.Response:
    body = await _body(request)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a policy/v1 Eviction object")
    if body.get("kind") not in (None, "Eviction"):
        raise bad_request(f"the kind of the object ({body.get('kind')}) must be Eviction")
    name = (body.get("metadata") or {}).get("name") if isinstance(body.get("metadata"), dict) else None
    if name not in (None, target.name):
        raise bad_request(f"name in URL does not match name in Eviction object ({name} != {target.name})")
    assert target.name is not None and target.namespace is not None
    store = request.app[STORE]
    try:
        store.get_entry("pods", target.name, target.namespace)
    except ApiError as err:
        raise not_found("pods", "", target.name) from err
    dry_run = request.query.getall("dryRun", [])
    if any(v != "All" for v in dry_run):
        raise bad_request(f"unsupported dryRun value(s): {', '.join(dry_run)}")
    result = store.evict(target.name, target.namespace, body, dry_run=bool(dry_run))
    return _json(result, status=201)
