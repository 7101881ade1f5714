"""The exporter's observer: what it watches, the single writer that applies it, the NVML poller.

It lists, then watches, Pods, ResourceClaims, ResourceSlices (resource.k8s.io/v1), the kubelet
Leases in `kube-node-lease`, the Nodes (their device-plugin GPU counts) and each DRA driver's
health producer pods (`targets()`), each
through a `gpuhealth.kube.reflector` in a thread of its own, and feeds every event to the
`DeviceStateStore` and its directory in one asyncio task, so the state and the SQLite directory
have exactly one writer. The watch protocol (resume, bookmarks, relist on 410, backoff) is the
reflector's; what is exporter's is the decoding: pod events and list pages go straight into
`exporter.decode`'s partial Structs, everything else (and pods whose types those reject) into
plain dicts with orjson; never the client's models (22x the cost). Readers hand over one
message per chunk read, not per event, and lists page by page (`paged`): each page is folded
into the state as it comes, so the initial lists of a large fleet are never held whole (see
`gpuhealth.kube.reflector`). Stopping closes the client, which shuts the open responses'
sockets down and ends the blocked reads at once.

Self metrics (`gpuhealth_exporter_*`) live in a registry passed in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.decode import DecodeError, Pod, decode_pod_event, decode_pod_page
from exporter.directory import Directory
from exporter.podresources import Allocatable, Assignments, PodResourcesSource
from exporter.self_metrics import ExporterMetrics
from exporter.settings import HealthProducer, ObserverSettings
from exporter.state import CLAIMS, LEASES, NODES, PODS, SLICES, DeviceStateStore, producer_resource
from gpuhealth.clock import Clock
from gpuhealth.kube import meta, resources, watch
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.pages import decode_page
from gpuhealth.kube.reflector import (
    Events,
    ListEnded,
    ListPage,
    Message,
    ParseFailed,
    Reflector,
    WatchRestarted,
)
from gpuhealth.kube.resources import Resource
from gpuhealth.kube.transport import Transport
from gpuhealth.nvml import DeviceReading, NvmlSource, XidEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Target:
    """One collection to watch, and the state's name for its resource."""

    resource: str
    api: Resource
    namespace: str | None = None
    field_selector: str | None = None
    label_selector: str | None = None

    @property
    def path(self) -> str:
        return self.api.path(self.namespace)


def targets(node_name: str | None, producers: tuple[HealthProducer, ...] = ()) -> tuple[Target, ...]:
    """What to watch: everything, or in node mode that node's pods, slices, Lease and Node.

    Claims cannot be filtered by node (they have no node field); they are few next to pods.
    Each DRA health producer's pods are a watch of their own (namespace and label selector),
    so the pod hot path decodes no labels or conditions for them.
    """
    node_field = f"spec.nodeName={node_name}" if node_name else None
    return (
        *(
            Target(
                producer_resource(p.driver),
                resources.POD,
                namespace=p.namespace,
                field_selector=node_field,
                label_selector=p.selector,
            )
            for p in producers
        ),
        Target(CLAIMS, resources.RESOURCE_CLAIM),
        Target(SLICES, resources.RESOURCE_SLICE, field_selector=node_field),
        Target(
            LEASES,
            resources.LEASE,
            namespace=meta.NODE_LEASE_NAMESPACE,
            field_selector=f"metadata.name={node_name}" if node_name else None,
        ),
        # Whole Node objects (the API serves no projection of a field); the store looks further
        # only at updates that change a GPU resource's capacity or allocatable.
        Target(NODES, resources.NODE, field_selector=f"metadata.name={node_name}" if node_name else None),
        Target(PODS, resources.POD, field_selector=node_field),
    )


@dataclass(frozen=True, slots=True)
class NvmlRead:
    """One NVML poll: the readings and the XID events drained since the last one."""

    readings: list[DeviceReading]
    xids: list[XidEvent]


@dataclass(frozen=True, slots=True)
class PodResourcesRead:
    """One read of the kubelet's allocatable devices and its pods' devices (None: no answer)."""

    allocatable: Allocatable | None
    assignments: Assignments | None


def decode_pod_line(line: bytes) -> watch.Event | str:
    """A pod watch line as (type, object), or the parse error reason when it is not one.

    Straight into `exporter.decode`'s Structs (under half the cost of a full JSON parse);
    where their types do not fit, and for ERROR events (a Status, not a Pod), the line is
    parsed again as plain JSON, so malformed pieces reach the tolerant dict path and are
    counted there as before.
    """
    try:
        fast = decode_pod_event(line)
    except DecodeError:
        pass
    else:
        if fast.type != "ERROR":
            return fast.type, fast.object
    return watch.decode_event(line)


def decode_event(line: bytes, resource: str = "") -> watch.Event | str:
    """A watch line of `resource` as the state takes it (pods as Structs, the rest as dicts)."""
    return decode_pod_line(line) if resource == PODS else watch.decode_event(line)


def _resource_version(obj: Any) -> str | None:
    if obj.__class__ is Pod:
        smeta = obj.metadata
        return (smeta.resource_version or None) if smeta is not None else None
    return meta.resource_version(obj)


def persist(store: DeviceStateStore, directory: Directory, *, force: bool = False) -> int:
    """Write what is due: status changes always, confirmations when the heartbeat period is up."""
    if force or directory.heartbeats_due():
        store.sync_sink()
    return directory.flush(force=force)


ObserverMessage = Message | NvmlRead | PodResourcesRead
"""What the reader threads hand the processor (the reflectors' messages, NVML polls and the
kubelet's allocatable devices, read with them)."""


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
        pod_resources: PodResourcesSource | None = None,
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
        self._pod_resources = pod_resources
        self._rng = rng or random.Random()
        self._targets = targets(self._settings.node_name, self._settings.health_producers)
        self._listed: set[str] = set()
        self._seen: dict[str, set[Any]] = {}
        """Per resource, the keys the pages of its list in progress named so far."""
        self._stop = threading.Event()

    def ready(self) -> bool:
        """True once every resource has been listed and applied."""
        return len(self._listed) == len(self._targets)

    async def run(self) -> None:
        """Observe until cancelled; then stop the reader threads and flush the directory."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[ObserverMessage] = asyncio.Queue()

        def emit(message: ObserverMessage) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, message)

        settings = self._settings
        client = KubeClient(
            self._transport,
            connect_timeout_seconds=settings.connect_timeout_seconds,
            read_timeout_seconds=settings.read_slack_seconds,
        )
        readers: list[Callable[[], None]] = [self._reflector(client, t, emit).run for t in self._targets]
        if self._nvml is not None:
            nvml = self._nvml
            readers.append(lambda: self._nvml_loop(nvml, emit))
        executor = concurrent.futures.ThreadPoolExecutor(len(readers), thread_name_prefix="gpuhealth-watch")
        self._stop.clear()
        futures = [loop.run_in_executor(executor, reader) for reader in readers]
        try:
            await self._process(queue)
        finally:
            self._stop.set()
            client.close()
            # The threads end within a read; never leave the loop without them.
            await asyncio.gather(*futures, return_exceptions=True)
            executor.shutdown(wait=True)
            if self._directory is not None:
                self._flush(force=True)

    def _reflector(self, client: KubeClient, target: Target, emit: Callable[[Message], None]) -> Reflector:
        settings = self._settings
        pods = target.resource == PODS
        return Reflector(
            client,
            target.resource,
            target.api,
            namespace=target.namespace,
            field_selector=target.field_selector,
            label_selector=target.label_selector,
            emit=emit,
            stop=self._stop,
            page_size=settings.list_page_size,
            watch_timeout_seconds=settings.watch_timeout_seconds,
            backoff=settings.backoff,
            decode=decode_pod_line if pods else watch.decode_event,
            decode_page=decode_pod_page if pods else decode_page,
            resource_version=_resource_version if pods else meta.resource_version,
            paged=True,
            rng=random.Random(self._rng.random()),
        )

    # ----- the single writer --------------------------------------------------------

    async def _process(self, queue: asyncio.Queue[ObserverMessage]) -> None:
        interval = self._settings.flush_interval_seconds
        while True:
            try:
                # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancellation
                # that races with the get completing, and the exporter would never stop.
                async with asyncio.timeout(interval):
                    message = await queue.get()
            except TimeoutError:
                self._flush()
                continue
            messages = [message]
            while not queue.empty():
                messages.append(queue.get_nowait())
            counts: dict[tuple[str, str], int] = {}
            for message in messages:
                try:
                    self._apply(message, counts)
                except Exception:
                    # The parsers count what they know to be malformed; anything else is a
                    # bug that costs this message, never the observer (which would stop serving).
                    log.exception("applying %s failed; skipped", _describe(message))
            if self._metrics is not None and counts:
                for (resource, event_type), n in counts.items():
                    self._metrics.watch_events.labels(resource, event_type).inc(n)
                self._metrics.last_event.set(self._clock.now())
            self._flush()

    def _apply(self, message: ObserverMessage, counts: dict[tuple[str, str], int]) -> None:
        store = self._store
        match message:
            case Events(resource, events):
                for event_type, obj in events:
                    store.apply_event(resource, event_type, obj)
                    counts[(resource, event_type)] = counts.get((resource, event_type), 0) + 1
            case ListPage(resource, items, first):
                seen = self._seen.setdefault(resource, set())
                if first:
                    seen.clear()
                store.relist_page(resource, items, seen)
            case ListEnded(resource):
                seen = self._seen.pop(resource, set())
                store.relist_end(resource, seen)
                self._listed.add(resource)
                log.info("listed %d %s", len(seen), resource)
            case WatchRestarted(resource, reason):
                if self._metrics is not None:
                    self._metrics.watch_restarts.labels(resource, reason).inc()
            case ParseFailed(_, reason):
                store.stats.parse_errors[reason] += 1
            case PodResourcesRead(allocatable, assignments):
                store.apply_pod_resources(allocatable)
                store.apply_assignments(assignments)
            case NvmlRead(readings, xids):
                store.apply_nvml(readings, xids)

    def _flush(self, *, force: bool = False) -> None:
        if self._directory is None:
            return
        try:
            persist(self._store, self._directory, force=force)
        except Exception:
            # Pending changes stay queued in the directory; the next flush retries them.
            log.exception("writing the device directory failed")

    # ----- the NVML reader thread -----------------------------------------------------

    def _nvml_loop(self, source: NvmlSource, emit: Callable[[ObserverMessage], None]) -> None:
        interval = self._nvml_poll_seconds
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if self._pod_resources is not None:
                    # Read with NVML, before it: the poll's readings are judged with the answer.
                    # `List` at the same cadence: one small answer per poll (a node's pods), and
                    # the state does nothing with one equal to the last.
                    kubelet = self._pod_resources
                    emit(PodResourcesRead(kubelet.allocatable(), kubelet.assignments()))
                emit(NvmlRead(source.read(), source.drain_xid_events()))
            except Exception:
                # The source promises not to raise; if it does, skip this poll, keep the last view.
                log.exception("NVML poll failed")
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))


def _describe(message: ObserverMessage) -> str:
    resource = getattr(message, "resource", None)
    return f"{type(message).__name__} of {resource}" if resource else type(message).__name__
