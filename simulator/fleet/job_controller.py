"""The controllers of the scenario's workloads: Deployments' ReplicaSets and Jobs.

They create the workloads' Jobs and ResourceClaimTemplates, replace a pod deleted through the
API (eviction, delete) with a Pending one after `replacement_delay` simulated seconds, follow a
Deployment's `spec.replicas` written through the API (`kubectl scale`: pods added, or removed in
the ReplicaSet controller's order), keep Job status (active, succeeded, Complete) and end a Job
pod's run after its `completeAfter`.
A deleted pod's ResourceClaim goes with it (the garbage collector's part).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet import objects, workloads
from simulator.fleet.informer import Informer
from simulator.fleet.node_api import StoreNodeApi
from simulator.fleet.state import PendingPod, SimPod
from simulator.fleet.timers import Timers
from simulator.fleet.workqueue import WorkQueue
from simulator.fleet.writes import create_ignore_exists
from simulator.model import DRA, NodeGroup, Workload, eligible

if TYPE_CHECKING:
    from simulator.apiserver.store import Entry, Store


DEPLOYMENTS = "deployments.apps"

TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
"""The finalizer the Job controller puts on its pods until it has counted them."""


class JobController:
    """The job controller and the ReplicaSet controller for the scenario's workloads.

    Owns `job_uids` (each Job's or ReplicaSet's uid, for the pods' owner references) and adds replacement
    pods to `pending`; `submit(pending)` hands one to the scheduler and `complete(pod)` ends a
    Job pod's run on its kubelet.
    """

    def __init__(
        self,
        store: Store,
        timers: Timers,
        pods: Mapping[str, SimPod],
        pending: dict[str, PendingPod],
        rng: random.Random,
        submit: Callable[[PendingPod], None],
        complete: Callable[[SimPod], None],
        *,
        replacement_delay: float = 5.0,
    ) -> None:
        self._store = store
        self._api = StoreNodeApi(store)
        self._timers = timers
        self._pods = pods
        self._pending = pending
        self._rng = rng
        self._submit = submit
        self._complete = complete
        self.replacement_delay = replacement_delay
        """Simulated seconds from a pod's deletion to its replacement's creation (controller + scheduler)."""
        self.job_uids: dict[tuple[str, str], str] = {}
        self._workloads: dict[tuple[str, str], Workload] = {}
        self._desired: dict[tuple[str, str], int] = {}
        """Each Deployment's `spec.replicas` as last read from the API (the scenario's at first)."""
        self._rescale: set[tuple[str, str]] = set()
        self.informers = [Informer(store, DEPLOYMENTS, self._deployment_event, self._sync_scale)]

    def close(self) -> None:
        for informer in self.informers:
            informer.close()

    def create(self, workloads: Iterable[Workload], groups: Iterable[NodeGroup]) -> None:
        """The workloads' ResourceClaimTemplates (where they can land on DRA nodes) and Jobs."""
        groups = tuple(groups)
        for workload in workloads:
            if not workload.extended_resource and any(
                eligible(workload, g) and g.path == DRA for g in groups
            ):
                create_ignore_exists(
                    self._api,
                    "resourceclaimtemplates.resource.k8s.io",
                    objects.resource_claim_template(workload),
                )
            template = objects.pod(
                name="template",
                workload=workload,
                node_name="",
                gpus=workload.gpus_per_pod,
                dra=workload.path == DRA and not workload.extended_resource,
                claim_name=None,
                job_uid=None,
            )
            if workload.kind == "Job":
                created = create_ignore_exists(self._api, "jobs.batch", objects.job(workload, template))
            else:
                # The Deployment and its ReplicaSet exist so the pods' owner references resolve (the
                # garbage collector deletes what has no owner) and their status is kept; the fleet
                # lays out and replaces the pods itself (`objects.MANAGED_BY_FLEET`).
                owner = create_ignore_exists(
                    self._api, "deployments.apps", objects.deployment(workload, template)
                )
                created = create_ignore_exists(
                    self._api, "replicasets.apps", objects.replica_set(workload, template, owner)
                )
                self._desired[(workload.namespace, workload.name)] = workload.replicas
            self._workloads[(workload.namespace, workload.name)] = workload
            self.job_uids[(workload.namespace, workload.name)] = created["metadata"].get("uid", "")

    def run_pods(self) -> None:
        """Simulated time starts: every initial pod with a `completeAfter` gets its end."""
        for pod in self._pods.values():
            if pod.workload.complete_after is not None:
                self._timers.at(pod.workload.complete_after, self._complete, pod)

    def pod_bound(self, pod: SimPod) -> None:
        """A replacement pod started."""
        if pod.workload.complete_after is not None:
            self._timers.at(self._timers.now() + pod.workload.complete_after, self._complete, pod)
        self.update()

    def pod_gone(self, pod: SimPod) -> None:
        """The pod was deleted through the API: its claim goes, an unfinished pod is replaced."""
        if pod.claim_name is not None:
            with contextlib.suppress(ApiError):
                self._store.delete("resourceclaims.resource.k8s.io", pod.claim_name, pod.namespace)
        if not pod.terminated:
            self._timers.at(self._timers.now() + self.replacement_delay, self._replace, pod.workload)
        self.update()

    def _owner_alive(self, workload: Workload) -> bool:
        """The workload's Job or ReplicaSet still exists and is not being deleted."""
        if workload.kind == "Job":
            resource, name = "jobs.batch", workload.name
        else:
            resource, name = "replicasets.apps", objects.replica_set_name(workload)
        try:
            owner = self._store.get(resource, name, workload.namespace)
        except ApiError:
            return False
        meta = owner["metadata"]
        return meta.get("uid") == self.job_uids.get((workload.namespace, workload.name)) and not meta.get(
            "deletionTimestamp"
        )

    def _deployment_event(self, etype: str, entry: Entry) -> None:
        key = (entry.namespace, entry.name)
        if etype == "DELETED" or key not in self._desired:
            return
        obj = entry.load()
        if not workloads.fleet_managed(obj):
            return
        replicas = int((obj.get("spec") or {}).get("replicas", 1))
        if replicas != self._desired[key]:
            self._desired[key] = replicas
            self._rescale.add(key)

    def _sync_scale(self) -> None:
        """Deployments scaled through the API: as many pods as `spec.replicas` asks.

        Up: new Pending pods at once, as the ReplicaSet controller creates them (placed like any
        replacement). Down: the surplus deleted in the ReplicaSet controller's order (unbound
        first, then not Ready, then the newest), gracefully like any API delete."""
        for key in sorted(self._rescale):
            workload, desired = self._workloads[key], self._desired[key]
            self._set_replicas(workload, desired)
            pending = [p for p in self._pending.values() if (p.namespace, p.workload.name) == key]
            live = self._live(workload)
            surplus = len(pending) + len(live) - desired
            if surplus < 0:
                for _ in range(-surplus):
                    self._replace(workload)
                continue
            victims = [(p.namespace, p.name) for p in sorted(pending, key=lambda p: -p.since)]
            victims += [(p.namespace, p.name) for p in sorted(live, key=lambda p: (p.ready, -p.started))]
            for namespace, name in victims[:surplus]:
                with contextlib.suppress(ApiError):
                    self._store.delete("pods", name, namespace)
        self._rescale.clear()

    def _set_replicas(self, workload: Workload, replicas: int) -> None:
        """The Deployment controller's part: its ReplicaSet's `spec.replicas` follows."""

        def fn(obj: dict[str, Any]) -> None:
            obj["spec"]["replicas"] = replicas

        with contextlib.suppress(ApiError):
            self._store.mutate("replicasets.apps", objects.replica_set_name(workload), workload.namespace, fn)

    def _live(self, workload: Workload) -> list[SimPod]:
        """The workload's pods that count towards its replicas: bound, not finished, not terminating."""
        key = (workload.namespace, workload.name)
        return [
            p
            for p in self._pods.values()
            if not p.api and (p.namespace, p.workload.name) == key and not p.terminated and not p.replaced
        ]

    def _replace(self, workload: Workload) -> None:
        if not self._owner_alive(workload):
            return  # deleted through the API: its pods go with it, as a real controller's would
        key = (workload.namespace, workload.name)
        if key in self._desired:
            waiting = sum(1 for p in self._pending.values() if (p.namespace, p.workload.name) == key)
            if len(self._live(workload)) + waiting >= self._desired[key]:
                return  # scaled down meanwhile: the pod gone was one too many
        name = objects.pod_name(workload, 0, self._rng)
        while f"{workload.namespace}/{name}" in self._pods or f"{workload.namespace}/{name}" in self._pending:
            name = objects.pod_name(workload, 0, self._rng)
        pending = PendingPod(name, workload.namespace, workload, self._timers.now())
        pod_obj = objects.pod(
            name=name,
            workload=workload,
            node_name="",
            gpus=workload.gpus_per_pod,
            dra=workload.path == DRA and not workload.extended_resource,
            claim_name=f"{name}-gpus",
            job_uid=self.job_uids.get((workload.namespace, workload.name)),
        )
        del pod_obj["spec"]["nodeName"]
        pod_obj["status"] = objects.pending_status(self._timers.wall())
        try:
            self._store.create("pods", pod_obj, namespace=workload.namespace, validate=False)
        except ApiError as exc:
            if exc.code in (403, 404):  # the workload's namespace is being deleted, or gone
                return
            raise
        self._pending[pending.key] = pending
        self._submit(pending)

    def update(self) -> None:
        """Job status from its pods: active, succeeded, and Complete once all succeeded."""
        counts: dict[tuple[str, str], list[int]] = {}
        for pod in self._pods.values():
            if pod.workload.kind != "Job":
                continue
            c = counts.setdefault((pod.namespace, pod.workload.name), [0, 0])
            c[1 if pod.terminated else 0] += 1
        wall = format_timestamp(self._timers.wall())
        for (ns, name), (active, succeeded) in counts.items():

            def fn(obj: dict[str, Any], active: int = active, succeeded: int = succeeded) -> dict[str, Any]:
                status = obj.setdefault("status", {})
                status["active"] = active
                status["succeeded"] = succeeded
                status.setdefault("startTime", wall)
                want = obj["spec"].get("completions") or 0
                if succeeded >= want and active == 0 and not status.get("completionTime"):
                    status["completionTime"] = wall
                    status["conditions"] = [
                        {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": wall},
                        {"type": "Complete", "status": "True", "lastTransitionTime": wall},
                    ]
                return obj

            with contextlib.suppress(Exception):
                self._store.mutate("jobs.batch", name, ns, fn, subresource="status")


class JobApiController:
    """The job controller for Jobs created through the API (the scenario's are `JobController`'s).

    Why two classes for one real controller: the scenario's Jobs are laid out by the fleet
    (deterministic placement on usable devices, `completeAfter`, replacement after
    `replacement_delay`), which an API Job's pods do not have: they are created unbound for the
    scheduler and run by the kubelet. The scenario's Jobs carry `objects.MANAGED_BY_FLEET` and this
    class leaves them alone, so the two never write the same Job.

    Pods: `<job>-<5 characters>`, labelled and owned as the real controller does
    (`batch.kubernetes.io/controller-uid`, `batch.kubernetes.io/job-name`, `controller-uid`,
    `job-name`), created up to `parallelism` while fewer than `completions` succeeded; a failed pod
    is replaced after the controller's backoff (10 s doubling, at most 6 min, simulated), and more
    than `backoffLimit` failures fail the Job (active pods deleted). Status: active, ready,
    succeeded, failed, startTime, completionTime, conditions SuccessCriteriaMet+Complete or
    FailureTarget+Failed (BackoffLimitExceeded). Events: SuccessfulCreate, SuccessfulDelete,
    Completed, BackoffLimitExceeded. Pods are tracked with the `batch.kubernetes.io/job-tracking`
    finalizer: a terminal (or deleted) pod is counted into status once, then its finalizer is
    removed, so a pod that succeeded and was deleted still counts as a completion. Of pod failure
    policies only the rule `Ignore` on `DisruptionTarget` is honoured (an evicted pod is replaced
    without counting towards `backoffLimit`). Not done: Indexed completion mode, suspend, other
    pod failure and success policies, activeDeadlineSeconds, ttlSecondsAfterFinished.
    """

    BACKOFF_SECONDS = 10.0
    MAX_BACKOFF_SECONDS = 360.0

    def __init__(
        self, store: Store, timers: Timers, recorder: Callable[[str], Any], *, rand_suffix: Callable[[], str]
    ) -> None:
        self._store = store
        self._timers = timers
        self._events = recorder("job-controller")
        self._suffix = rand_suffix
        self._queue = WorkQueue(self.sync_one)
        self._not_before: dict[tuple[str, str], float] = {}
        self.informers = [
            Informer(store, "jobs.batch", self._queue.own, self.sync),
            Informer(store, "pods", self._queue.owned_by("Job"), self.sync),
        ]

    def close(self) -> None:
        for informer in self.informers:
            informer.close()

    def sync(self) -> None:
        self._queue.sync()

    def _retry(self, key: tuple[str, str]) -> None:
        self._queue.add(key)
        self.sync()

    def sync_one(self, namespace: str, name: str) -> None:
        try:
            job = self._store.get("jobs.batch", name, namespace)
        except ApiError:
            return
        if workloads.fleet_managed(job) or workloads.terminating(job):
            return
        uid = job["metadata"]["uid"]
        entries, _ = self._store.list_entries(
            "pods", namespace, label_selector=f"batch.kubernetes.io/controller-uid={uid}"
        )
        pods = [p for p in (e.load() for e in entries) if workloads.controlled_by(p, uid)]
        status = dict(job.get("status") or {})
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in status.get("conditions") or ()
        )
        active = [p for p in pods if workloads.is_active(p)]
        spec = job.get("spec") or {}
        # Tracking with finalizers, as the real controller does: a terminal pod that still
        # carries the finalizer is counted into status.succeeded/failed once, then let go (the
        # kubelet deletes a terminated pod at once; a count from the pods that exist would
        # forget it and create its replacement even after it succeeded).
        succeeded = int((job.get("status") or {}).get("succeeded") or 0)
        failed = int((job.get("status") or {}).get("failed") or 0)
        ignore_disruptions = _ignores_disruptions(spec)
        for pod in pods:
            if TRACKING_FINALIZER not in (pod["metadata"].get("finalizers") or ()):
                continue
            if workloads.phase(pod) == "Succeeded":
                succeeded += 1
            elif workloads.phase(pod) == "Failed" or workloads.terminating(pod):
                # A pod deleted before it ran to the end counts as failed, as upstream counts it,
                # unless the Job's pod failure policy ignores a disruption it carries.
                if not (ignore_disruptions and _disrupted(pod)):
                    failed += 1
            else:
                continue
            self._untrack(pod)
        parallelism = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        backoff_limit = int(spec.get("backoffLimit", 6))
        now_wall = format_timestamp(self._timers.wall())
        key = (namespace, name)
        conditions = list(status.get("conditions") or [])
        if failed > int((job.get("status") or {}).get("failed") or 0):
            # A new failure: the next pod waits the controller's backoff, doubling per failure.
            delay = min(self.MAX_BACKOFF_SECONDS, self.BACKOFF_SECONDS * 2 ** max(0, failed - 1))
            self._not_before[key] = self._timers.now() + delay
        if not finished:
            status.setdefault("startTime", now_wall)
            done = succeeded >= int(completions) if completions is not None else succeeded > 0 and not active
            if failed > backoff_limit:
                for pod in active:
                    self._delete(job, pod)
                active = []
                why = ("BackoffLimitExceeded", "Job has reached the specified backoff limit", now_wall)
                conditions += [_job_condition("FailureTarget", *why), _job_condition("Failed", *why)]
                self._events.emit(
                    job, "Warning", "BackoffLimitExceeded", "Job has reached the specified backoff limit"
                )
            elif done and not active:
                why = ("CompletionsReached", "Reached expected number of succeeded pods", now_wall)
                conditions += [_job_condition("SuccessCriteriaMet", *why), _job_condition("Complete", *why)]
                status["completionTime"] = now_wall
                self._events.emit(job, "Normal", "Completed", "Job completed")
            elif not done:
                remaining = (
                    parallelism if completions is None else min(parallelism, int(completions) - succeeded)
                )
                want = max(0, remaining - len(active))
                not_before = self._not_before.get(key, 0.0)
                if want and failed and self._timers.now() < not_before:
                    self._timers.at(not_before, self._retry, key)
                    want = 0
                for _ in range(want):
                    created = self._create(job)
                    if created is None:
                        break
                    active.append(created)
        status.update(
            {
                "active": len(active),
                "ready": sum(1 for p in active if workloads.is_ready(p)),
                "succeeded": succeeded,
                "failed": failed,
            }
        )
        for field in ("active", "succeeded", "failed"):
            if not status[field]:
                status.pop(field)  # omitempty; `ready` is always written
        if conditions:
            status["conditions"] = conditions
        if status != (job.get("status") or {}):

            def apply(obj: dict[str, Any]) -> None:
                obj["status"] = status

            self._store.mutate("jobs.batch", name, namespace, apply, subresource="status")

    def _create(self, job: dict[str, Any]) -> dict[str, Any] | None:
        meta = job["metadata"]
        uid = meta["uid"]
        labels = {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": meta["name"],
            "controller-uid": uid,
            "job-name": meta["name"],
        }
        name = f"{meta['name']}-{self._suffix()}"
        pod = workloads.pod_from_template(
            (job.get("spec") or {}).get("template") or {}, job, name=name, extra_labels=labels
        )
        pod["metadata"]["finalizers"] = [TRACKING_FINALIZER]
        try:
            created = self._store.create("pods", pod, namespace=meta["namespace"], validate=False)
        except ApiError as exc:
            self._events.emit(job, "Warning", "FailedCreate", f"Error creating: {exc.message}")
            return None
        self._events.emit(job, "Normal", "SuccessfulCreate", f"Created pod: {name}")
        return created

    def _untrack(self, pod: dict[str, Any]) -> None:
        def drop(obj: dict[str, Any]) -> None:
            kept = [f for f in obj["metadata"].get("finalizers") or () if f != TRACKING_FINALIZER]
            if kept:
                obj["metadata"]["finalizers"] = kept
            else:
                obj["metadata"].pop("finalizers", None)

        with contextlib.suppress(ApiError):
            self._store.mutate("pods", pod["metadata"]["name"], pod["metadata"]["namespace"], drop)

    def _delete(self, job: dict[str, Any], pod: dict[str, Any]) -> None:
        with contextlib.suppress(ApiError):
            self._store.delete("pods", pod["metadata"]["name"], pod["metadata"]["namespace"])
            self._events.emit(job, "Normal", "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}")


def _ignores_disruptions(spec: dict[str, Any]) -> bool:
    """Whether the Job's podFailurePolicy ignores a pod with the DisruptionTarget condition (the
    rule a Job whose pods may be evicted should carry, docs/workloads.md)."""
    for rule in ((spec.get("podFailurePolicy") or {}).get("rules")) or ():
        if rule.get("action") != "Ignore":
            continue
        for cond in rule.get("onPodConditions") or ():
            if cond.get("type") == "DisruptionTarget" and cond.get("status", "True") == "True":
                return True
    return False


def _disrupted(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def _job_condition(ctype: str, reason: str, message: str, ts: str) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": "True",
        "lastProbeTime": ts,
        "lastTransitionTime": ts,
        "reason": reason,
        "message": message,
    }
