"""The HTTP face of the simulated cluster: an aiohttp app serving the Kubernetes REST API over the `Store`.

Routes: `/version`, `/api`, `/apis`, discovery per group/version, and every resource in the
registry at its real path (`/api/v1/namespaces/NS/pods/NAME/status`,
`/apis/resource.k8s.io/v1beta2/resourceslices`, custom resources once their CRD exists).
Lists and watch events are written from the stored bytes without parsing them. Every failure
becomes a `Status` body with the code a real apiserver sends; no input crashes a handler.

Deviations from a real apiserver, on purpose: no server-side apply (415), no dryRun (400),
no protobuf or Table output (JSON only), no admission beyond schema validation, deleting a
namespace does not cascade, pods are deleted without graceful termination, PUT without
metadata.resourceVersion is an unconditional update for every resource, `limit`/`continue`
pages over the current state rather than a snapshot (pages carry the first page's
resourceVersion), and a watch from a resourceVersion newer than the store's (a client that
outlived a restarted simulator) waits for it silently instead of answering 504
ResourceVersionTooLarge. The `/simulator/` prefix belongs to the fleet half of the simulator, which adds
its routes to the returned app.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from simulator.apiserver.errors import ApiError, bad_request, conflict, not_found
from simulator.apiserver.propagation import deletion_policy
from simulator.apiserver.resources import KUBERNETES_VERSION, ResourceInfo
from simulator.apiserver.selectors import parse_field_selector, parse_label_selector
from simulator.apiserver.store import Entry, Store, Watch

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


def create_app(
    store: Store,
    *,
    token: str | None = None,
    settings: ServerSettings | None = None,
) -> web.Application:
    """The aiohttp application serving `store` as a Kubernetes API."""
    settings = settings or ServerSettings()
    if token is not None:
        settings = ServerSettings(**{**settings.__dict__, "token": token})
    app = web.Application(
        middlewares=[_status_errors, _authenticate], client_max_size=settings.max_body_bytes
    )
    app[STORE] = store
    app[SETTINGS] = settings
    app[WATCHES] = OpenWatches()
    app.router.add_route("*", "/version", _wrap(_version))
    app.router.add_route("*", "/version/", _wrap(_version))
    app.router.add_route("*", "/api", _wrap(_api_versions))
    app.router.add_route("*", "/api/", _wrap(_api_versions))
    app.router.add_route("*", "/apis", _wrap(_api_groups))
    app.router.add_route("*", "/apis/", _wrap(_api_groups))
    for probe in ("/healthz", "/livez", "/readyz"):
        app.router.add_route("GET", probe, _ok)
    app.router.add_route("*", "/api/{path:.+}", _core)
    app.router.add_route("*", "/apis/{path:.+}", _named_group)
    app.on_shutdown.append(_close_watches)
    return app


async def _close_watches(app: web.Application) -> None:
    # Streaming handlers end on their own once their watch is closed; shutdown then completes.
    for watch in list(app[WATCHES].watches):
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


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type=_JSON)


def _raw(data: bytes, status: int = 200) -> web.Response:
    return web.Response(status=status, body=data, content_type=_JSON)


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


# ---- discovery --------------------------------------------------------------------------------


def _version(request: web.Request) -> dict[str, Any]:
    return {
        **KUBERNETES_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-04-22T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


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
        raise ApiError(
            404, "NotFound", f"the server could not find the requested resource ({info.plural}/{sub})"
        )
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
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
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
    if request.query.get("dryRun") and target.subresource != "eviction":  # eviction: `_evict` decides
        raise bad_request("dryRun is not supported by the simulated cluster")
    if target.name is None:
        if method == "GET":
            if _truthy(request.query.get("watch")):
                return await _watch(request, target)
            return await _list(request, target)
        if method == "POST":
            return await _create(request, target)
        if method == "DELETE":
            return _delete_collection(request, target)
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
        entry = request.app[STORE].get_entry(target.info.key, target.name, target.namespace)
        return _raw(_versioned(entry.data, target))
    if method == "PUT":
        return await _update(request, target)
    if method == "PATCH":
        return await _patch(request, target)
    return await _delete(request, target)


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


def _continue_token(rv: str, namespace: str, name: str) -> str:
    raw = orjson.dumps({"rv": rv, "ns": namespace, "name": name})
    return base64.urlsafe_b64encode(raw).decode()


def _parse_continue(token: str) -> tuple[str, tuple[str, str]]:
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token.encode()))
        return str(data["rv"]), (str(data["ns"]), str(data["name"]))
    except (binascii.Error, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise bad_request(f"invalid continue token: {exc}") from exc


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
    entries, rv = store.list_entries(
        info.key,
        target.namespace,
        label_selector=request.query.get("labelSelector"),
        field_selector=request.query.get("fieldSelector"),
    )
    limit = _int_param(request, "limit")
    token = request.query.get("continue")
    meta: dict[str, Any] = {}
    if token:
        rv, after = _parse_continue(token)
        entries = [e for e in entries if (e.namespace, e.name) > after]
    if limit:
        if len(entries) > limit:
            last = entries[limit - 1]
            meta["continue"] = _continue_token(rv, last.namespace, last.name)
            meta["remainingItemCount"] = len(entries) - limit
        entries = entries[:limit]
    meta["resourceVersion"] = rv
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


async def _watch(request: web.Request, target: Target) -> web.StreamResponse:
    store = request.app[STORE]
    settings = request.app[SETTINGS]
    query = request.query
    timeout = _int_param(request, "timeoutSeconds")
    bookmarks = _truthy(query.get("allowWatchBookmarks"))
    initial_end = bookmarks and _truthy(query.get("sendInitialEvents"))
    # Parse selectors before committing to a 200 stream, so bad ones get a plain 400.
    parse_label_selector(query.get("labelSelector"))
    parse_field_selector(query.get("fieldSelector"), target.info.selectable_fields)
    response = web.StreamResponse(status=200, headers={"Content-Type": _JSON})
    response.enable_chunked_encoding()
    try:
        watch = store.watch(
            target.info.key,
            target.namespace,
            resource_version=query.get("resourceVersion"),
            label_selector=query.get("labelSelector"),
            field_selector=query.get("fieldSelector"),
        )
    except ApiError as err:
        if err.code != 410:
            raise
        # Inside a watch, the real apiserver reports an expired resourceVersion as an ERROR event.
        await response.prepare(request)
        await response.write(b'{"type":"ERROR","object":' + orjson.dumps(err.status()) + b"}\n")
        await response.write_eof()
        return response
    watches = request.app[WATCHES].watches
    watches.add(watch)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (timeout if timeout else settings.default_watch_timeout_seconds)
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
            chunk = [_event_line(item, target)]
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
                line = _event_line(more, target)
                chunk.append(line)
                size += len(line)
            await response.write(b"".join(chunk))
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away; nothing to tell it
    finally:
        watch.close()
        watches.discard(watch)
    return response


def _event_line(item: tuple[str, Entry], target: Target) -> bytes:
    etype, entry = item
    return b'{"type":"' + etype.encode() + b'","object":' + _versioned(entry.data, target) + b"}\n"


def _bookmark(target: Target, rv: int, *, initial_end: bool = False) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    obj = {"kind": target.info.kind, "apiVersion": target.info.api_version(target.version), "metadata": meta}
    return b'{"type":"BOOKMARK","object":' + orjson.dumps(obj) + b"}\n"


# ---- writes -----------------------------------------------------------------------------------


async def _body(request: web.Request, *, patch: bool = False) -> Any:
    content_type = request.headers.get("Content-Type", _JSON).split(";", 1)[0].strip().lower()
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
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc


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
    body = _check_object(await _body(request), target)
    if target.info.namespaced and target.namespace is None:
        raise ApiError(405, "MethodNotAllowed", f"create {target.info.plural} needs a namespace in the URL")
    created = request.app[STORE].create(target.info.key, body, namespace=target.namespace)
    return _json(_versioned_obj(created, target), status=201)


async def _update(request: web.Request, target: Target) -> web.Response:
    body = _check_object(await _body(request), target)
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
    updated = request.app[STORE].update(target.info.key, body, subresource=target.subresource)
    return _json(_versioned_obj(updated, target))


async def _patch(request: web.Request, target: Target) -> web.Response:
    body = await _body(request, patch=True)
    assert target.name is not None
    content_type = request.headers.get("Content-Type", "")
    patched = request.app[STORE].patch(
        target.info.key, target.name, target.namespace, body, content_type, subresource=target.subresource
    )
    return _json(_versioned_obj(patched, target))


async def _delete_options(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
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


async def _delete(request: web.Request, target: Target) -> web.Response:
    store = request.app[STORE]
    assert target.name is not None
    options = await _delete_options(request)
    preconditions = options.get("preconditions") or {}
    if preconditions:
        if not isinstance(preconditions, dict):
            raise bad_request("preconditions must be an object")
        current = store.get(target.info.key, target.name, target.namespace)["metadata"]
        if preconditions.get("uid") not in (None, current.get("uid")):
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                f"UID in object meta: {current.get('uid')}",
            )
        if preconditions.get("resourceVersion") not in (None, current.get("resourceVersion")):
            raise conflict(target.info.plural, target.info.group, target.name)
    policy = deletion_policy(options, request.query)
    obj = store.delete(target.info.key, target.name, target.namespace, policy=policy)
    pending = bool(obj["metadata"].get("finalizers"))
    if pending or target.info.key in _RETURN_DELETED or target.info.custom:
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


def _delete_collection(request: web.Request, target: Target) -> web.Response:
    store = request.app[STORE]
    info = target.info
    if info.namespaced and target.namespace is None:
        raise _method_not_allowed("DELETE", f"{info.plural} across all namespaces")
    entries, _ = store.list_entries(
        info.key,
        target.namespace,
        label_selector=request.query.get("labelSelector"),
        field_selector=request.query.get("fieldSelector"),
    )
    items: list[dict[str, Any]] = []
    for entry in entries:
        try:
            items.append(_versioned_obj(store.delete(info.key, entry.name, target.namespace), target))
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
