"""The controllers of the scenario's workloads: Deployments' ReplicaSets and Jobs.

They create the workloads' Jobs and ResourceClaimTemplates, replace a pod deleted through the
API (eviction, delete) with a Pending one after `replacement_delay` simulated seconds, keep
Job status (active, succeeded, Complete) and end a Job pod's run after its `completeAfter`.
A deleted pod's ResourceClaim goes with it (the garbage collector's part).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet import objects
from simulator.fleet.state import PendingPod, SimPod
from simulator.fleet.timers import Timers
from simulator.fleet.writes import create_ignore_exists
from simulator.model import DRA, NodeGroup, Workload, eligible

if TYPE_CHECKING:
    from simulator.apiserver.store import Store


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
        self._timers = timers
        self._pods = pods
        self._pending = pending
        self._rng = rng
        self._submit = submit
        self._complete = complete
        self.replacement_delay = replacement_delay
        """Simulated seconds from a pod's deletion to its replacement's creation (controller + scheduler)."""
        self.job_uids: dict[tuple[str, str], str] = {}

    def create(self, workloads: Iterable[Workload], groups: Iterable[NodeGroup]) -> None:
        """The workloads' ResourceClaimTemplates (where they can land on DRA nodes) and Jobs."""
        groups = tuple(groups)
        for workload in workloads:
            if any(eligible(workload, g) and g.path == DRA for g in groups):
                create_ignore_exists(
                    self._store,
                    "resourceclaimtemplates.resource.k8s.io",
                    objects.resource_claim_template(workload),
                )
            template = objects.pod(
                name="template",
                workload=workload,
                node_name="",
                gpus=workload.gpus_per_pod,
                dra=workload.path == DRA,
                claim_name=None,
                job_uid=None,
            )
            if workload.kind == "Job":
                created = create_ignore_exists(self._store, "jobs.batch", objects.job(workload, template))
            else:
                # The Deployment and its ReplicaSet exist so the pods' owner references resolve (the
                # garbage collector deletes what has no owner) and their status is kept; the fleet
                # lays out and replaces the pods itself (`objects.MANAGED_BY_FLEET`).
                owner = create_ignore_exists(
                    self._store, "deployments.apps", objects.deployment(workload, template)
                )
                created = create_ignore_exists(
                    self._store, "replicasets.apps", objects.replica_set(workload, template, owner)
                )
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

    def _replace(self, workload: Workload) -> None:
        name = objects.pod_name(workload, 0, self._rng)
        while f"{workload.namespace}/{name}" in self._pods or f"{workload.namespace}/{name}" in self._pending:
            name = objects.pod_name(workload, 0, self._rng)
        pending = PendingPod(name, workload.namespace, workload, self._timers.now())
        pod_obj = objects.pod(
            name=name,
            workload=workload,
            node_name="",
            gpus=workload.gpus_per_pod,
            dra=workload.path == DRA,
            claim_name=f"{name}-gpus",
            job_uid=self.job_uids.get((workload.namespace, workload.name)),
        )
        del pod_obj["spec"]["nodeName"]
        pod_obj["status"] = objects.pending_status(self._timers.wall())
        self._store.create("pods", pod_obj, namespace=workload.namespace, validate=False)
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
