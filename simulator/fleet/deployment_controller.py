"""The Deployment controller: a Deployment's ReplicaSets, its rollouts and its status.

A Deployment owns one ReplicaSet per pod template it has had, named `<deployment>-<hash>`, with
the `pod-template-hash` label added to its template and selector and the revision annotations
(`deployment.kubernetes.io/revision`, `desired-replicas`, `max-replicas`). A template change
makes a new ReplicaSet and moves replicas to it:

- RollingUpdate: the new set grows while all sets together stay within `replicas + maxSurge`
  (25% by default, rounded up), the old sets shrink (oldest first, their unavailable pods first)
  while `replicas - maxUnavailable` (25%, rounded down) pods stay available;
- Recreate: the old sets go to zero, and the new one grows once no old pod is left.

Status: replicas, updatedReplicas, readyReplicas, availableReplicas, unavailableReplicas,
observedGeneration and the Available / Progressing conditions with the real reasons and
messages; events `ScalingReplicaSet` ("Scaled up replica set X from a to b"). Old sets beyond
`revisionHistoryLimit` (10) are deleted once empty. A paused Deployment only gets status.
Deployments the fleet manages (the scenario's) only get status. Not done: proportional scaling
of several live sets, progressDeadlineSeconds, rollback.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.selectors import selector_from_label_selector_object
from simulator.apiserver.store import format_timestamp
from simulator.fleet import workloads
from simulator.fleet.events_recorder import NORMAL, EventRecorder
from simulator.fleet.informer import Informer
from simulator.fleet.timers import Timers
from simulator.fleet.workqueue import WorkQueue

if TYPE_CHECKING:
    from simulator.apiserver.store import Store

RS = "replicasets.apps"
DEPLOYMENTS = "deployments.apps"
REVISION = "deployment.kubernetes.io/revision"
DESIRED = "deployment.kubernetes.io/desired-replicas"
MAX = "deployment.kubernetes.io/max-replicas"


def _replicas(obj: dict[str, Any]) -> int:
    return int((obj.get("spec") or {}).get("replicas", 1))


def _status(obj: dict[str, Any], field: str) -> int:
    return int((obj.get("status") or {}).get(field) or 0)


def _revision(rs: dict[str, Any]) -> int:
    try:
        return int(((rs.get("metadata") or {}).get("annotations") or {}).get(REVISION) or 0)
    except ValueError:
        return 0


def surge_and_unavailable(deployment: dict[str, Any]) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) in pods: surge rounds up, unavailability down; never both zero."""
    spec = deployment.get("spec") or {}
    replicas = _replicas(deployment)
    strategy = spec.get("strategy") or {}
    if strategy.get("type") == "Recreate":
        return 0, 0
    rolling = strategy.get("rollingUpdate") or {}
    surge = workloads.scaled(rolling.get("maxSurge", "25%"), replicas, round_up=True)
    unavailable = workloads.scaled(rolling.get("maxUnavailable", "25%"), replicas, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, min(unavailable, replicas)


class DeploymentController:
    """Rolls Deployments out through their ReplicaSets and keeps their status."""

    def __init__(self, store: Store, timers: Timers, recorder: Callable[[str], EventRecorder]) -> None:
        self._store = store
        self._timers = timers
        self._events = recorder("deployment-controller")
        self._queue = WorkQueue(self.sync_one)
        self.informers = [
            Informer(store, DEPLOYMENTS, self._queue.own, self.sync),
            Informer(store, RS, self._queue.owned_by("Deployment"), self.sync),
        ]

    def sync(self) -> None:
        self._queue.sync()

    def close(self) -> None:
        for informer in self.informers:
            informer.close()

    # ---------------------------------------------------------------- one Deployment

    def _sets(self, deployment: dict[str, Any]) -> list[dict[str, Any]]:
        meta = deployment["metadata"]
        selector = selector_from_label_selector_object((deployment.get("spec") or {}).get("selector") or {})
        entries, _ = self._store.list_entries(RS, meta["namespace"], label_selector=selector)
        owned = [rs for rs in (e.load() for e in entries) if workloads.controlled_by(rs, meta["uid"])]
        owned.sort(key=lambda rs: (_revision(rs), rs["metadata"].get("creationTimestamp") or ""))
        return owned

    def sync_one(self, namespace: str, name: str) -> None:
        try:
            deployment = self._store.get(DEPLOYMENTS, name, namespace)
        except ApiError:
            return
        if workloads.terminating(deployment):
            return
        spec = deployment.get("spec") or {}
        sets = self._sets(deployment)
        template = spec.get("template") or {}
        new = next(
            (rs for rs in sets if workloads.same_template(rs["spec"].get("template") or {}, template)), None
        )
        manage = not workloads.fleet_managed(deployment) and not spec.get("paused")
        created = False
        if manage:
            if new is None:
                new = self._create_set(deployment, sets)
                created = True
                sets = [*sets, new]
            old = [rs for rs in sets if rs is not new]
            if (spec.get("strategy") or {}).get("type") == "Recreate":
                self._recreate(deployment, new, old)
            else:
                self._roll(deployment, new, old)
            self._clean_up(deployment, [rs for rs in sets if rs is not new])
            sets = self._sets(deployment)
            new = next(
                (rs for rs in sets if workloads.same_template(rs["spec"].get("template") or {}, template)),
                None,
            )
        self._write_status(deployment, sets, new, created)

    def _create_set(self, deployment: dict[str, Any], sets: list[dict[str, Any]]) -> dict[str, Any]:
        meta = deployment["metadata"]
        spec = deployment.get("spec") or {}
        pod_hash = workloads.template_hash(spec.get("template") or {})
        template = copy.deepcopy(spec.get("template") or {})
        tmeta = template.setdefault("metadata", {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), workloads.POD_TEMPLATE_HASH: pod_hash}
        selector = copy.deepcopy(spec.get("selector") or {})
        selector["matchLabels"] = {
            **(selector.get("matchLabels") or {}),
            workloads.POD_TEMPLATE_HASH: pod_hash,
        }
        surge, _ = surge_and_unavailable(deployment)
        replicas = _replicas(deployment)
        live_old = sum(_replicas(rs) for rs in sets)
        if live_old == 0:
            start = replicas
        elif (spec.get("strategy") or {}).get("type") == "Recreate":
            start = 0
        else:
            start = max(0, min(replicas, replicas + surge - live_old))
        revision = max((_revision(rs) for rs in sets), default=0) + 1
        body = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{meta['name']}-{pod_hash}",
                "namespace": meta["namespace"],
                "labels": dict(tmeta["labels"]),
                "annotations": {REVISION: str(revision), DESIRED: str(replicas), MAX: str(replicas + surge)},
                "ownerReferences": [workloads.owner_reference(deployment)],
            },
            "spec": {
                "replicas": start,
                "minReadySeconds": int(spec.get("minReadySeconds") or 0),
                "selector": selector,
                "template": template,
            },
        }
        rs = self._store.create(RS, body, namespace=meta["namespace"], validate=False)
        if start > 0:
            self._scaled_event(deployment, rs, 0, start)
        return rs

    def _scale(self, deployment: dict[str, Any], rs: dict[str, Any], to: int) -> None:
        before = _replicas(rs)
        if before == to:
            return
        replicas = _replicas(deployment)
        surge, _ = surge_and_unavailable(deployment)

        def apply(obj: dict[str, Any]) -> None:
            obj["spec"]["replicas"] = to
            annotations = obj["metadata"].setdefault("annotations", {})
            annotations[DESIRED] = str(replicas)
            annotations[MAX] = str(replicas + surge)

        rs.update(self._store.mutate(RS, rs["metadata"]["name"], rs["metadata"]["namespace"], apply))
        self._scaled_event(deployment, rs, before, to)

    def _scaled_event(self, deployment: dict[str, Any], rs: dict[str, Any], before: int, to: int) -> None:
        direction = "up" if to > before else "down"
        self._events.emit(
            deployment,
            NORMAL,
            "ScalingReplicaSet",
            f"Scaled {direction} replica set {rs['metadata']['name']} from {before} to {to}",
        )

    def _recreate(self, deployment: dict[str, Any], new: dict[str, Any], old: list[dict[str, Any]]) -> None:
        for rs in old:
            self._scale(deployment, rs, 0)
        if all(_status(rs, "replicas") == 0 for rs in old):
            self._scale(deployment, new, _replicas(deployment))

    def _roll(self, deployment: dict[str, Any], new: dict[str, Any], old: list[dict[str, Any]]) -> None:
        replicas = _replicas(deployment)
        live_old = [rs for rs in old if _replicas(rs) > 0]
        if not live_old:
            self._scale(deployment, new, replicas)  # nothing to roll from: plain scaling
            return
        surge, unavailable = surge_and_unavailable(deployment)
        total = _replicas(new) + sum(_replicas(rs) for rs in live_old)
        if _replicas(new) < replicas:
            up = min(replicas + surge - total, replicas - _replicas(new))
            if up > 0:
                self._scale(deployment, new, _replicas(new) + up)
                total += up
        min_available = replicas - unavailable
        new_unavailable = max(0, _replicas(new) - _status(new, "availableReplicas"))
        # First the old sets' unavailable pods: removing them costs no availability.
        budget = total - min_available - new_unavailable
        for rs in live_old:
            if budget <= 0:
                break
            unhealthy = max(0, _replicas(rs) - _status(rs, "availableReplicas"))
            cut = min(unhealthy, budget)
            if cut > 0:
                self._scale(deployment, rs, _replicas(rs) - cut)
                budget -= cut
        available = _status(new, "availableReplicas") + sum(
            min(_status(rs, "availableReplicas"), _replicas(rs)) for rs in live_old
        )
        can_remove = available - min_available
        for rs in live_old:
            if can_remove <= 0:
                break
            cut = min(_replicas(rs), can_remove)
            if cut > 0:
                self._scale(deployment, rs, _replicas(rs) - cut)
                can_remove -= cut

    def _clean_up(self, deployment: dict[str, Any], old: list[dict[str, Any]]) -> None:
        limit = int((deployment.get("spec") or {}).get("revisionHistoryLimit", 10))
        empty = [rs for rs in old if _replicas(rs) == 0 and _status(rs, "replicas") == 0]
        for rs in empty[: max(0, len(empty) - limit)]:
            try:
                self._store.delete(RS, rs["metadata"]["name"], rs["metadata"]["namespace"])
            except ApiError as exc:
                if exc.code != 404:
                    raise

    def _write_status(
        self,
        deployment: dict[str, Any],
        sets: list[dict[str, Any]],
        new: dict[str, Any] | None,
        created: bool,
    ) -> None:
        replicas = _replicas(deployment)
        wanted = sum(_replicas(rs) for rs in sets)
        available = sum(_status(rs, "availableReplicas") for rs in sets)
        updated = _status(new, "replicas") if new is not None else 0
        status: dict[str, Any] = {
            "observedGeneration": int(deployment["metadata"].get("generation") or 1),
            "replicas": sum(_status(rs, "replicas") for rs in sets),
            "updatedReplicas": updated,
            "readyReplicas": sum(_status(rs, "readyReplicas") for rs in sets),
            "availableReplicas": available,
            "unavailableReplicas": max(0, wanted - available),
        }
        for field in (
            "replicas",
            "updatedReplicas",
            "readyReplicas",
            "availableReplicas",
            "unavailableReplicas",
        ):
            if status[field] == 0:
                status.pop(field)  # omitempty
        old = deployment.get("status") or {}
        now = format_timestamp(self._timers.wall())
        _, unavailable = surge_and_unavailable(deployment)
        if available >= replicas - unavailable:
            avail = ("True", "MinimumReplicasAvailable", "Deployment has minimum availability.")
        else:
            avail = ("False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.")
        conditions = [_condition(old, "Available", avail, now)]
        if new is not None:
            rs_name = new["metadata"]["name"]
            complete = (
                updated == replicas
                and _status(new, "availableReplicas") >= replicas
                and all(_status(rs, "replicas") == 0 for rs in sets if rs is not new)
            )
            if complete:
                progressing = (
                    "True",
                    "NewReplicaSetAvailable",
                    f'ReplicaSet "{rs_name}" has successfully progressed.',
                )
            elif created:
                progressing = ("True", "NewReplicaSetCreated", f'Created new replica set "{rs_name}"')
            else:
                progressing = ("True", "ReplicaSetUpdated", f'ReplicaSet "{rs_name}" is progressing.')
            conditions.append(_condition(old, "Progressing", progressing, now))
        status["conditions"] = conditions
        if status == old:
            return

        def apply(obj: dict[str, Any]) -> None:
            obj["status"] = status

        meta = deployment["metadata"]
        self._store.mutate(DEPLOYMENTS, meta["name"], meta["namespace"], apply, subresource="status")


def _condition(old: dict[str, Any], ctype: str, value: tuple[str, str, str], now: str) -> dict[str, Any]:
    state, reason, message = value
    previous = next(
        (c for c in old.get("conditions") or () if isinstance(c, dict) and c.get("type") == ctype), None
    )
    if (
        previous is not None
        and (previous.get("status"), previous.get("reason"), previous.get("message")) == value
    ):
        return dict(previous)
    since = now
    if previous is not None and previous.get("status") == state and previous.get("lastTransitionTime"):
        since = previous["lastTransitionTime"]
    return {
        "type": ctype,
        "status": state,
        "lastUpdateTime": now,
        "lastTransitionTime": since,
        "reason": reason,
        "message": message,
    }
