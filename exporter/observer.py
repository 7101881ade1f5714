"""Adapter: the pod status observer (list and watch) and the NVML poller.

Owns the exporter's I/O loop: it lists, then watches, Pods, ResourceClaims,
ResourceSlices (resource.k8s.io/v1) and the kubelet Leases in `kube-node-lease`, and
feeds every event to the `DeviceStateStore` and its directory, in one asyncio task.

Why threads over the official client instead of an asyncio HTTP client: the official
client's configuration already handles every kubeconfig form (client certificates, exec
plugins and token refresh, in-cluster service accounts), and that is where bugs would
hide in a hand-made client. It is synchronous, so each resource's blocking reads run in
a thread of our own; `_preload_content=False` gives us the raw bytes, which the thread
splits into lines and decodes: pod events into `exporter.decode`'s partial Structs,
everything else (and pod events whose types those reject) with orjson; never the
client's models (22x the cost).
Decoded events go to the asyncio loop one chunk at a time, and a single processor task
applies them, so the state and the SQLite directory have exactly one writer. Stopping
shuts the open responses' sockets down, which ends the blocked reads at once.

Watch protocol: resume from the last seen resourceVersion (bookmarks included); on 410
Gone, as an HTTP status or as an ERROR event inside the stream, relist (the state then
replaces what it knew) after a backoff pause that grows only while watches expire without
delivering anything; any other failure backs off with jitter (`Backoff`, the one
throttling helper) and resumes. A normal end of a watch (its timeoutSeconds) resumes at
once.

Self metrics (`gpuhealth_exporter_*`) live in a registry passed in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from kubernetes.client import ApiClient

from exporter import parse
from exporter.decode import DecodeError, Pod, decode_pod_event
from exporter.directory import Directory
from exporter.self_metrics import ExporterMetrics
from exporter.settings import BackoffSettings, ObserverSettings
from exporter.state import CLAIMS, LEASES, NODE_LEASE_NAMESPACE, PODS, SLICES, DeviceStateStore
from gpuhealth.clock import Clock
from gpuhealth.nvml import NvmlSource

log = logging.getLogger(__name__)

# Restart reasons (`gpuhealth_exporter_watch_restarts_total{resource,reason}`).
EXPIRED = "expired"
"""410 Gone: our resourceVersion is too old; a relist follows."""
CLOSED = "closed"
"""The server ended the watch (its timeoutSeconds); resumed at once."""
ERROR = "error"
"""A connection or HTTP failure; resumed after a backoff."""


class HttpError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300].decode(errors='replace')}")
        self.status = status


class Gone(Exception):
    """The resourceVersion we asked for has expired (410)."""


class Response(Protocol):
    def stream(self) -> Iterator[bytes]: ...

    def read(self) -> bytes: ...

    def close(self) -> None:
        """Safe to call from another thread: ends a blocked read."""
        ...


class Transport(Protocol):
    """GET against the API server; raises HttpError on a non-200 status."""

    def get(self, path: str, params: list[tuple[str, str]], *, timeout: tuple[float, float]) -> Response: ...


@dataclass(frozen=True, slots=True)
class Target:
    resource: str
    path: str
    field_selector: str | None = None


def targets(node_name: str | None) -> tuple[Target, ...]:
    """What to watch: everything, or in node mode that node's pods, slices and Lease.

    Claims cannot be filtered by node (they have no node field); they are few next to pods.
    """
    node_field = f"spec.nodeName={node_name}" if node_name else None
    return (
        Target(CLAIMS, "/apis/resource.k8s.io/v1/resourceclaims"),
        Target(SLICES, "/apis/resource.k8s.io/v1/resourceslices", node_field),
        Target(
            LEASES,
            f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases",
            f"metadata.name={node_name}" if node_name else None,
        ),
        Target(PODS, "/api/v1/pods", node_field),
    )


class Backoff:
    """Exponential backoff with jitter: the one throttling helper for retries."""

    def __init__(self, settings: BackoffSettings, rng: random.Random | None = None) -> None:
        self._settings = settings
        self._rng = rng or random.Random()
        self._failures = 0

    def next_delay(self) -> float:
        s = self._settings
        base = min(s.max_seconds, s.initial_seconds * s.factor**self._failures)
        self._failures += 1
        return base * (1.0 - s.jitter * self._rng.random())

    def reset(self) -> None:
        self._failures = 0


def split_lines(chunks: Iterator[bytes]) -> Iterator[list[bytes]]:
    """Complete lines of a byte stream, grouped per chunk received (a watch is one JSON per line)."""
    pending = b""
    for chunk in chunks:
        if not chunk:
            continue
        data = pending + chunk if pending else chunk
        lines = data.split(b"\n")
        pending = lines.pop()
        complete = [line for line in lines if line.strip()]
        if complete:
            yield complete
    if pending.strip():
        yield [pending]


Event = tuple[str, Any]
"""(type, object) of a decoded watch event."""


def decode_event(line: bytes, resource: str = "") -> Event | str:
    """A watch line as (type, object), or the parse error reason when it is not one.

    Pod events (`resource` PODS) decode straight into `exporter.decode`'s Structs (under
    half the cost of a full JSON parse); where their types do not fit, and for ERROR
    events (a Status, not a Pod), the line is parsed again as plain JSON, so malformed
    pieces reach the tolerant dict path and are counted there as before.
    """
    if resource == PODS:
        try:
            fast = decode_pod_event(line)
        except DecodeError:
            pass
        else:
            if fast.type != "ERROR":
                return fast.type, fast.object
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return parse.INVALID_JSON
    if not isinstance(event, dict):
        return parse.MALFORMED_EVENT
    event_type = event.get("type")
    if not isinstance(event_type, str):
        return parse.MALFORMED_EVENT
    return event_type, event.get("object")


def _resource_version(obj: Any) -> str | None:
    if obj.__class__ is Pod:
        smeta = obj.metadata
        return (smeta.resource_version or None) if smeta is not None else None
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and rv else None


def persist(store: DeviceStateStore, directory: Directory, *, force: bool = False) -> int:
    """Write what is due: status changes always, confirmations when the heartbeat period is up."""
    if force or directory.heartbeats_due():
        store.sync_sink()
    return directory.flush(force=force)


class Observer:
    """Lists and watches the API and applies everything to one store, in one task."""

    def __init__(
        self,
        transport: Transport,
        store: DeviceStateStore,
        *,
        clock: Clock,
        settings: ObserverSettings | None = None,
        directory: Directory | None = None,
        metrics: ExporterMetrics | None = None,
        nvml: NvmlSource | None = None,
        nvml_poll_seconds: float = 5.0,
        rng: random.Random | None = None,
    ) -> None:
        self._transport = transport
        self._store = store
        self._clock = clock
        self._settings = settings or ObserverSettings()
        self._directory = directory
        self._metrics = metrics
        self._nvml = nvml
        self._nvml_poll_seconds = nvml_poll_seconds
        self._rng = rng or random.Random()
        self._targets = targets(self._settings.node_name)
        self._listed: set[str] = set()
        self._stop = threading.Event()
        self._responses: set[Response] = set()
        self._responses_lock = threading.Lock()

    def ready(self) -> bool:
        """True once every resource has been listed and applied."""
        return len(self._listed) == len(self._targets)

    async def run(self) -> None:
        """Observe until cancelled; then stop the reader threads and flush the directory."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue()

        def emit(kind: str, resource: str, payload: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, resource, payload))

        workers = len(self._targets) + (1 if self._nvml is not None else 0)
        executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="gpuhealth-watch")
        self._stop.clear()
        futures = [loop.run_in_executor(executor, self._watch_loop, t, emit) for t in self._targets]
        if self._nvml is not None:
            futures.append(loop.run_in_executor(executor, self._nvml_loop, emit))
        try:
            await self._process(queue)
        finally:
            self._stop.set()
            with self._responses_lock:
                for response in list(self._responses):
                    response.close()
            # The threads end within a read; never leave the loop without them.
            await asyncio.gather(*futures, return_exceptions=True)
            executor.shutdown(wait=True)
            if self._directory is not None:
                self._flush(force=True)

    # ----- the single writer --------------------------------------------------------

    async def _process(self, queue: asyncio.Queue[tuple[str, str, Any]]) -> None:
        interval = self._settings.flush_interval_seconds
        while True:
            try:
                # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancellation
                # that races with the get completing, and the exporter would never stop.
                async with asyncio.timeout(interval):
                    item = await queue.get()
            except TimeoutError:
                self._flush()
                continue
            items = [item]
            while not queue.empty():
                items.append(queue.get_nowait())
            counts: dict[tuple[str, str], int] = {}
            for kind, resource, payload in items:
                try:
                    self._apply(kind, resource, payload, counts)
                except Exception:
                    # The parsers count what they know to be malformed; anything else is a
                    # bug that costs this item, never the observer (which would stop serving).
                    log.exception("applying %s of %s failed; skipped", kind, resource)
            if self._metrics is not None and counts:
                for (resource, event_type), n in counts.items():
                    self._metrics.watch_events.labels(resource, event_type).inc(n)
                self._metrics.last_event.set(self._clock.now())
            self._flush()

    def _apply(self, kind: str, resource: str, payload: Any, counts: dict[tuple[str, str], int]) -> None:
        store = self._store
        if kind == "events":
            for event_type, obj in payload:
                store.apply_event(resource, event_type, obj)
                counts[(resource, event_type)] = counts.get((resource, event_type), 0) + 1
        elif kind == "list":
            store.relist(resource, payload)
            self._listed.add(resource)
            log.info("listed %d %s", len(payload), resource)
        elif kind == "restart":
            if self._metrics is not None:
                self._metrics.watch_restarts.labels(resource, payload).inc()
        elif kind == "parse_error":
            store.stats.parse_errors[payload] += 1
        elif kind == "nvml":
            readings, xids = payload
            store.apply_nvml(readings, xids)

    def _flush(self, *, force: bool = False) -> None:
        if self._directory is None:
            return
        try:
            persist(self._store, self._directory, force=force)
        except Exception:
            # Pending changes stay queued in the directory; the next flush retries them.
            log.exception("writing the device directory failed")

    # ----- reader threads ----------------------------------------------------------

    def _watch_loop(self, target: Target, emit: Callable[[str, str, Any], None]) -> None:
        backoff = Backoff(self._settings.backoff, random.Random(self._rng.random()))
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    items, rv = self._list(target)
                    emit("list", target.resource, items)
                rv = self._watch(target, rv, emit, backoff)
                backoff.reset()
            except Gone:
                # Relist after a pause that grows while watches expire without delivering
                # anything (the watch resets the backoff on every delivery): an apiserver
                # whose watch cache lags its lists would otherwise get full lists in a loop.
                rv = None
                emit("restart", target.resource, EXPIRED)
                self._stop.wait(backoff.next_delay())
                continue
            except Exception as exc:
                if self._stop.is_set():
                    return
                delay = backoff.next_delay()
                log.warning("%s: %s; retrying in %.1f s", target.resource, exc, delay)
                emit("restart", target.resource, ERROR)
                self._stop.wait(delay)
                continue
            if self._stop.is_set():
                return
            emit("restart", target.resource, CLOSED)

    def _params(self, target: Target) -> list[tuple[str, str]]:
        return [("fieldSelector", target.field_selector)] if target.field_selector else []

    def _open(self, target: Target, params: list[tuple[str, str]], read_timeout: float) -> Response:
        try:
            response = self._transport.get(
                target.path, params, timeout=(self._settings.connect_timeout_seconds, read_timeout)
            )
        except HttpError as exc:
            if exc.status == 410:
                raise Gone() from exc
            raise
        with self._responses_lock:
            self._responses.add(response)
        if self._stop.is_set():
            response.close()
        return response

    def _done(self, response: Response) -> None:
        with self._responses_lock:
            self._responses.discard(response)
        response.close()

    def _list(self, target: Target) -> tuple[list[Any], str]:
        items: list[Any] = []
        token = ""
        while True:
            params = [*self._params(target), ("limit", str(self._settings.list_page_size))]
            if token:
                params.append(("continue", token))
            response = self._open(target, params, self._settings.read_slack_seconds)
            try:
                body = orjson.loads(response.read())
            finally:
                self._done(response)
            if not isinstance(body, dict):
                raise ValueError(f"list of {target.resource}: not a JSON object")
            page = body.get("items") or []
            meta = body.get("metadata") or {}
            if not isinstance(page, list) or not isinstance(meta, dict):
                raise ValueError(f"list of {target.resource}: malformed body")
            items.extend(page)
            token = meta.get("continue") or ""
            if not token:
                rv = meta.get("resourceVersion")
                if not isinstance(rv, str) or not rv:
                    raise ValueError(f"list of {target.resource}: no resourceVersion")
                return items, rv

    def _watch(self, target: Target, rv: str, emit: Callable[[str, str, Any], None], backoff: Backoff) -> str:
        """Stream one watch; the resourceVersion to resume from when it ends normally."""
        timeout = self._settings.watch_timeout_seconds
        # Jitter the server-side timeout so a fleet of exporters does not reconnect in step.
        timeout = int(timeout * (0.9 + 0.2 * self._rng.random())) or 1
        params = [
            *self._params(target),
            ("watch", "true"),
            ("resourceVersion", rv),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout)),
        ]
        response = self._open(target, params, timeout + self._settings.read_slack_seconds)
        try:
            for lines in split_lines(response.stream()):
                batch: list[Event] = []
                for line in lines:
                    event = decode_event(line, target.resource)
                    if isinstance(event, str):
                        emit("parse_error", target.resource, event)
                        continue
                    event_type, obj = event
                    if event_type == "ERROR":
                        code = obj.get("code") if isinstance(obj, dict) else None
                        if code == 410:
                            raise Gone()
                        raise HttpError(int(code) if isinstance(code, int) else 500, orjson.dumps(obj))
                    new_rv = _resource_version(obj)
                    if new_rv is not None:
                        rv = new_rv
                    if event_type != "BOOKMARK":
                        batch.append(event)
                if batch:
                    emit("events", target.resource, batch)
                backoff.reset()
        finally:
            self._done(response)
        return rv

    def _nvml_loop(self, emit: Callable[[str, str, Any], None]) -> None:
        source = self._nvml
        assert source is not None
        interval = self._nvml_poll_seconds
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                emit("nvml", "", (source.read(), source.drain_xid_events()))
            except Exception:
                # The source promises not to raise; if it does, skip this poll, keep the last view.
                log.exception("NVML poll failed")
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))


class _UrllibResponse:
    """A non-preloaded urllib3 response of the official client."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def stream(self) -> Iterator[bytes]:
        # amt=None: with chunked transfer (every watch) each chunk is yielded as it arrives.
        return self._raw.stream(amt=None, decode_content=True)

    def read(self) -> bytes:
        return self._raw.read(decode_content=True)

    def close(self) -> None:
        try:
            # shutdown() (urllib3 >= 2.3) unblocks a read in progress in another thread.
            shutdown = getattr(self._raw, "shutdown", None)
            if shutdown is not None:
                shutdown()
            self._raw.close()
        except Exception:  # closing twice or a dead socket: nothing left to release
            log.debug("closing a response failed", exc_info=True)


class KubeTransport:
    """`Transport` over the official client's ApiClient (its auth, TLS and proxies)."""

    def __init__(self, api_client: ApiClient) -> None:
        self._api = api_client
        # One throttling helper: our Backoff. urllib3 would otherwise retry each request
        # three times at once (and log each), hiding the outage from the backoff.
        pool_manager = getattr(api_client.rest_client, "pool_manager", None)
        if pool_manager is not None:
            pool_manager.connection_pool_kw["retries"] = False

    def get(self, path: str, params: list[tuple[str, str]], *, timeout: tuple[float, float]) -> Response:
        method, url, headers, _, _ = self._api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=params,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        raw = self._api.call_api(method, url, header_params=headers, _request_timeout=timeout).response
        if raw.status != 200:
            body = raw.read()
            raw.release_conn()
            raise HttpError(raw.status, body)
        return _UrllibResponse(raw)
