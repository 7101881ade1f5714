"""The scheduler: binds pods to nodes and devices, and writes what binding creates.

Two kinds of pods reach it:

- the scenario's own workloads. Initial pods go where the scenario's first-fit layout puts
  them (`simulator.model`); a replacement pod waits Pending until a node passes the filters
  (Ready, kubelet writing, schedulable, enough usable free slots: `placement.blocked_devices`,
  and room left by the pods clients bound there) and is retried every status sync interval.
  Binding writes the pod with its node, on DRA the ResourceClaim and its allocation, then the
  kubelet's first status with the devices its device manager chose on a device-plugin node
  (`device_manager`): one step, as a real cluster reaches it within a second. With
  extenders configured, a replacement that would land on a device-plugin node is first put to
  them (`extender_client.extend`, the pod object as stored, the candidate nodes in order), as
  kube-scheduler puts every pod that requests a managed resource: the first candidate they pass
  is taken, and none passing leaves the pod Pending for the next try. DRA devices are chosen
  as kube-scheduler's DynamicResources would: a device whose taint the workload's claim
  request tolerates (`objects.claim_tolerations`) is usable.
- every other pending pod whose `spec.schedulerName` is ours (`default-scheduler` or empty) and
  that has no node: `follow()` watches the store in-process and runs kube-scheduler's cycle on
  each (`scheduler_filters`: NodeUnschedulable, TaintToleration, NodeAffinity,
  NodeResourcesFit; `dra_allocator`: DynamicResources; then the configured extenders,
  `extender_client`), scores the feasible nodes (least allocated, plus extender priorities;
  ties broken by the fleet's seeded rng; the node search and pick: `scheduler_nodes`) and binds
  through the pods/binding semantics (`simulator.apiserver.binding`). It writes `Scheduled` and
  `FailedScheduling` Events, the pod's PodScheduled condition, the claims the resource claim
  controller generates from templates and their allocation. Unschedulable pods are retried when
  a node, pod, slice, claim, DeviceClass or DeviceTaintRule changes in a way that could help,
  and after a backoff (1 s doubling to 10 s, simulated time). Running those pods is the kubelet's part.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp

from simulator.apiserver.binding import bind
from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet import mig, objects
from simulator.fleet.cel import CelUnsupported
from simulator.fleet.device_manager import allocate
from simulator.fleet.dra_allocator import (
    Unfit,
    plan,
    pod_claims,
)
from simulator.fleet.events import Emit, NodeChanged
from simulator.fleet.events_recorder import NORMAL, WARNING, EventRecorder
from simulator.fleet.extender_client import Extender, ExtenderConfig, ExtenderError, extend
from simulator.fleet.node_api import StoreNodeApi
from simulator.fleet.placement import blocked_devices
from simulator.fleet.scheduler_cache import SchedulerCache
from simulator.fleet.scheduler_filters import (
    OUR_SCHEDULERS,
    PodInfo,
    QuantityError,
    failed_scheduling_message,
    mark_unschedulable,
    pod_info,
)
from simulator.fleet.scheduler_nodes import DraCycle, explain, find_nodes, pick
from simulator.fleet.state import PendingPod, SimNode, SimPod
from simulator.fleet.timers import Timers
from simulator.fleet.writes import write_status
from simulator.model import DRA_DRIVER, PodPlacement, Settings, Slot, Workload, eligible

if TYPE_CHECKING:
    from simulator.apiserver.store import Entry, Store, Watch

log = logging.getLogger(__name__)

_CLAIMS = "resourceclaims.resource.k8s.io"
_SLICES = "resourceslices.resource.k8s.io"
_CLASSES = "deviceclasses.resource.k8s.io"
_RULES = "devicetaintrules.resource.k8s.io"
SCHEDULER_NAME = "default-scheduler"
_BATCH = 20  # pods scheduled between yields to the event loop

ClaimFor = Callable[[dict[str, Any], str, str], dict[str, Any]]
"""The resource claim controller makes a pod's claim from a template (`ResourceClaimController.claim_for`);
LookupError when the template is missing."""
PodGone = Callable[[dict[str, Any], Callable[[str, str], dict[str, Any] | None]], None]
"""A client's pod was deleted: the resource claim controller lets go of its claims (`pod_gone`)."""

Admit = Callable[[SimPod, SimNode, dict[str, Any], list[dict[str, Any]] | None, float], dict[str, Any]]
"""The kubelet's first status of a pod bound to a node (`Kubelet.admit`)."""


class Scheduler:
    """kube-scheduler with the resource claim controller's part in binding.

    Owns `SimNode.free` (through `reserve`), `pending` (replacement pods not yet bound) and
    adds bound pods to `pods` and their node.
    """

    def __init__(
        self,
        store: Store,
        settings: Settings,
        timers: Timers,
        nodes: Mapping[str, SimNode],
        pods: dict[str, SimPod],
        pending: dict[str, PendingPod],
        job_uids: Mapping[tuple[str, str], str],
        rng: random.Random,
        admit: Admit,
        bound: Callable[[SimPod], None],
        emit: Emit,
        claim_for: ClaimFor,
        pod_gone: PodGone,
        extenders: Sequence[ExtenderConfig] = (),
    ) -> None:
        self._store = store
        self._api = StoreNodeApi(store)
        self._settings = settings
        self._timers = timers
        self._nodes = nodes
        self._pods = pods
        self._pending = pending
        self._job_uids = job_uids
        self._rng = rng
        self._admit = admit
        self._bound = bound
        self._emit = emit
        self._pod_counter = itertools.count()
        self._claim_for = claim_for
        self._pod_gone = pod_gone
        self.cache = SchedulerCache()
        self._extenders = [Extender(c) for c in extenders]
        self._queue: dict[str, None] = {}
        """Pods (namespace/name) to schedule, in arrival order."""
        self._unschedulable: dict[str, int] = {}
        """Pods that failed, with their attempts so far (their backoff)."""
        self._events = EventRecorder(store, SCHEDULER_NAME, timers.wall, f"{SCHEDULER_NAME}-gpuhealth-sim")
        """Scheduled and FailedScheduling Events; a repeat of the same message counts up."""
        self._wake = asyncio.Event()
        self._watches: list[Watch] = []
        self._stopped = False
        # The replacement path's extender calls: `follow()`'s session, the pods judged, their tasks.
        self._session: aiohttp.ClientSession | None = None
        self._asking: set[str] = set()
        self._asks: set[asyncio.Task[None]] = set()

    def start_pod(self, workload: Workload, placement: PodPlacement, wall: float) -> SimPod:
        """Create an initial pod where the scenario's layout puts it, devices too (`device_manager`)."""
        node = self._nodes[placement.node]
        name = objects.pod_name(workload, placement.ordinal, self._rng)
        while f"{workload.namespace}/{name}" in self._pods:  # generated suffixes can collide
            name = objects.pod_name(workload, placement.ordinal, self._rng)
        pod = SimPod(name, workload.namespace, node.name, workload, placement.slots)
        pod.started = wall
        pod.index = next(self._pod_counter)
        node.reserve(placement.slots)
        self._write_bound(pod, node, wall)
        node.pods.append(pod)
        self._pods[pod.key] = pod
        return pod

    def try_bind(self, pending: PendingPod) -> None:
        """Bind a Pending pod to usable devices, or try again after a status sync interval."""
        if self._pending.get(pending.key) is not pending:
            return  # deleted meanwhile
        candidates = self._candidates(pending.workload, first=not self._extenders)
        if candidates and self._extenders and not candidates[0][0].is_dra:
            if pending.key not in self._asking:
                self._asking.add(pending.key)
                names = [n.name for n, _ in candidates]
                task = asyncio.get_running_loop().create_task(self._ask_extenders(pending, names))
                self._asks.add(task)
                task.add_done_callback(self._asks.discard)
            return
        self._bind_first(pending, candidates)

    def _bind_first(self, pending: PendingPod, candidates: list[tuple[SimNode, tuple[Slot, ...]]]) -> None:
        if not candidates:
            self._timers.at(self._timers.now() + self._settings.status_sync_interval, self.try_bind, pending)
            return
        node, slots = _devices(candidates[0], pending.workload.gpus_per_pod)
        del self._pending[pending.key]
        wall = self._timers.wall()
        pod = SimPod(pending.name, pending.namespace, node.name, pending.workload, slots)
        pod.started = wall
        pod.index = next(self._pod_counter)
        node.reserve(slots)
        self._write_bound(pod, node, wall, bind_existing=True)
        node.pods.append(pod)
        node.last_sig = None
        self._pods[pod.key] = pod
        self._bound(pod)
        self._emit(NodeChanged(self._timers.now(), wall, node.name, f"pod {pod.key} scheduled (replacement)"))

    async def _ask_extenders(self, pending: PendingPod, names: list[str]) -> None:
        """The device-plugin candidates put to the extenders; bind to the first they pass."""
        try:
            # `follow()` owns the session; until it runs, none passes and the pod waits.
            allowed = await extenders_pass(self._extenders, self._session, self._store, pending, names)
        finally:
            self._asking.discard(pending.key)
        if allowed is not None and self._pending.get(pending.key) is pending:  # not gone meanwhile
            # The fleet moved on while the extenders answered: take what is still free.
            fresh = self._candidates(pending.workload, first=False)
            self._bind_first(pending, [c for c in fresh if c[0].name in allowed])

    def _candidates(self, workload: Workload, *, first: bool) -> list[tuple[SimNode, tuple[Slot, ...]]]:
        return replacement_candidates(self._store, self._nodes, self.cache, workload, first=first)

    def _write_bound(self, pod: SimPod, node: SimNode, wall: float, bind_existing: bool = False) -> None:
        """Write the pod (and, on DRA, its claim) as scheduler, controllers and kubelet would."""
        workload = pod.workload
        job_uid = self._job_uids.get((pod.namespace, workload.name))
        if not node.is_dra or workload.extended_resource:
            # Requests nvidia.com/gpu: the device plugin's, or (KEP-5004) a DeviceClass's that maps it.
            pod_obj = objects.pod(
                name=pod.name, workload=workload, node_name=node.name, gpus=len(pod.slots),
                dra=False, claim_name=None, job_uid=job_uid,
            )  # fmt: skip
        if not node.is_dra:
            pod_obj["status"] = self._admit(pod, node, pod_obj, None, wall)
            pod.uid = _put_pod(self._store, pod_obj, bind_existing)["metadata"]["uid"]
            return
        if workload.extended_resource:
            pod.extended = True
            pod_obj["status"] = {"phase": "Pending"}
            pod.uid = _put_pod(self._store, pod_obj, bind_existing)["metadata"]["uid"]
            pod.claim_name = f"{pod.name}-extended-resources-{objects.suffix(self._rng)}"
            devices = [mig.dra_device(node.group.mig, s) for s in pod.slots]
            claim, allocation, mapping = objects.extended_binding(
                pod_obj, pod.claim_name, pod.uid, node.name, devices
            )
            pod.claim_uid = self._store.create(_CLAIMS, claim, validate=False)["metadata"]["uid"]
            write_status(self._api, _CLAIMS, pod.claim_name, pod.namespace, allocation)
            status = self._admit(pod, node, pod_obj, None, wall)
            status["extendedResourceClaimStatus"] = mapping
            write_status(self._api, "pods", pod.name, pod.namespace, status)
            return
        template = workload.dra_claim == "template"
        if template:
            pod.claim_name = f"{pod.name}-gpus-{objects.suffix(self._rng)}"
        else:
            # A claim created up front (by the workload's owner), referenced by name.
            pod.claim_name = f"{pod.name}-gpus"
            claim = objects.resource_claim(
                name=pod.claim_name, namespace=pod.namespace, gpus=len(pod.slots), owner=None,
                template=None, tolerations=objects.claim_tolerations(workload),
            )  # fmt: skip
            pod.claim_uid = self._store.create(_CLAIMS, claim, validate=False)["metadata"]["uid"]
        pod_obj = objects.pod(
            name=pod.name, workload=workload, node_name=node.name, gpus=len(pod.slots),
            dra=True, claim_name=pod.claim_name, job_uid=job_uid,
        )  # fmt: skip
        pod_obj["status"] = {"phase": "Pending"}
        pod.uid = _put_pod(self._store, pod_obj, bind_existing)["metadata"]["uid"]
        claim_statuses = None
        if template:
            # The resource claim controller generates the claim, owned by the pod.
            owner = {
                "apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid,
                "controller": True, "blockOwnerDeletion": True,
            }  # fmt: skip
            claim = objects.resource_claim(
                name=pod.claim_name,
                namespace=pod.namespace,
                gpus=len(pod.slots),
                owner=owner,
                template=f"{workload.name}-gpus",
                tolerations=objects.claim_tolerations(workload),
            )
            pod.claim_uid = self._store.create(_CLAIMS, claim, validate=False)["metadata"]["uid"]
            claim_statuses = [{"name": "gpus", "resourceClaimName": pod.claim_name}]
        # The scheduler allocates the devices and reserves the claim for the pod.
        devices = [mig.dra_device(node.group.mig, s) for s in pod.slots]
        allocation = objects.claim_status(node.name, devices, pod.name, pod.uid)
        write_status(self._api, _CLAIMS, pod.claim_name, pod.namespace, allocation)
        status = self._admit(pod, node, pod_obj, claim_statuses, wall)
        write_status(self._api, "pods", pod.name, pod.namespace, status)

    # ------------------------------------------------------------------ every other pending pod

    def stop(self) -> None:
        self._stopped = True
        for watch in self._watches:
            watch.close()
        self._wake.set()
        for task in self._asks:
            task.cancel()

    async def follow(self) -> None:
        """Watch the store and bind every pending pod of ours until `stop()`.

        The cache is listed first (an informer's list, then watch from its resourceVersion), so
        the first pods are judged against the whole cluster.
        """
        session = self._session = aiohttp.ClientSession() if self._extenders else None
        try:
            while not self._stopped:
                feeds = [
                    ("nodes", lambda e, et: self.cache.on_node(et, e.load())),
                    (_SLICES, lambda e, et: self.cache.on_slice(et, e.load())),
                    (_CLASSES, lambda e, et: self.cache.on_class(et, e.load())),
                    (_RULES, lambda e, et: self.cache.on_rule(et, e.load())),
                    (_CLAIMS, lambda e, et: self.cache.on_claim(et, e.load())),
                    ("pods", self._on_pod),
                ]
                self.cache = SchedulerCache()
                rv = str(self._store.resource_version)
                for resource, handle in feeds:
                    entries, _ = self._store.list_entries(resource)
                    for i, entry in enumerate(entries):
                        handle(entry, "ADDED")
                        if i % 500 == 499:
                            await asyncio.sleep(0)
                self._watches = [self._store.watch(r, resource_version=rv) for r, _ in feeds]
                try:
                    async with asyncio.TaskGroup() as group:
                        for watch, (_, handle) in zip(self._watches, feeds, strict=True):
                            group.create_task(self._feed(watch, handle))
                        group.create_task(self._run_queue(session))
                except* _Relist:
                    pass
                finally:
                    for watch in self._watches:
                        watch.close()
        finally:
            if session is not None:
                await session.close()

    async def _feed(self, watch: Watch, handle: Callable[[Entry, str], bool]) -> None:
        while True:
            item = await watch.next_entry()
            if item is None:
                if self._stopped:
                    self._wake.set()
                    return
                raise _Relist  # the watch fell behind and was ended: list again
            etype, entry = item
            try:
                helps = handle(entry, etype)
            except Exception:
                log.exception("scheduler: %s event for %s/%s failed", etype, entry.namespace, entry.name)
                continue
            if helps and self._unschedulable:
                for key in self._unschedulable:
                    self._queue[key] = None
                self._wake.set()

    def _on_pod(self, entry: Entry, etype: str) -> bool:
        key = f"{entry.namespace}/{entry.name}"
        fields = entry.fields or {}
        helps = self.cache.on_pod(etype, key, fields, entry.load)
        if etype == "DELETED":
            self._queue.pop(key, None)
            self._unschedulable.pop(key, None)
            self._pod_gone(entry.load(), lambda ns, name: self.cache.claims.get((ns, name)))
            return helps
        if fields.get("spec.nodeName") or fields.get("status.phase") in ("Succeeded", "Failed"):
            return helps
        if fields.get("spec.schedulerName", "") not in OUR_SCHEDULERS:
            return helps
        if key in self._pending or key in self._pods:
            return helps  # the scenario's own replacement pods: `try_bind` places them
        if key not in self._queue and key not in self._unschedulable:
            self._queue[key] = None
            self._wake.set()
        return helps

    async def _run_queue(self, session: aiohttp.ClientSession | None) -> None:
        while not self._stopped:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            for done in itertools.count(1):
                if not self._queue or self._stopped:
                    break
                key = next(iter(self._queue))
                del self._queue[key]
                try:
                    await self._schedule_one(key, session)
                except Exception:
                    log.exception("scheduler: scheduling %s failed", key)
                if done % _BATCH == 0:
                    await asyncio.sleep(0)
            await asyncio.sleep(0)

    # ------------------------------------------------------------------ one scheduling cycle

    async def _schedule_one(self, key: str, session: aiohttp.ClientSession | None) -> None:
        namespace, name = key.split("/", 1)
        try:
            obj = self._store.get("pods", name, namespace)
        except ApiError:
            return
        spec = obj.get("spec") or {}
        if spec.get("nodeName") or spec.get("schedulerName", "") not in OUR_SCHEDULERS:
            return
        if obj["metadata"].get("deletionTimestamp"):
            return
        total = sum(1 for _ in self.cache.nodes)
        try:
            pod = pod_info(obj)
        except QuantityError as exc:
            self._unschedulable_pod(obj, f'running PreFilter plugin "NodeResourcesFit": {exc}')
            return

        def make_claim(pod_claim: str, template: str) -> dict[str, Any]:
            created = self._claim_for(obj, pod_claim, template)
            self.cache.on_claim("ADDED", created)
            return created

        try:
            claims = pod_claims(obj, pod, self.cache.claims, make_claim)
        except Unfit as exc:
            self._unschedulable_pod(obj, failed_scheduling_message(total, {exc.reason: total}, 0))
            return
        ignored = frozenset().union(*(e.config.ignored_resources() for e in self._extenders))
        try:
            dra = (
                DraCycle(plan(claims, self.cache.classes), list(self.cache.rules.values()))
                if claims
                else None
            )
        except CelUnsupported as exc:
            self._unschedulable_pod(obj, f'running Filter plugin "DynamicResources": {exc}')
            return
        except Unfit as exc:
            self._unschedulable_pod(obj, failed_scheduling_message(total, {exc.reason: total}, 0))
            return
        feasible, allocations = find_nodes(self.cache, pod, dra, ignored)
        extender_scores: dict[str, int] = {}
        if feasible:
            try:
                feasible, failed, extender_scores = await extend(
                    self._extenders, session, obj, pod.requests, feasible, self._node_object
                )
            except ExtenderError as exc:
                self._unschedulable_pod(obj, str(exc))
                return
            if not feasible:
                reasons: dict[str, int] = {}
                for reason in failed.values():
                    reasons[reason] = reasons.get(reason, 0) + 1
                self._unschedulable_pod(obj, failed_scheduling_message(total, reasons, 0))
                return
        if not feasible:
            self._unschedulable_pod(obj, explain(self.cache, pod, dra, ignored, total))
            return
        node = pick(self.cache, pod, feasible, extender_scores, self._rng)
        self._bind(obj, pod, node, claims, allocations.get(node, {}))

    def _node_object(self, name: str) -> dict[str, Any]:
        return self._store.get("nodes", name)

    # ------------------------------------------------------------------ binding and its records

    def _bind(
        self,
        obj: dict[str, Any],
        pod: PodInfo,
        node: str,
        claims: list[dict[str, Any]],
        allocations: Mapping[str, dict[str, Any]],
    ) -> None:
        for claim in claims:
            self._reserve_claim(claim, pod, allocations.get(claim["metadata"]["name"]))
        try:
            binding = {
                "metadata": {"name": pod.name, "uid": pod.uid},
                "target": {"kind": "Node", "name": node},
            }
            bind(self._store, pod.namespace, pod.name, binding)
        except ApiError as exc:
            log.info("scheduler: binding %s to %s failed: %s", pod.key, node, exc.message)
            return
        self.cache.assume(pod.key, node, dict(pod.requests))
        self._unschedulable.pop(pod.key, None)
        self._events.emit(obj, NORMAL, "Scheduled", f"Successfully assigned {pod.key} to {node}", "Binding")
        self._emit(NodeChanged(self._timers.now(), self._timers.wall(), node, f"pod {pod.key} scheduled"))

    def _reserve_claim(self, claim: dict[str, Any], pod: PodInfo, allocation: dict[str, Any] | None) -> None:
        """Write the claim's allocation (when new) and reserve it for the pod."""
        meta = claim["metadata"]

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            status = obj.setdefault("status", {})
            if allocation is not None and not status.get("allocation"):
                status["allocation"] = allocation
            reserved = [r for r in status.get("reservedFor") or () if r.get("uid") != pod.uid]
            status["reservedFor"] = [*reserved, {"resource": "pods", "name": pod.name, "uid": pod.uid}]
            return obj

        written = self._store.mutate(_CLAIMS, meta["name"], meta["namespace"], fn, subresource="status")
        self.cache.on_claim("MODIFIED", written)

    def _unschedulable_pod(self, obj: dict[str, Any], message: str) -> None:
        """PodScheduled=False/Unschedulable, a FailedScheduling Event, and a retry after the backoff."""
        meta = obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        attempts = self._unschedulable.get(key, 0) + 1
        self._unschedulable[key] = attempts
        ts = format_timestamp(self._timers.wall())
        with contextlib.suppress(ApiError):
            self._store.mutate(
                "pods",
                meta["name"],
                meta["namespace"],
                lambda pod_obj: mark_unschedulable(pod_obj, message, ts),
                subresource="status",
            )
        self._events.emit(obj, WARNING, "FailedScheduling", message, "Scheduling")
        settings = self._settings
        backoff = min(
            settings.scheduler_max_backoff, settings.scheduler_initial_backoff * 2 ** (attempts - 1)
        )
        self._timers.at(self._timers.now() + backoff, self._retry, key, attempts)
        self._timers.wake()

    def _retry(self, key: str, attempts: int) -> None:
        if self._unschedulable.get(key) == attempts:
            self._queue[key] = None
            self._wake.set()


def _put_pod(store: Store, pod_obj: dict[str, Any], bind_existing: bool) -> dict[str, Any]:
    """Create the pod, or bind an existing Pending one (same uid) as the scheduler's binding does."""
    if not bind_existing:
        return store.create("pods", pod_obj, namespace=pod_obj["metadata"]["namespace"], validate=False)

    def bind(obj: dict[str, Any]) -> dict[str, Any]:
        obj["spec"] = pod_obj["spec"]
        obj["status"] = pod_obj["status"]
        return obj

    meta = pod_obj["metadata"]
    return store.mutate("pods", meta["name"], meta["namespace"], bind)


def _devices(candidate: tuple[SimNode, tuple[Slot, ...]], count: int) -> tuple[SimNode, tuple[Slot, ...]]:
    """The node and devices a replacement bound there gets: on DRA the scheduler's allocation; on
    a device-plugin node the kubelet's device manager chooses among the usable ones at admission
    (`device_manager`), whatever order the candidates listed them in."""
    node, usable = candidate
    if node.is_dra:
        return node, usable
    chosen = allocate(node, usable, count)
    assert chosen is not None  # a candidate has enough usable slots
    return node, chosen


def replacement_candidates(
    store: Store, nodes: Mapping[str, SimNode], cache: SchedulerCache, workload: Workload, *, first: bool
) -> list[tuple[SimNode, tuple[Slot, ...]]]:
    """Every node with enough usable free slots for a replacement of `workload`, in the fleet's
    order (`first`: only the first): what the scheduler and its filters would pick before any
    extender. With each node its slots: on DRA the devices the scheduler allocates; on a
    device-plugin node every usable one, the kubelet choosing among them at admission."""
    out: list[tuple[SimNode, tuple[Slot, ...]]] = []
    rules: list[dict[str, Any]] | None = None
    tolerations = objects.claim_tolerations(workload)
    for node in nodes.values():
        if len(node.free) < workload.gpus_per_pod or not eligible(workload, node.group):
            continue
        if node.ready != "True" or not node.writes:
            continue
        if not objects.schedulable(store.get("nodes", node.name)):
            continue
        if node.is_dra and rules is None:
            rules = store.list(_RULES)[0]
        blocked = blocked_devices(node, rules or [], tolerations)
        if node.is_dra:
            # Devices the claims of clients' pods hold are not in the fleet's free slots.
            held = cache.in_use
            layout = node.group.mig
            blocked |= {
                s.gpu for s in node.free if (DRA_DRIVER, node.name, mig.dra_device(layout, s)) in held
            }
        else:
            # Pods bound by `follow()` must have left room (the cache knows every bound pod's requests).
            info = cache.nodes.get(node.name)
            if info is not None and info.free(workload.resource) < workload.gpus_per_pod * 1000:
                continue
        usable = [s for s in node.free if s.gpu not in blocked]
        if len(usable) >= workload.gpus_per_pod:
            out.append((node, tuple(usable[: workload.gpus_per_pod] if node.is_dra else usable)))
            if first:
                break
    return out


async def extenders_pass(
    extenders: Sequence[Extender],
    session: aiohttp.ClientSession | None,
    store: Store,
    pending: PendingPod,
    names: list[str],
) -> set[str] | None:
    """The candidate nodes the extenders pass for a replacement pod (the pod as stored); None when
    the pod is gone. A non-ignorable extender's failure, or no session, passes none (the pod
    waits, as kube-scheduler's attempt would fail)."""
    if session is None:
        return set()
    try:
        pod_obj = store.get("pods", pending.name, pending.namespace)
    except ApiError:
        return None
    requests = {pending.workload.resource: pending.workload.gpus_per_pod}
    try:
        passed, _, _ = await extend(
            extenders, session, pod_obj, requests, names, lambda n: store.get("nodes", n)
        )
    except ExtenderError as exc:
        log.info("scheduler: extender refused %s: %s", pending.key, exc)
        return set()
    return set(passed)


class _Relist(Exception):
    """A watch of the scheduler's informers ended: list and watch again."""
