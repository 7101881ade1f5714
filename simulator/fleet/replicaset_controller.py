"""The ReplicaSet controller, which also serves ReplicationControllers (the same machinery, as
in kube-controller-manager): keep `spec.replicas` active pods owned by each set, and its status.

Pods are created from the set's template without a node (the scheduler binds them, the kubelet
runs them), named `<set>-<5 random characters>`, labelled from the template and owned by the
set (`controller: true`, `blockOwnerDeletion: true`). Surplus pods go in the real controller's
order: unbound before bound, Pending before Running, not Ready before Ready, the most recently
Ready first, then the newest. Status: replicas (active pods), fullyLabeledReplicas,
readyReplicas, availableReplicas (Ready for `minReadySeconds`), observedGeneration.
Events: SuccessfulCreate, SuccessfulDelete, FailedCreate.

Sets the fleet manages (the scenario's workloads, `workloads.MANAGED_BY_FLEET`) get status only.
Not done: adopting orphan pods that match a selector, releasing pods that stop matching, the
slow-start batches of creations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.selectors import LabelSelector, selector_from_label_selector_object
from simulator.fleet import workloads
from simulator.fleet.events_recorder import NORMAL, WARNING, EventRecorder
from simulator.fleet.informer import Informer
from simulator.fleet.timers import Timers

if TYPE_CHECKING:
    from simulator.apiserver.store import Entry, Store


@dataclass(frozen=True, slots=True)
class PodSummary:
    """What a set's status needs of one of its pods, kept from the pod's last event."""

    active: bool
    ready_since: str | None
    labels: dict[str, str]

    @staticmethod
    def of(pod: dict[str, Any]) -> PodSummary:
        return PodSummary(
            workloads.is_active(pod),
            workloads.ready_since(pod),
            dict((pod.get("metadata") or {}).get("labels") or {}),
        )


BURST_REPLICAS = 500
"""Pods created or deleted per sync at most, as the real controller's burst."""


@dataclass(frozen=True)
class SetKind:
    resource: str
    api_version: str
    kind: str
    component: str

    def selector(self, obj: dict[str, Any]) -> LabelSelector:
        raw = (obj.get("spec") or {}).get("selector")
        if self.kind == "ReplicationController":
            # A ReplicationController's selector is a plain map, defaulting to the template's labels.
            labels = raw or ((obj["spec"].get("template") or {}).get("metadata") or {}).get("labels") or {}
            return selector_from_label_selector_object({"matchLabels": labels})
        return selector_from_label_selector_object(raw or {})


REPLICA_SETS = SetKind("replicasets.apps", "apps/v1", "ReplicaSet", "replicaset-controller")
REPLICATION_CONTROLLERS = SetKind(
    "replicationcontrollers", "v1", "ReplicationController", "replication-controller"
)


def deletion_rank(pod: dict[str, Any]) -> tuple[Any, ...]:
    """Sort key: the pods to delete first sort first."""
    spec = pod.get("spec") or {}
    phase_order = {"Pending": 0, "Unknown": 1, "Running": 2}.get(workloads.phase(pod), 3)
    since = workloads.ready_since(pod)
    restarts = sum(
        int(cs.get("restartCount") or 0) for cs in (pod.get("status") or {}).get("containerStatuses") or ()
    )
    created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
    return (
        1 if spec.get("nodeName") else 0,
        phase_order,
        1 if since is not None else 0,
        # Ready more recently goes first: invert the timestamp's order through its negated epoch.
        -(workloads.parse_time(since) or 0.0) if since else 0.0,
        -restarts,
        tuple(-ord(c) for c in created),
    )


class ReplicaSetController:
    """Keeps each ReplicaSet's (or ReplicationController's) pods and status."""

    def __init__(
        self,
        store: Store,
        timers: Timers,
        recorder: Callable[[str], EventRecorder],
        *,
        kind: SetKind = REPLICA_SETS,
        rand_suffix: Callable[[], str],
    ) -> None:
        self._store = store
        self._timers = timers
        self.kind = kind
        self._events = recorder(kind.component)
        self._suffix = rand_suffix
        self._dirty: set[tuple[str, str]] = set()
        self._owned: dict[str, dict[tuple[str, str], PodSummary]] = {}
        """Set uid -> its pods' summaries, from pod events: the status of a large fleet-managed set
        is counted from these, without parsing its pods again on every change of one."""
        self._rechecks: set[tuple[str, str]] = set()
        """Sets with a timer pending for a pod becoming available (minReadySeconds)."""
        self._owner_marker = f'"kind":"{kind.kind}"'.encode()
        self.informers = [
            Informer(store, kind.resource, self._set_event, self.sync),
            Informer(store, "pods", self._pod_event, self.sync),
        ]

    def _set_event(self, etype: str, entry: Entry) -> None:
        if etype != "DELETED":
            self._dirty.add((entry.namespace, entry.name))

    def _pod_event(self, etype: str, entry: Entry) -> None:
        if self._owner_marker not in entry.data:
            return  # cheap: no pod of a set of this kind (the bytes name the owner's kind)
        pod = entry.load()
        ref = workloads.controller_ref(pod)
        if ref is None or ref.get("kind") != self.kind.kind:
            return
        owned = self._owned.setdefault(str(ref.get("uid")), {})
        if etype == "DELETED":
            owned.pop((entry.namespace, entry.name), None)
        else:
            owned[(entry.namespace, entry.name)] = PodSummary.of(pod)
        self._dirty.add((entry.namespace, str(ref.get("name"))))

    def mark(self, namespace: str, name: str) -> None:
        self._dirty.add((namespace, name))

    def sync(self) -> None:
        while self._dirty:
            namespace, name = self._dirty.pop()
            try:
                self.sync_one(namespace, name)
            except ApiError as exc:
                if exc.code != 404:
                    raise

    def sync_one(self, namespace: str, name: str) -> None:
        try:
            owner = self._store.get(self.kind.resource, name, namespace)
        except ApiError:
            return
        uid = owner["metadata"]["uid"]
        if workloads.fleet_managed(owner):
            summaries = [s for s in self._owned.get(uid, {}).values() if s.active]
            self._write_status(owner, summaries)
            return
        entries, _ = self._store.list_entries("pods", namespace, label_selector=self.kind.selector(owner))
        owned = [p for p in (e.load() for e in entries) if workloads.controlled_by(p, uid)]
        active = [p for p in owned if workloads.is_active(p)]
        spec = owner.get("spec") or {}
        want = int(spec.get("replicas", 1))
        if not workloads.terminating(owner):
            diff = want - len(active)
            if diff > 0:
                for _ in range(min(diff, BURST_REPLICAS)):
                    created = self._create_pod(owner)
                    if created is None:
                        break
                    active.append(created)
                    owned.append(created)
            elif diff < 0:
                doomed = sorted(active, key=deletion_rank)[: min(-diff, BURST_REPLICAS)]
                for pod in doomed:
                    with contextlib.suppress(ApiError):
                        self._store.delete("pods", pod["metadata"]["name"], namespace)
                        self._events.emit(
                            owner, NORMAL, "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}"
                        )
                gone = {p["metadata"]["name"] for p in doomed}
                active = [p for p in active if p["metadata"]["name"] not in gone]
        self._write_status(owner, [PodSummary.of(p) for p in active])

    def _create_pod(self, owner: dict[str, Any]) -> dict[str, Any] | None:
        template = (owner.get("spec") or {}).get("template") or {}
        name = f"{owner['metadata']['name']}-{self._suffix()}"
        pod = workloads.pod_from_template(template, owner, name=name)
        try:
            created = self._store.create(
                "pods", pod, namespace=owner["metadata"]["namespace"], validate=False
            )
        except ApiError as exc:
            self._events.emit(owner, WARNING, "FailedCreate", f"Error creating: {exc.message}")
            return None
        self._events.emit(owner, NORMAL, "SuccessfulCreate", f"Created pod: {name}")
        return created

    def _write_status(self, owner: dict[str, Any], active: list[PodSummary]) -> None:
        spec = owner.get("spec") or {}
        min_ready = int(spec.get("minReadySeconds") or 0)
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        now = self._timers.wall()
        ready = available = labelled = 0
        next_check: float | None = None
        for pod in active:
            if all(pod.labels.get(k) == v for k, v in template_labels.items()):
                labelled += 1
            since = pod.ready_since
            if since is None:
                continue
            ready += 1
            at = workloads.parse_time(since) if since else None
            if min_ready == 0 or at is None or at + min_ready <= now:
                available += 1
            else:
                wait = at + min_ready - now
                next_check = wait if next_check is None else min(next_check, wait)
        if next_check is not None:
            key = (owner["metadata"]["namespace"], owner["metadata"]["name"])
            if key not in self._rechecks:
                self._rechecks.add(key)
                # Wall seconds to simulated seconds: simulated time runs `speed` times faster.
                self._timers.at(self._timers.now() + next_check * self._timers.speed, self._recheck, key)
        status = {
            "replicas": len(active),
            "fullyLabeledReplicas": labelled,
            "readyReplicas": ready,
            "availableReplicas": available,
            "observedGeneration": int(owner["metadata"].get("generation") or 1),
        }
        old = owner.get("status") or {}
        new = {**{k: v for k, v in old.items() if k not in status}, **status}
        for field in ("fullyLabeledReplicas", "readyReplicas", "availableReplicas"):
            if new[field] == 0:
                new.pop(field)  # omitempty, as the real status serializes
        if new != old:

            def apply(obj: dict[str, Any]) -> None:
                obj["status"] = new

            self._store.mutate(
                self.kind.resource, owner["metadata"]["name"], owner["metadata"]["namespace"], apply,
                subresource="status",
            )  # fmt: skip

    def _recheck(self, key: tuple[str, str]) -> None:
        self._rechecks.discard(key)
        self._dirty.add(key)
        self.sync()

    def close(self) -> None:
        for informer in self.informers:
            informer.close()
