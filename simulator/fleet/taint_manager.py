"""Taint-based eviction: the taint eviction controller (node taints) and the device taint eviction
controller (DRA devices), both deleting pods that do not tolerate a NoExecute taint.

- Node taints: a pod bound to a node with a NoExecute taint it does not tolerate is deleted at
  once; one whose tolerations bound the time (`tolerationSeconds`) is deleted when the shortest
  bound has passed since the taint was seen (in simulated seconds), unless the taint went
  meanwhile. Event `TaintManagerEviction` "Marking for deletion Pod <ns>/<name>".
- Device taints: a pod whose allocated ResourceClaim holds a device with a NoExecute taint (from
  its ResourceSlice, or from a DeviceTaintRule whose `deviceSelector` driver/pool/device matches)
  that the claim's request does not tolerate is deleted; `tolerationSeconds` counts from the
  taint's `timeAdded`. Event `DeviceTaintManagerEviction` "Marking for deletion".
- DeviceTaintRule `status.conditions`: `EvictionInProgress`, True with `PodsPendingEviction`
  while pods wait, else `Completed`/`NotStarted` (NoExecute), `NoEffect` with the preview of what
  NoExecute would do, written once per generation (effect None), `OtherEffect` (NoSchedule); the
  message counts pending pods and namespaces and the pods evicted since the controller started,
  worded as the real controller words them.

Not done: DeviceTaintRule `deviceSelector.deviceClassName` and CEL `selectors` (a rule naming
them selects nothing here), tolerations of `firstAvailable` subrequests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet import workloads
from simulator.fleet.events_recorder import NORMAL, EventRecorder
from simulator.fleet.informer import Informer
from simulator.fleet.timers import Timers
from simulator.fleet.tolerations import toleration_seconds

if TYPE_CHECKING:
    from collections.abc import Callable

    from simulator.apiserver.store import Entry, Store

RULES = "devicetaintrules.resource.k8s.io"
CLAIMS = "resourceclaims.resource.k8s.io"
SLICES = "resourceslices.resource.k8s.io"
CONDITION = "EvictionInProgress"

Device = tuple[str, str, str]
"""(driver, pool, device)."""


def rule_matches(rule: dict[str, Any], device: Device) -> bool:
    selector = (rule.get("spec") or {}).get("deviceSelector") or {}
    if selector.get("deviceClassName") or selector.get("selectors"):
        return False  # not evaluated here (module docstring)
    driver, pool, name = device
    return all(
        selector.get(k) in (None, "", v) for k, v in (("driver", driver), ("pool", pool), ("device", name))
    )


def _plural(n: int, one: str, many: str) -> str:
    return f"1 {one}" if n == 1 else f"{n} {many}"


def rule_condition(
    rule: dict[str, Any], pending: int, namespaces: int, evicted: int, published: int, allocated: int
) -> tuple[str, str, str]:
    """(status, reason, message) of a rule's EvictionInProgress condition."""
    effect = ((rule.get("spec") or {}).get("taint") or {}).get("effect")
    message = ""
    status = "False"
    if effect == "NoExecute":
        if pending:
            status, reason = "True", "PodsPendingEviction"
            where = "1 namespace." if namespaces == 1 else f"{namespaces} different namespaces."
            message = f"{_plural(pending, 'pod needs', 'pods need')} to be evicted in {where}"
        else:
            reason = "Completed" if evicted else "NotStarted"
    elif effect == "None":
        reason = "NoEffect"
        where = "1 namespace" if namespaces == 1 else f"{namespaces} different namespaces"
        message = (
            f"{_plural(published, 'published device', 'published devices')} selected. "
            f"{_plural(allocated, 'allocated device', 'allocated devices')} selected. "
            f"{_plural(pending, 'pod', 'pods')} would be evicted in {where} if the effect was NoExecute. "
            "This information will not be updated again. Recreate the DeviceTaintRule to trigger an update."
        )
    else:
        reason, message = "OtherEffect", "Eviction only happens for the NoExecute effect."
    if evicted:
        message = (
            message + " " if message else ""
        ) + f"{_plural(evicted, 'pod', 'pods')} evicted since starting the controller."
    return status, reason, message


class TaintManager:
    """Deletes pods that do not tolerate NoExecute node or device taints, and reports on DeviceTaintRules."""

    def __init__(self, store: Store, timers: Timers, recorder: Callable[[str], EventRecorder]) -> None:
        self._store = store
        self._timers = timers
        self._node_events = recorder("taint-eviction-controller")
        self._device_events = recorder("device-taint-eviction-controller")
        self._node_taints: dict[str, list[dict[str, Any]]] = {}
        """Node -> its NoExecute taints, each with the simulated time it was first seen."""
        self._seen: dict[tuple[str, str, str], float] = {}
        self._slice_taints: dict[Device, list[dict[str, Any]]] = {}
        self._rules: dict[str, dict[str, Any]] = {}
        self._evicted: dict[str, int] = {}
        """Rule uid -> pods evicted for it since the controller started."""
        self._due: dict[tuple[str, str], float] = {}
        """Pods with an eviction timer, and when (simulated seconds)."""
        self._dirty_pods: set[tuple[str, str]] = set()
        self._dirty_nodes: set[str] = set()
        self._all_claim_pods = False
        self._dirty_rules = False
        self.informers = [
            Informer(store, "nodes", self._node_event, self.sync),
            Informer(store, "pods", self._pod_event, self.sync),
            Informer(store, RULES, self._rule_event, self.sync),
            Informer(store, SLICES, self._slice_event, self.sync),
        ]

    def close(self) -> None:
        for informer in self.informers:
            informer.close()

    @property
    def scheduled(self) -> dict[tuple[str, str], float]:
        """Pods waiting out a toleration: (namespace, name) -> simulated time of their deletion."""
        return dict(self._due)

    # ---------------------------------------------------------------- events

    def _node_event(self, etype: str, entry: Entry) -> None:
        if etype == "DELETED" or b"NoExecute" not in entry.data:
            if self._node_taints.pop(entry.name, None) is not None:
                self._dirty_nodes.add(entry.name)
                self._forget_seen(entry.name, [])
            return
        taints = [
            t for t in (entry.load().get("spec") or {}).get("taints") or () if t.get("effect") == "NoExecute"
        ]
        if taints != self._node_taints.get(entry.name):
            now = self._timers.now()
            for t in taints:
                self._seen.setdefault((entry.name, str(t.get("key")), str(t.get("value") or "")), now)
            self._node_taints[entry.name] = taints
            self._forget_seen(entry.name, taints)
            self._dirty_nodes.add(entry.name)

    def _forget_seen(self, node: str, kept: list[dict[str, Any]]) -> None:
        """A taint that went starts its toleration time afresh when it comes back."""
        keep = {(node, str(t.get("key")), str(t.get("value") or "")) for t in kept}
        for key in [k for k in self._seen if k[0] == node and k not in keep]:
            del self._seen[key]

    def _pod_event(self, etype: str, entry: Entry) -> None:
        if etype == "DELETED":
            self._due.pop((entry.namespace, entry.name), None)
            self._dirty_rules = self._dirty_rules or bool(self._rules)
            return
        node = (entry.fields or {}).get("spec.nodeName")
        on_tainted_node = bool(node) and node in self._node_taints
        may_use_tainted_device = bool(self._rules or self._slice_taints) and b'"resourceClaims"' in entry.data
        if on_tainted_node or may_use_tainted_device:
            self._dirty_pods.add((entry.namespace, entry.name))

    def _rule_event(self, etype: str, entry: Entry) -> None:
        if etype == "DELETED":
            self._rules.pop(entry.name, None)
        else:
            rule = entry.load()
            old = self._rules.get(entry.name)
            self._rules[entry.name] = rule
            if old is not None and old.get("spec") == rule.get("spec"):
                return  # a status write (ours): nothing to re-evaluate
        self._all_claim_pods = True
        self._dirty_rules = True

    def _slice_event(self, etype: str, entry: Entry) -> None:
        if b"NoExecute" not in entry.data and not self._slice_taints:
            return
        obj = entry.load()
        spec = obj.get("spec") or {}
        driver, pool = str(spec.get("driver")), str((spec.get("pool") or {}).get("name"))
        for device in spec.get("devices") or ():
            key = (driver, pool, str(device.get("name")))
            taints = [t for t in device.get("taints") or () if t.get("effect") == "NoExecute"]
            if etype != "DELETED" and taints:
                if self._slice_taints.get(key) != taints:
                    self._slice_taints[key] = taints
                    self._all_claim_pods = True
            elif self._slice_taints.pop(key, None) is not None:
                self._all_claim_pods = True

    # ---------------------------------------------------------------- decisions

    def sync(self) -> None:
        for node in list(self._dirty_nodes):
            self._dirty_nodes.discard(node)
            entries, _ = self._store.list_entries("pods", field_selector=f"spec.nodeName={node}")
            self._dirty_pods.update((e.namespace, e.name) for e in entries)
        if self._all_claim_pods:
            self._all_claim_pods = False
            for claim in self._allocated_claims():
                for ref in (claim.get("status") or {}).get("reservedFor") or ():
                    if ref.get("resource") == "pods":
                        self._dirty_pods.add((claim["metadata"]["namespace"], str(ref.get("name"))))
        while self._dirty_pods:
            self._evaluate(*self._dirty_pods.pop())
        if self._dirty_rules:
            self._dirty_rules = False
            self._write_rule_status()

    def _allocated_claims(self) -> list[dict[str, Any]]:
        entries, _ = self._store.list_entries(CLAIMS)
        return [c for c in (e.load() for e in entries if b'"allocation"' in e.data)]

    def _evaluate(self, namespace: str, name: str) -> None:
        """Delete the pod now, schedule its deletion, or cancel a scheduled one."""
        key = (namespace, name)
        try:
            pod = self._store.get("pods", name, namespace)
        except ApiError:
            self._due.pop(key, None)
            return
        verdict = self._verdict(pod)
        if verdict is None:
            self._due.pop(key, None)
            return
        due, kind, _rules = verdict
        if due <= self._timers.now() + 1e-9:
            self._evict(pod, kind, _rules)
        elif self._due.get(key) != due:
            self._due[key] = due
            self._timers.at(due, self._fire, key, due)

    def _fire(self, key: tuple[str, str], due: float) -> None:
        if self._due.get(key) == due:
            self._dirty_pods.add(key)
            self.sync()

    def _verdict(self, pod: dict[str, Any]) -> tuple[float, str, list[str]] | None:
        """(simulated time of deletion, "node" or "device", rule uids) or None when it may stay."""
        if not workloads.is_active(pod):
            return None
        now = self._timers.now()
        best: tuple[float, str, list[str]] | None = None
        node = (pod.get("spec") or {}).get("nodeName")
        taints = self._node_taints.get(node or "")
        if taints:
            bound = toleration_seconds(list((pod.get("spec") or {}).get("tolerations") or ()), taints)
            if bound is not None:
                seen = min(
                    self._seen.get((str(node), str(t.get("key")), str(t.get("value") or "")), now)
                    for t in taints
                )
                best = (seen + bound, "node", [])
        for due, rules in self._device_verdicts(pod):
            if best is None or due < best[0]:
                best = (due, "device", rules)
        return best

    def _device_taints(self, device: Device) -> list[tuple[dict[str, Any], str | None]]:
        """NoExecute taints on `device`, each with the uid of the rule that put it there (None: the slice)."""
        out: list[tuple[dict[str, Any], str | None]] = [(t, None) for t in self._slice_taints.get(device, ())]
        for rule in self._rules.values():
            taint = (rule.get("spec") or {}).get("taint") or {}
            if taint.get("effect") == "NoExecute" and rule_matches(rule, device):
                out.append((taint, str(rule["metadata"].get("uid"))))
        return out

    def _pod_claims(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        names: list[str] = []
        statuses = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        }
        for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
            name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
            if name:
                names.append(str(name))
        claims = []
        for name in names:
            try:
                claims.append(self._store.get(CLAIMS, name, pod["metadata"]["namespace"]))
            except ApiError:
                continue
        return claims

    def _device_verdicts(self, pod: dict[str, Any]) -> list[tuple[float, list[str]]]:
        if not (self._rules or self._slice_taints) or not (pod.get("spec") or {}).get("resourceClaims"):
            return []
        out = []
        wall_now, now = self._timers.wall(), self._timers.now()
        for claim in self._pod_claims(pod):
            requests = {
                r.get("name"): ((r.get("exactly") or {}).get("tolerations") or [])
                for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ()
            }
            allocation = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
            for result in allocation.get("results") or ():
                device = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
                tainted = self._device_taints(device)
                if not tainted:
                    continue
                tolerations = list(requests.get(str(result.get("request")).split("/")[0], []))
                for taint, rule_uid in tainted:
                    bound = toleration_seconds(tolerations, [taint])
                    if bound is None:
                        continue
                    added = workloads.parse_time(str(taint.get("timeAdded") or "")) or wall_now
                    due = now + (added + bound - wall_now) * self._timers.speed
                    out.append((due, [rule_uid] if rule_uid else []))
        return out

    def _evict(self, pod: dict[str, Any], kind: str, rules: list[str]) -> None:
        meta = pod["metadata"]
        self._due.pop((meta["namespace"], meta["name"]), None)
        try:
            self._store.delete("pods", meta["name"], meta["namespace"])
        except ApiError as exc:
            if exc.code != 404:
                raise
            return
        if kind == "node":
            self._node_events.emit(
                pod,
                NORMAL,
                "TaintManagerEviction",
                f"Marking for deletion Pod {meta['namespace']}/{meta['name']}",
            )
        else:
            self._device_events.emit(pod, NORMAL, "DeviceTaintManagerEviction", "Marking for deletion")
            for uid in rules:
                self._evicted[uid] = self._evicted.get(uid, 0) + 1
            self._dirty_rules = self._dirty_rules or bool(rules)

    # ---------------------------------------------------------------- DeviceTaintRule status

    def _write_rule_status(self) -> None:
        if not self._rules:
            return
        claims = self._allocated_claims()
        slices, _ = self._store.list_entries(SLICES)
        published: list[Device] = []
        for entry in slices:
            spec = entry.load().get("spec") or {}
            pool = str((spec.get("pool") or {}).get("name"))
            published.extend(
                (str(spec.get("driver")), pool, str(d.get("name"))) for d in spec.get("devices") or ()
            )
        for name, rule in list(self._rules.items()):
            try:
                self._rule_status(name, rule, claims, published)
            except ApiError as exc:
                if exc.code != 404:
                    raise

    def _rule_status(
        self, name: str, rule: dict[str, Any], claims: list[dict[str, Any]], published: list[Device]
    ) -> None:
        uid = str(rule["metadata"].get("uid"))
        generation = int(rule["metadata"].get("generation") or 1)
        taint = (rule.get("spec") or {}).get("taint") or {}
        old = next(
            (c for c in (rule.get("status") or {}).get("conditions") or () if c.get("type") == CONDITION),
            None,
        )
        if taint.get("effect") == "None" and old is not None and old.get("observedGeneration") == generation:
            return  # the preview is written once per change of the spec
        pending: set[tuple[str, str]] = set()
        allocated = 0
        for claim in claims:
            requests = {
                r.get("name"): ((r.get("exactly") or {}).get("tolerations") or [])
                for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ()
            }
            results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            ) or ()
            for result in results:
                device = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
                if not rule_matches(rule, device):
                    continue
                allocated += 1
                # Would the taint, as NoExecute, evict the claim's pods?
                as_noexecute = {**taint, "effect": "NoExecute"}
                if (
                    toleration_seconds(
                        list(requests.get(str(result.get("request")).split("/")[0], [])), [as_noexecute]
                    )
                    is None
                ):
                    continue
                for ref in (claim.get("status") or {}).get("reservedFor") or ():
                    if ref.get("resource") == "pods":
                        pending.add((claim["metadata"]["namespace"], str(ref.get("name"))))
        pending = {p for p in pending if self._pod_alive(*p)}
        state, reason, message = rule_condition(
            rule,
            len(pending),
            len({ns for ns, _ in pending}),
            self._evicted.get(uid, 0),
            sum(1 for d in published if rule_matches(rule, d)),
            allocated,
        )
        condition = {
            "type": CONDITION,
            "status": state,
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": format_timestamp(self._timers.wall()),
        }
        if old is not None and all(
            old.get(k) == condition[k] for k in ("status", "reason", "message", "observedGeneration")
        ):
            return

        def apply(obj: dict[str, Any]) -> None:
            others = [
                c for c in (obj.get("status") or {}).get("conditions") or () if c.get("type") != CONDITION
            ]
            obj["status"] = {**(obj.get("status") or {}), "conditions": [*others, condition]}

        self._store.mutate(RULES, name, None, apply, subresource="status")

    def _pod_alive(self, namespace: str, name: str) -> bool:
        try:
            pod = self._store.get("pods", name, namespace)
        except ApiError:
            return False
        return workloads.is_active(pod)


class UnschedulableTainter:
    """The node lifecycle controller's NoSchedule tainting pass for cordoned nodes.

    `spec.unschedulable: true` (kubectl cordon) gets the `node.kubernetes.io/unschedulable`
    NoSchedule taint; uncordoning removes it. (The fleet's `NodeLifecycleController` is driven
    per node by Lease timers; this pass follows Node writes instead, so it is its own object.)
    """

    KEY = "node.kubernetes.io/unschedulable"

    def __init__(self, store: Store, timers: Timers) -> None:
        self._store = store
        self._timers = timers
        self._dirty: set[str] = set()
        self.informers = [Informer(store, "nodes", self._event, self.sync)]

    def close(self) -> None:
        for informer in self.informers:
            informer.close()

    def _event(self, etype: str, entry: Entry) -> None:
        if etype == "DELETED":
            return
        cordoned = (entry.fields or {}).get("spec.unschedulable") == "true"
        tainted = self.KEY.encode() in entry.data
        if cordoned != tainted:
            self._dirty.add(entry.name)

    def sync(self) -> None:
        ts = format_timestamp(self._timers.wall())
        while self._dirty:
            name = self._dirty.pop()

            def apply(obj: dict[str, Any]) -> None:
                spec = obj.setdefault("spec", {})
                taints = [t for t in spec.get("taints") or () if t.get("key") != self.KEY]
                if spec.get("unschedulable"):
                    taints.append({"key": self.KEY, "effect": "NoSchedule", "timeAdded": ts})
                if taints:
                    spec["taints"] = taints
                else:
                    spec.pop("taints", None)

            try:
                self._store.mutate("nodes", name, None, apply)
            except ApiError as exc:
                if exc.code != 404:
                    raise
