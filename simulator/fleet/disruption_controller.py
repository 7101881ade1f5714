"""The disruption controller: keeps every PodDisruptionBudget's status true.

After any change to a budget, to a pod its selector matches, or to the scale of a workload in
its namespace, the budget's status is recomputed by the same pure function the eviction
subresource uses (`simulator/apiserver/disruption.py`): currentHealthy, desiredHealthy,
expectedPods (from the pods' controllers' scale), disruptionsAllowed, disruptedPods (an entry
expires two minutes after its eviction: a timer resyncs the budget then), observedGeneration
and the DisruptionAllowed condition (SufficientPods / InsufficientPods / SyncFailed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuhealth.kube.meta import parse_rfc3339
from simulator.apiserver import disruption
from simulator.apiserver.errors import ApiError
from simulator.apiserver.selectors import LabelSelector, selector_from_label_selector_object
from simulator.apiserver.store import format_timestamp
from simulator.fleet.informer import Informer
from simulator.fleet.timers import Timers

if TYPE_CHECKING:
    from simulator.apiserver.store import Entry, Store

PDBS = "poddisruptionbudgets.policy"
_SCALES = ("replicasets.apps", "deployments.apps", "statefulsets.apps", "replicationcontrollers")


class DisruptionController:
    """Recomputes PodDisruptionBudget status when budgets, their pods or their workloads change."""

    def __init__(self, store: Store, timers: Timers) -> None:
        self._store = store
        self._timers = timers
        self._selectors: dict[str, dict[str, LabelSelector | None]] = {}
        """Namespace -> budget name -> selector (None selects nothing)."""
        self._dirty: set[tuple[str, str]] = set()
        self._signatures: dict[tuple[str, str], tuple[bool, bool, str, str]] = {}
        """Covered pods -> what their budget counts of them, as last seen."""
        self._expiring: set[tuple[str, str]] = set()
        self.informers = [
            Informer(store, PDBS, self._pdb_event, self.sync),
            Informer(store, "pods", self._pod_event, self.sync),
            *(Informer(store, r, self._scale_event, self.sync) for r in _SCALES),
        ]

    def close(self) -> None:
        for informer in self.informers:
            informer.close()

    def _pdb_event(self, etype: str, entry: Entry) -> None:
        budgets = self._selectors.setdefault(entry.namespace, {})
        if etype == "DELETED":
            budgets.pop(entry.name, None)
            return
        raw = (entry.load().get("spec") or {}).get("selector")
        try:
            budgets[entry.name] = None if raw is None else selector_from_label_selector_object(raw)
        except ApiError:
            budgets[entry.name] = None
        self._dirty.add((entry.namespace, entry.name))

    def _pod_event(self, etype: str, entry: Entry) -> None:
        budgets = self._selectors.get(entry.namespace)
        if not budgets:
            return  # most pods: no budget in their namespace, nothing parsed
        matched = [
            name
            for name, selector in budgets.items()
            if selector is not None and selector.matches(entry.labels or {})
        ]
        key = (entry.namespace, entry.name)
        if not matched:
            if self._signatures.pop(key, None) is not None:  # relabelled out of a selection
                self._dirty.update((entry.namespace, name) for name in budgets)
            return
        if etype == "DELETED":
            self._signatures.pop(key, None)
        else:
            # Only what the budget counts; a kubelet status sync that changes nothing of it
            # (device health, say) costs no recount of every pod the budget covers.
            pod = entry.load()
            ref = disruption.controller_ref(pod) or {}
            signature = (
                disruption.pod_is_ready(pod),
                bool(pod["metadata"].get("deletionTimestamp")),
                str((pod.get("status") or {}).get("phase")),
                str(ref.get("uid")),
            )
            if self._signatures.get(key) == signature:
                return
            self._signatures[key] = signature
        self._dirty.update((entry.namespace, name) for name in matched)

    def _scale_event(self, _etype: str, entry: Entry) -> None:
        for name in self._selectors.get(entry.namespace, {}):
            self._dirty.add((entry.namespace, name))

    def sync(self) -> None:
        while self._dirty:
            namespace, name = self._dirty.pop()
            self.sync_one(namespace, name)

    def sync_one(self, namespace: str, name: str) -> None:
        try:
            pdb = self._store.get(PDBS, name, namespace)
        except ApiError:
            return
        selector = self._selectors.get(namespace, {}).get(name)
        pods: list[dict[str, Any]] = []
        if selector is not None:
            entries, _ = self._store.list_entries("pods", namespace, label_selector=selector)
            pods = [e.load() for e in entries]
        now = self._timers.wall()
        status = disruption.compute_status(pdb, pods, self._get, now, format_timestamp)
        if status != (pdb.get("status") or {}):

            def apply(obj: dict[str, Any]) -> None:
                obj["status"] = status

            self._store.mutate(PDBS, name, namespace, apply, subresource="status")
        stamps = [parse_rfc3339(str(t)) for t in (status.get("disruptedPods") or {}).values()]
        due = [t + disruption.DELETION_TIMEOUT_SECONDS for t in stamps if t is not None]
        key = (namespace, name)
        if due and key not in self._expiring:
            self._expiring.add(key)
            wait = max(0.0, min(due) - now) * self._timers.speed
            self._timers.at(self._timers.now() + wait + 1e-3, self._expire, key)

    def _expire(self, key: tuple[str, str]) -> None:
        self._expiring.discard(key)
        self._dirty.add(key)
        self.sync()

    def _get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._store.get(resource, name, namespace)
        except ApiError:
            return None
