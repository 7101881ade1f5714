"""The StatefulSet controller: pods with stable names `<set>-<ordinal>`, in order or in parallel.

Each ordinal 0..replicas-1 has one pod, named `<set>-<ordinal>`, labelled from the template plus
`statefulset.kubernetes.io/pod-name`, `apps.kubernetes.io/pod-index` and
`controller-revision-hash` (`<set>-<hash of the template>`), with `hostname` and `subdomain`
(`serviceName`) set, owned by the set and created without a node. A deleted pod comes back
under the same name. `podManagementPolicy: OrderedReady` (the default) creates ordinal n only
once 0..n-1 are Running and Ready and removes surplus pods from the highest ordinal one at a
time; `Parallel` does both at once. A template change (RollingUpdate) replaces pods from the
highest ordinal down, one at a time, each once every pod is Ready; `OnDelete` waits for the user.
Status: replicas, readyReplicas, availableReplicas, currentReplicas, updatedReplicas,
currentRevision, updateRevision, observedGeneration, collisionCount. Events:
SuccessfulCreate / SuccessfulDelete ("create Pod web-0 in StatefulSet web successful").
Not done: volumeClaimTemplates (no PersistentVolumeClaims are served), ControllerRevisions,
partitions, maxUnavailable, `ordinals.start`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from simulator.apiserver.errors import ApiError
from simulator.fleet import workloads
from simulator.fleet.events_recorder import NORMAL, WARNING, EventRecorder
from simulator.fleet.informer import Informer
from simulator.fleet.timers import Timers
from simulator.fleet.workqueue import WorkQueue

if TYPE_CHECKING:
    from simulator.apiserver.store import Store

SETS = "statefulsets.apps"
REVISION_LABEL = "controller-revision-hash"


def ordinal_of(set_name: str, pod_name: str) -> int | None:
    prefix = f"{set_name}-"
    if not pod_name.startswith(prefix) or not pod_name[len(prefix) :].isdigit():
        return None
    return int(pod_name[len(prefix) :])


class StatefulSetController:
    """Keeps each StatefulSet's numbered pods and status."""

    def __init__(self, store: Store, timers: Timers, recorder: Callable[[str], EventRecorder]) -> None:
        self._store = store
        self._timers = timers
        self._events = recorder("statefulset-controller")
        self._queue = WorkQueue(self.sync_one)
        self.informers = [
            Informer(store, SETS, self._queue.own, self.sync),
            Informer(store, "pods", self._queue.owned_by("StatefulSet"), self.sync),
        ]

    def close(self) -> None:
        for informer in self.informers:
            informer.close()

    def sync(self) -> None:
        self._queue.sync()

    def sync_one(self, namespace: str, name: str) -> None:
        try:
            sts = self._store.get(SETS, name, namespace)
        except ApiError:
            return
        uid = sts["metadata"]["uid"]
        spec = sts.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        revision = f"{name}-{workloads.template_hash(spec.get('template') or {})}"
        entries, _ = self._store.list_entries("pods", namespace)
        pods: dict[int, dict[str, Any]] = {}
        for entry in entries:
            ordinal = ordinal_of(name, entry.name)
            if ordinal is None:
                continue
            pod = entry.load()
            if workloads.controlled_by(pod, uid):
                pods[ordinal] = pod
        if not workloads.terminating(sts):
            self._manage(sts, pods, replicas, revision)
        self._write_status(sts, pods, revision)

    def _manage(
        self, sts: dict[str, Any], pods: dict[int, dict[str, Any]], replicas: int, revision: str
    ) -> None:
        spec = sts.get("spec") or {}
        ordered = (spec.get("podManagementPolicy") or "OrderedReady") == "OrderedReady"

        def healthy(pod: dict[str, Any]) -> bool:
            return (
                workloads.phase(pod) == "Running"
                and workloads.is_ready(pod)
                and not workloads.terminating(pod)
            )

        for ordinal in range(replicas):
            pod = pods.get(ordinal)
            if pod is None:
                created = self._create(sts, ordinal, revision)
                if created is None:
                    return
                pods[ordinal] = created
                if ordered:
                    return  # the next ordinal waits for this one to be Running and Ready
            elif workloads.phase(pod) in ("Succeeded", "Failed") and not workloads.terminating(pod):
                self._delete(sts, pod)  # recreated under the same name once gone
                return
            elif ordered and not healthy(pod):
                return
        surplus = sorted((o for o in pods if o >= replicas), reverse=True)
        for ordinal in surplus:
            if not workloads.terminating(pods[ordinal]):
                self._delete(sts, pods[ordinal])
            if ordered:
                return
        if surplus:
            return
        strategy = (spec.get("updateStrategy") or {}).get("type") or "RollingUpdate"
        if strategy != "RollingUpdate":
            return
        if not all(healthy(pods[o]) for o in range(replicas) if o in pods):
            return
        for ordinal in sorted(pods, reverse=True):
            labels = pods[ordinal]["metadata"].get("labels") or {}
            if labels.get(REVISION_LABEL) != revision:
                self._delete(sts, pods[ordinal])
                return

    def _create(self, sts: dict[str, Any], ordinal: int, revision: str) -> dict[str, Any] | None:
        meta = sts["metadata"]
        name = f"{meta['name']}-{ordinal}"
        labels = {
            REVISION_LABEL: revision,
            "statefulset.kubernetes.io/pod-name": name,
            "apps.kubernetes.io/pod-index": str(ordinal),
        }
        pod = workloads.pod_from_template(
            (sts.get("spec") or {}).get("template") or {}, sts, name=name, extra_labels=labels
        )
        pod["spec"]["hostname"] = name
        if (sts.get("spec") or {}).get("serviceName"):
            pod["spec"]["subdomain"] = sts["spec"]["serviceName"]
        try:
            created = self._store.create("pods", pod, namespace=meta["namespace"], validate=False)
        except ApiError as exc:
            if exc.code == 409:
                return None  # the old pod of that name is still going
            self._events.emit(
                sts,
                WARNING,
                "FailedCreate",
                f"create Pod {name} in StatefulSet {meta['name']} failed error: {exc.message}",
            )
            return None
        self._events.emit(
            sts, NORMAL, "SuccessfulCreate", f"create Pod {name} in StatefulSet {meta['name']} successful"
        )
        return created

    def _delete(self, sts: dict[str, Any], pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        with contextlib.suppress(ApiError):
            self._store.delete("pods", name, pod["metadata"]["namespace"])
            self._events.emit(
                sts,
                NORMAL,
                "SuccessfulDelete",
                f"delete Pod {name} in StatefulSet {sts['metadata']['name']} successful",
            )

    def _write_status(self, sts: dict[str, Any], pods: dict[int, dict[str, Any]], revision: str) -> None:
        live = [p for p in pods.values() if workloads.is_active(p)]
        updated = sum(1 for p in live if (p["metadata"].get("labels") or {}).get(REVISION_LABEL) == revision)
        old = sts.get("status") or {}
        current_revision = old.get("currentRevision") or revision
        replicas = int((sts.get("spec") or {}).get("replicas", 1))
        if updated == len(live) == replicas:
            current_revision = revision  # the rollout is done: the update revision becomes current
        current = sum(
            1 for p in live if (p["metadata"].get("labels") or {}).get(REVISION_LABEL) == current_revision
        )
        ready = sum(1 for p in live if workloads.is_ready(p))
        status = {
            "observedGeneration": int(sts["metadata"].get("generation") or 1),
            "replicas": len(live),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentReplicas": current,
            "updatedReplicas": updated,
            "currentRevision": current_revision,
            "updateRevision": revision,
            "collisionCount": 0,
        }
        if status != old:

            def apply(obj: dict[str, Any]) -> None:
                obj["status"] = status

            meta = sts["metadata"]
            self._store.mutate(SETS, meta["name"], meta["namespace"], apply, subresource="status")
