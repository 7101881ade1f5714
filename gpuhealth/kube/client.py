"""`KubeClient`: the typed, synchronous surface for reading and writing Kubernetes objects.

Objects are plain dicts (orjson), never the official client's models. Every path comes
from a `Resource`; every failure is an `errors.ApiError` subclass. Writes are optimistic:
`update` sends the object's `metadata.resourceVersion`, so a concurrent change answers 409
(`Conflict`) and the caller re-reads and decides again; `delete` takes uid and
resourceVersion preconditions for the same reason. `dry_run=True` asks the apiserver to
validate and admit a write without persisting it (`dryRun=All`).

Synchronous like the transport: services run it in threads. `close()` (from any thread)
shuts every response in flight, which ends blocked reads (watches) at once, and refuses
new requests.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import orjson

from gpuhealth.kube.api import ObjectList, PatchType, PropagationPolicy
from gpuhealth.kube.errors import NotFound, error_from_status
from gpuhealth.kube.meta import resource_version as object_resource_version
from gpuhealth.kube.pages import Page, PageDecoder, decode_page
from gpuhealth.kube.resources import Resource
from gpuhealth.kube.transport import Params, Response, Transport
from gpuhealth.kube.watch import ERROR, WatchEvent, decode_event, split_lines

log = logging.getLogger(__name__)

_JSON = "application/json"


class ClientClosed(RuntimeError):
    """A request on a client that was closed (the service is stopping)."""


class KubeClient:
    """Typed requests over a `Transport`; one per service (or per run of a loop that `close()` ends)."""

    def __init__(
        self,
        transport: Transport,
        *,
        connect_timeout_seconds: float = 10.0,
        read_timeout_seconds: float = 30.0,
    ) -> None:
        """`read_timeout_seconds`: the longest wait for bytes of a response; a watch waits its
        timeoutSeconds plus this long before its connection is taken for dead."""
        self._transport = transport
        self._connect_timeout = connect_timeout_seconds
        self._read_timeout = read_timeout_seconds
        self._open_responses: set[Response] = set()
        self._lock = threading.Lock()
        self._closed = False

    # ----- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Shut every response in flight (ending blocked reads) and refuse new requests."""
        with self._lock:
            self._closed = True
            responses = list(self._open_responses)
        for response in responses:
            response.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # ----- reads ------------------------------------------------------------------------

    def get(
        self, resource: Resource, name: str, *, namespace: str | None = None, subresource: str | None = None
    ) -> dict[str, Any]:
        """One object (or its subresource, e.g. `resources.STATUS`); `NotFound` when absent."""
        return self._call("GET", resource.path(namespace, name, subresource))

    def proxy_get(
        self,
        resource: Resource,
        name: str,
        path: str,
        *,
        namespace: str | None = None,
        port: int | str = "",
        scheme: str = "",
    ) -> dict[str, Any]:
        """GET `path` of the object's `proxy` subresource (a pod's or service's own HTTP endpoint,
        reached through the apiserver with its authentication and RBAC); the answer as JSON.

        `port` is a number or a port name (the object's default when empty); `scheme` `https`
        for an endpoint behind TLS (the apiserver does not verify the pod's certificate). An
        answer that is not 2xx raises the `ApiError` its status maps to, like any other call."""
        target = f"{name}:{port}" if port != "" else name
        if scheme:
            target = f"{scheme}:{name}:{port}"
        return self._call("GET", resource.path(namespace, target, "proxy") + "/" + path.lstrip("/"))

    def served_versions(self, group: str, plural: str) -> tuple[str, ...]:
        """The versions of `group` that serve `plural`, as discovery says (preferred first).

        Empty when the group is not served at all. What a client uses to pick a version a
        cluster of another Kubernetes release serves (e.g. DeviceTaintRule: v1, v1beta2, v1alpha3).
        """
        try:
            group_doc = self._call("GET", f"/apis/{group}")
        except NotFound:
            return ()
        versions = [v.get("version") for v in group_doc.get("versions") or [] if isinstance(v, dict)]
        preferred = (group_doc.get("preferredVersion") or {}).get("version")
        ordered = sorted((v for v in versions if isinstance(v, str)), key=lambda v: v != preferred)
        served = []
        for version in ordered:
            try:
                resources = self._call("GET", f"/apis/{group}/{version}").get("resources") or []
            except NotFound:
                continue
            if any(isinstance(r, dict) and r.get("name") == plural for r in resources):
                served.append(version)
        return tuple(served)

    def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> ObjectList:
        """Every object of a collection (all namespaces when `namespace` is None), read in pages.

        Pages of `page_size` bound the memory of each response (the apiserver's recommended
        size); the resourceVersion is the list's, to start a watch from. A reader that need
        not hold every object at once takes `pages` instead.
        """
        items: list[dict[str, Any]] = []
        for page in self.pages(
            resource,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            page_size=page_size,
        ):
            items.extend(page.items)
            if not page.continue_token:
                assert page.resource_version is not None  # `pages` checks the last page
                return ObjectList(items, page.resource_version)
        raise AssertionError("pages() ends with a last page")  # pragma: no cover

    def pages(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        decode: PageDecoder = decode_page,
    ) -> Iterator[Page]:
        """A list, one page at a time, each decoded by `decode` as it arrives.

        Only one page's body is held at once, so a reader that folds each page before
        taking the next never holds the whole collection (a 10,000-node fleet's pods are
        about 40 MiB of JSON and four times that as dicts). The last page (an empty
        `continue_token`) carries the resourceVersion to watch from; a malformed body
        raises ValueError naming the collection.
        """
        path = resource.path(namespace)
        selectors = _selectors(label_selector, field_selector)
        token = ""
        while True:
            params = [*selectors, ("limit", str(page_size))]
            if token:
                params.append(("continue", token))
            body = self._read("GET", path, params)
            try:
                page = decode(body)
            except ValueError as exc:
                raise ValueError(f"list of {resource.plural}: {exc}") from None
            del body
            if not page.continue_token and page.resource_version is None:
                raise ValueError(f"list of {resource.plural}: no resourceVersion")
            yield page
            if not page.continue_token:
                return
            token = page.continue_token

    def watch(
        self,
        resource: Resource,
        *,
        resource_version: str | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        bookmarks: bool = True,
    ) -> WatchStream:
        """Open a watch from `resource_version` (None: the current state as ADDED events first).

        The server ends it after `timeout_seconds`; resume from `WatchStream.resource_version`.
        `Gone` (raised here or while reading) means that version expired: list again.
        """
        params = [
            *_selectors(label_selector, field_selector),
            ("watch", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if resource_version is not None:
            params.append(("resourceVersion", resource_version))
        if bookmarks:
            params.append(("allowWatchBookmarks", "true"))
        read_timeout = timeout_seconds + self._read_timeout
        return WatchStream(
            self, self._open("GET", resource.path(namespace), params, read_timeout=read_timeout)
        )

    # ----- writes -----------------------------------------------------------------------

    def create(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """POST a new object (namespace from the argument or its metadata); `AlreadyExists` if taken.

        With `subresource`, POST to that subresource of the object `obj` names (a pod's `eviction`).
        """
        if resource.namespaced and namespace is None:
            namespace = _metadata(obj).get("namespace")
            if not isinstance(namespace, str) or not namespace:
                raise ValueError(f"creating {resource.plural}: no namespace given")
        if subresource is None:
            return self._call("POST", resource.path(namespace), _dry_run(dry_run), obj)
        name = _metadata(obj).get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"creating {resource.plural}/{subresource}: the object has no name")
        return self._call("POST", resource.path(namespace, name, subresource), _dry_run(dry_run), obj)

    def update(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """PUT `obj` back, conditional on its `metadata.resourceVersion` (`Conflict` when stale).

        The object must carry the resourceVersion it was read at: an unconditional
        replace would silently undo whatever others wrote meanwhile (use `patch` for that).
        """
        meta = _metadata(obj)
        if not meta.get("resourceVersion"):
            raise ValueError(f"updating {resource.plural}: the object has no metadata.resourceVersion")
        name, namespace = meta.get("name"), meta.get("namespace") if resource.namespaced else None
        if not isinstance(name, str) or (resource.namespaced and not isinstance(namespace, str)):
            raise ValueError(f"updating {resource.plural}: the object lacks its name or namespace")
        return self._call("PUT", resource.path(namespace, name, subresource), _dry_run(dry_run), obj)

    def patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """PATCH an object: a merge patch (a dict) or a JSON patch (a list of operations).

        A merge patch that sets `metadata.resourceVersion` is conditional like `update`.
        """
        if (patch_type is PatchType.MERGE) != isinstance(patch, Mapping):
            raise TypeError(
                f"a {patch_type.name} patch takes {'a dict' if patch_type is PatchType.MERGE else 'a list'}"
            )
        path = resource.path(namespace, name, subresource)
        return self._call("PATCH", path, _dry_run(dry_run), patch, content_type=patch_type.value)

    def delete(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation_policy: PropagationPolicy | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """DELETE an object, only if it still is the one meant (`uid`) at the version decided on.

        Returns what the apiserver answers: the object (still there with a deletionTimestamp
        while finalizers run) or a Success Status. `Conflict` when a precondition fails.
        `grace_period_seconds` replaces a pod's own grace period (0: at once, what a kubelet
        sends once its containers are gone); None leaves the object's default.
        """
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        preconditions = {
            key: value
            for key, value in (("uid", uid), ("resourceVersion", resource_version))
            if value is not None
        }
        if preconditions:
            options["preconditions"] = preconditions
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            if grace_period_seconds < 0:
                raise ValueError(f"grace period must be 0 or more seconds, not {grace_period_seconds}")
            options["gracePeriodSeconds"] = grace_period_seconds
        return self._call("DELETE", resource.path(namespace, name), _dry_run(dry_run), options)

    # ----- plumbing ---------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        params: Params = (),
        body: Any = None,
        *,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        data = None if body is None else orjson.dumps(body)
        if data is not None and content_type is None:
            content_type = _JSON
        result = orjson.loads(self._read(method, path, params, body=data, content_type=content_type))
        if not isinstance(result, dict):
            raise ValueError(f"{method} {path}: the response is not a JSON object")
        return result

    def _read(
        self,
        method: str,
        path: str,
        params: Params = (),
        *,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> bytes:
        """The whole body of a 2xx answer (others raise through the transport)."""
        response = self._open(method, path, params, body=body, content_type=content_type)
        try:
            return response.read()
        finally:
            self._done(response)

    def _open(
        self,
        method: str,
        path: str,
        params: Params,
        *,
        body: bytes | None = None,
        content_type: str | None = None,
        read_timeout: float | None = None,
    ) -> Response:
        if self._closed:
            raise ClientClosed(f"{method} {path}: the client is closed")
        timeout = (self._connect_timeout, self._read_timeout if read_timeout is None else read_timeout)
        response = self._transport.request(
            method, path, params, body=body, content_type=content_type, timeout=timeout
        )
        with self._lock:
            closed = self._closed
            if not closed:
                self._open_responses.add(response)
        if closed:
            # close() ran while this request was on its way: it must not outlive the client.
            response.close()
        return response

    def _done(self, response: Response) -> None:
        with self._lock:
            self._open_responses.discard(response)
        response.close()


class WatchStream:
    """An open watch: iterate it for events, or `batches()` for raw lines per chunk received.

    Use it as a context manager (or call `close()`): the connection stays open until then.
    Iterating raises the error of an ERROR event (`Gone` for an expired resourceVersion);
    lines that are not events are logged and skipped.
    """

    def __init__(self, client: KubeClient, response: Response) -> None:
        self._client = client
        self._response = response
        self.resource_version: str | None = None
        """The latest resourceVersion seen while iterating events (bookmarks included)."""

    def batches(self) -> Iterator[list[bytes]]:
        """The undecoded lines, grouped per chunk received (for readers with their own decoder)."""
        return split_lines(self._response.stream())

    def __iter__(self) -> Iterator[WatchEvent]:
        for lines in self.batches():
            for line in lines:
                event = decode_event(line)
                if isinstance(event, str):
                    log.warning("watch: skipped a line (%s): %.200r", event, line)
                    continue
                event_type, obj = event
                if event_type == ERROR:
                    raise error_from_status(obj)
                if not isinstance(obj, dict):
                    log.warning("watch: skipped a %s event whose object is not a JSON object", event_type)
                    continue
                rv = object_resource_version(obj)
                if rv is not None:
                    self.resource_version = rv
                yield WatchEvent(event_type, obj)

    def close(self) -> None:
        self._client._done(self._response)

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _selectors(label_selector: str | None, field_selector: str | None) -> list[tuple[str, str]]:
    params = []
    if label_selector:
        params.append(("labelSelector", label_selector))
    if field_selector:
        params.append(("fieldSelector", field_selector))
    return params


def _dry_run(dry_run: bool) -> Params:
    return (("dryRun", "All"),) if dry_run else ()


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}
