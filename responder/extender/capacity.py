"""The scheduler extender's view of GPU capacity: Nodes and Pods kept by list+watch.

`CapacityCache` folds the messages of two `gpuhealth.kube.reflector`s (Nodes, Pods) into a
small per-node summary, so a filter request never calls the API: kube-scheduler waits on the
answer for every GPU pod, and an API round trip per request would put the apiserver's latency
(and load) on every scheduling cycle. `capacity(name)` answers a `NodeCapacity`; a node the
cache has not seen answers None (the filter passes it). Thread-safe: the reader threads apply,
the HTTP handler reads, under one lock; everything kept is a few integers per node, and per
bound GPU pod its node and count.

Quarantined devices "the kubelet still counts allocatable" are approximated from the node
alone: the kubelet keeps every registered device in `status.capacity[nvidia.com/gpu]` and
leaves the ones its plugin reports Unhealthy out of `status.allocatable`, but publishes no
list of which. So the devices the node annotation `gpuhealth.io/quarantined-devices` lists
are counted out, less as many as allocatable already dropped below capacity:

    quarantined_allocatable = max(0, listed - (capacity - allocatable))

That assumes the devices the kubelet excluded are quarantined ones. When an unrelated device
is Unhealthy at the same time as a quarantined one reports Healthy, the count is one short and
the filter may pass a node where the pod fits only with the quarantined device: the cost of
the simplification, bounded by the node's Unhealthy devices that are not quarantined. It
never counts out more than the annotation lists.

Devices on the ramp (the second annotation, `gpuhealth.io/ramping-devices`, with the bound of
opted-in pods for each) count among those excluded, and of the excluded devices the kubelet
still counts allocatable they are the last assumed dropped (they passed their checks):
`ramping_allocatable = min(ramping, quarantined_allocatable)`. The cache counts per node the
bound, unfinished GPU pods labelled `gpuhealth.io/canary-ok: "true"`, wherever on the node their
devices are (the kubelet does not say which device a pod got until it runs): the slots left
for opted-in pods are the bound less those, so the count errs on the side of less load.

`run_cache` runs the reflectors in threads for as long as the task runs (the exporter's
observer does the same).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpuhealth import fields
from gpuhealth.kube.backoff import WatchBackoff
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.reflector import Events, Listed, Message, Reflector
from gpuhealth.kube.resources import NODE, POD
from responder.enforce.hold import ASIDE_MARK, excluded_at, holds
from responder.enforce.hold_plan import HOLDER_LABEL
from responder.enforce.node_annotation import NODE_ANNOTATION, ramping
from responder.extender.filter import ArgsError, NodeCapacity, gpu_units, gpus_requested, opted_in

log = logging.getLogger(__name__)

NODES = "nodes"
PODS = "pods"
FINISHED_PHASES = ("Succeeded", "Failed")
"""A pod in these phases holds no device any more (the scheduler's own accounting agrees)."""


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """What the cache keeps of a Node."""

    capacity: int
    allocatable: int
    quarantined: int
    """Devices the node annotations list (quarantined, or on the ramp)."""
    ramping: int = 0
    """Of those, the devices on the ramp."""
    ramp_pods: int = 0
    """Opted-in pods the node may run while its devices ramp (the ramp annotation's bounds, summed)."""
    holding: int = 0
    """Listed devices whose hold is being made (`gpuhealth.io/device-holds` says `pending`): while
    any is, the node takes no new GPU pod, since the kubelet could hand it the card."""
    held: int = 0
    """Listed devices the annotation says a holder pod holds: the cache checks that the node has
    as many holder pods, since a holder deleted by hand leaves the annotation saying `held` until
    the responder's next pass."""

    @property
    def quarantined_allocatable(self) -> int:
        return max(0, self.quarantined - max(0, self.capacity - self.allocatable))

    @property
    def ramping_allocatable(self) -> int:
        return min(self.ramping, self.quarantined_allocatable)


def node_gpus(node: Mapping[str, Any]) -> NodeGpus:
    """A Node's GPU accounting (pure); unreadable quantities count as 0."""
    status = node.get("status")
    status = status if isinstance(status, dict) else {}
    capacity = gpu_units(status.get("capacity"))
    ramp = ramping(node)
    held = holds(node)
    listed = listed_devices(node)
    # A card a holder pod holds is counted by that pod's request: not counted out a second time.
    excluded = {d for d in listed if held.get(d) != "held"} | ramp.keys()
    allocatable = gpu_units(status.get("allocatable"))
    # A card no fill could get (its plugin excluded it) while the node had N allocatable GPUs:
    # once it has more, the plugin let a device back, perhaps the card (any new pod could be
    # handed it): as pending until the responder's next pass fills again.
    readmitted = {d for d in listed if (n := excluded_at(held.get(d))) is not None and allocatable > n}
    pending = sum(1 for d in listed if held.get(d) in ("pending", ASIDE_MARK) or d in readmitted)
    standing = sum(1 for d in listed if held.get(d) == "held")
    # A node that reports allocatable but no capacity (a hand-written object) drops nothing.
    return NodeGpus(
        max(capacity, allocatable),
        allocatable,
        len(excluded),
        len(ramp),
        sum(ramp.values()),
        pending,
        standing,
    )


def listed_devices(node: Mapping[str, Any]) -> frozenset[str]:
    """The devices the node annotation lists; an unreadable value lists none."""
    meta = node.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    raw = annotations.get(NODE_ANNOTATION) if isinstance(annotations, dict) else None
    if not raw or not isinstance(raw, str):
        return frozenset()
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return frozenset()
    return frozenset(v for v in value if isinstance(v, str)) if isinstance(value, list) else frozenset()


def pod_gpus(pod: Mapping[str, Any]) -> tuple[str, int] | None:
    """(node, GPUs) of a pod that holds GPUs on a node; None for one that holds none (opted in to
    ramping devices or not: `filter.opted_in`)."""
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, dict) else None
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    if not node or not isinstance(node, str) or phase in FINISHED_PHASES:
        return None
    try:
        gpus = gpus_requested(pod)
    except ArgsError:
        return None
    return (node, gpus) if gpus > 0 else None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return ""
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


@dataclass
class CapacityCache:
    """Nodes' GPU accounting and the GPUs bound pods hold, fed by reflector messages."""

    _nodes: dict[str, NodeGpus] = field(default_factory=dict)
    _pods: dict[str, tuple[str, int, bool]] = field(default_factory=dict)
    _requested: dict[str, int] = field(default_factory=dict)
    _opted_in: dict[str, int] = field(default_factory=dict)
    """Per node: bound, unfinished GPU pods that opt in to ramping devices."""
    _listed: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _holders: dict[str, str] = field(default_factory=dict)
    """gpuhealth's holder pods bound and running: pod key -> node."""
    _unbound: set[str] = field(default_factory=set)
    """Pods seen without a node that kube-scheduler is to place (their keys)."""
    on_scheduled: Callable[[], None] | None = None
    """Called for every GPU pod kube-scheduler binds that this cache saw unbound first
    (`gpuhealth_extender_scheduled_gpu_pods_total`): what the extender should have been asked about."""

    def ready(self) -> bool:
        """Both collections have been listed once."""
        with self._lock:
            return self._listed >= {NODES, PODS}

    def capacity(self, name: str, node: Mapping[str, Any] | None = None) -> NodeCapacity | None:
        """The node's view; `node` (the object the scheduler sent) overrides the cached Node."""
        with self._lock:
            gpus = node_gpus(node) if node is not None else self._nodes.get(name)
            if gpus is None or (gpus.capacity == 0 and gpus.allocatable == 0):
                # No device plugin serves nvidia.com/gpu there: nothing for the extender to count.
                # A DRA node whose DeviceClass maps the resource (KEP-5004) gives such pods DRA
                # devices, kept off a quarantined one by its DeviceTaintRule; any other such node
                # fails the scheduler's own resource fit.
                return None
            requested = self._requested.get(name, 0)
            opted = self._opted_in.get(name, 0)
            holders = sum(1 for node_of in self._holders.values() if node_of == name)
        # A card said held with no holder pod on the node (deleted by hand, evicted): being held again.
        unheld = max(0, gpus.held - holders)
        return NodeCapacity(
            gpus.allocatable,
            requested,
            gpus.quarantined_allocatable + unheld,
            gpus.ramping_allocatable,
            max(0, gpus.ramp_pods - opted),
            gpus.holding + unheld,
        )

    def apply(self, message: Message) -> None:
        match message:
            case Listed(resource, items):
                with self._lock:
                    if resource == NODES:
                        self._nodes = {}
                        for obj in items:
                            self._apply_node("ADDED", obj)
                    else:
                        self._pods, self._requested, self._opted_in, self._holders = {}, {}, {}, {}
                        for obj in items:
                            self._apply_pod("ADDED", obj)
                    self._listed.add(resource)
            case Events(resource, events):
                with self._lock:
                    for event_type, obj in events:
                        if not isinstance(obj, dict):
                            continue
                        if resource == NODES:
                            self._apply_node(event_type, obj)
                        else:
                            self._apply_pod(event_type, obj)
            case _:
                pass

    def _apply_node(self, event_type: str, obj: Mapping[str, Any]) -> None:
        name = _key(obj).lstrip("/")
        if not name:
            return
        if event_type == "DELETED":
            self._nodes.pop(name, None)
        else:
            self._nodes[name] = node_gpus(obj)

    def _apply_pod(self, event_type: str, obj: Mapping[str, Any]) -> None:
        key = _key(obj)
        held = None if event_type == "DELETED" else pod_gpus(obj)
        self._scheduled(event_type, key, obj, held)
        before = self._pods.pop(key, None)
        if before is not None:
            node, gpus, opted = before
            _add(self._requested, node, -gpus)
            if opted:
                _add(self._opted_in, node, -1)
        self._holders.pop(key, None)
        status = obj.get("status")
        running = isinstance(status, dict) and status.get("phase") == "Running"
        if held is not None and running and HOLDER_LABEL in (_meta(obj).get("labels") or {}):
            # Only a running holder holds a card: one just made (a fill's) holds nothing yet, and
            # its ADDED event may come before the node's annotation says the hold is being made.
            self._holders[key] = held[0]
        if held is not None:
            node, gpus = held
            opted = opted_in(obj)
            self._pods[key] = (node, gpus, opted)
            _add(self._requested, node, gpus)
            if opted:
                _add(self._opted_in, node, 1)

    def _scheduled(
        self, event_type: str, key: str, obj: Mapping[str, Any], held: tuple[str, int] | None
    ) -> None:
        """Note a GPU pod kube-scheduler is to place, and count it once it is bound. A pod made
        with its node already set (a DaemonSet's, gpuhealth's holders and checks) or handed to
        another scheduler never passes the extender, and is not counted."""
        spec = obj.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        if event_type == "DELETED":
            self._unbound.discard(key)
            return
        if spec.get("schedulerName", DEFAULT_SCHEDULER) != DEFAULT_SCHEDULER:
            return
        if not spec.get("nodeName"):
            try:
                wants = gpus_requested(obj) > 0
            except ArgsError:
                wants = False
            if wants:
                self._unbound.add(key)
            return
        if key in self._unbound:
            self._unbound.discard(key)
            if held is not None and self.on_scheduled is not None:
                self.on_scheduled()


DEFAULT_SCHEDULER = "default-scheduler"
"""The scheduler whose extenders the shipped configuration wires (`deploy/scheduler/`)."""


def _add(counts: dict[str, int], node: str, delta: int) -> None:
    """`counts[node] += delta`, dropping the node at zero (the maps stay as small as the load)."""
    left = counts.get(node, 0) + delta
    if left > 0:
        counts[node] = left
    else:
        counts.pop(node, None)


@dataclass(frozen=True, slots=True)
class CacheSettings:
    page_size: int = 500
    """Objects per list page (a 10,000-node fleet's pods list in a few hundred pages)."""
    watch_timeout_seconds: int = 300
    """Server-side length of one watch; the reflector resumes at once from where it was, so
    this only bounds how long a silently dead connection goes unnoticed."""
    backoff: WatchBackoff = field(default_factory=WatchBackoff)
    """Pauses after a failed list or watch: meanwhile the filter answers from the last view."""

    def __post_init__(self) -> None:
        fields.within(self, "page_size", "objects", 1, 10_000, whole=True)
        fields.within(self, "watch_timeout_seconds", "seconds", 1, 3600, whole=True)


async def run_cache(cache: CapacityCache, client: KubeClient, settings: CacheSettings) -> None:
    """List and watch Nodes and Pods into `cache` until cancelled; then stop the threads.

    The caller owns `client` only until this starts: it is closed here on the way out, which
    ends the readers' blocked watches at once.
    """
    loop = asyncio.get_running_loop()
    stop = threading.Event()

    def emit(message: Message) -> None:
        try:
            cache.apply(message)
        except Exception:
            # A malformed object costs its message, never the cache's thread.
            log.exception("applying a %s message failed; skipped", type(message).__name__)

    readers = [
        Reflector(
            client,
            name,
            resource,
            emit=emit,
            stop=stop,
            page_size=settings.page_size,
            watch_timeout_seconds=settings.watch_timeout_seconds,
            backoff=settings.backoff,
            rng=random.Random(),
        )
        for name, resource in ((NODES, NODE), (PODS, POD))
    ]
    executor = concurrent.futures.ThreadPoolExecutor(len(readers), thread_name_prefix="gpuhealth-capacity")
    futures = [loop.run_in_executor(executor, reader.run) for reader in readers]
    try:
        await asyncio.gather(*futures)
        # The readers return only once stopped or closed: running on without them would serve
        # a view that no longer changes.
        raise RuntimeError("the capacity cache's watches ended")
    finally:
        stop.set()
        client.close()
        with contextlib.suppress(Exception):
            await asyncio.gather(*futures, return_exceptions=True)
        executor.shutdown(wait=True)
