"""What the demo sees, turned into journal entries: one pure translator, fed by the pipeline.

Pure: no I/O, no clock. The pipeline (`demo.pipeline`) hands every observation here with the
scenario time it was seen at: the simulator's fleet events, each object change its watches on
the simulated apiserver report (records, rules, nodes, Jobs, Events, pods, the leader Lease, the
breaker's ConfigMap), each eviction the apiserver served, the alerts Prometheus fires, the
deliveries Alertmanager makes and the processes the pipeline starts and kills. `Observer`
diffs each object against the last version it saw and appends what changed to the journal
(`demo.journal`; the kinds' docstrings say what each entry holds). It journals the fleet's
events, the pipeline's doings, alerts, deliveries, the leader and the breaker itself, and hands
each object to the watch that owns its kind: quarantine records and check Jobs
(`demo.observer_records`), rules and nodes (`demo.observer_enforcement`), pods, claims and the
responder's Events (`demo.observer_pods`), all naming devices through `demo.observer_names`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from demo.journal import Journal, Kind
from demo.observer_enforcement import EnforcementWatch
from demo.observer_names import DELETED, DeviceNames, meta
from demo.observer_pods import PodWatch
from demo.observer_records import RecordWatch
from simulator.fleet.events import DeviceHealthChanged, FaultApplied, FleetEvent, GpuReset, NodeChanged

QUARANTINES = "devicequarantines.gpuhealth.io"
RULES = "devicetaintrules.resource.k8s.io"
NODES = "nodes"
JOBS = "jobs.batch"
EVENTS = "events"
PODS = "pods"
LEASES = "leases.coordination.k8s.io"
CONFIG_MAPS = "configmaps"
CLAIMS = "resourceclaims.resource.k8s.io"
WATCHED = (QUARANTINES, RULES, NODES, JOBS, EVENTS, PODS, LEASES, CONFIG_MAPS, CLAIMS)
"""Resources the pipeline watches for the observer."""

LEADER_LEASE = "gpuhealth-responder"
BREAKER_CONFIG_MAP = "gpuhealth-breaker"


class Observer:
    """Appends to `journal` what each observation changed."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.names = DeviceNames(journal)
        self.pods = PodWatch(self.names)
        self.records = RecordWatch(self.names, self.pods)
        self.enforcement = EnforcementWatch(self.names)
        self._handlers: dict[str, Callable[[float, str, Mapping[str, Any]], None]] = {
            QUARANTINES: self.records.record,
            RULES: self.enforcement.rule,
            NODES: self.enforcement.node,
            JOBS: self.records.job,
            EVENTS: self.pods.event,
            LEASES: self._lease,
            CONFIG_MAPS: self._config_map,
            CLAIMS: self.pods.claim,
        }
        self.leader = ""
        """holderIdentity of the responders' leader Lease as last seen."""
        self._breaker_tripped = False
        self.firing: dict[tuple[str, str, str], dict[str, str]] = {}

    # ----- the simulator ---------------------------------------------------------------------------

    def fleet_event(self, event: FleetEvent, at: float) -> None:
        j = self.journal
        if isinstance(event, FaultApplied) and event.fault.is_action:
            # A person's doing (kubectl scale, delete pods), not a fault: a line of the story.
            j.record(at, Kind.NOTE, f"a person: {event.fault.describe()}", event.fault.node or "")
        elif isinstance(event, FaultApplied):
            fault = event.fault
            node = fault.device.node if fault.device is not None else (fault.node or "")
            device = self.names.on_node(node, f"gpu-{fault.device.gpu}") if fault.device is not None else ""
            detail = {"message": fault.describe()}
            if fault.xid is not None:
                detail["xid"] = str(fault.xid)
            if fault.duration is not None:
                detail["duration"] = f"{fault.duration:g}"
            j.record(at, Kind.FAULT, fault.kind, node, device, **detail)
        elif isinstance(event, DeviceHealthChanged):
            device = self.names.on_node(event.node, event.device)
            j.record(
                at, Kind.HEALTH, event.new, event.node, device, old=event.old, message=event.message or ""
            )
        elif isinstance(event, NodeChanged):
            j.record(at, Kind.NOTE, event.what, event.node)
        elif isinstance(event, GpuReset):
            for uuid in event.uuids:
                j.record(
                    at, Kind.RESET, event.what, event.node, uuid, request=event.request, reason=event.reason
                )

    def evicted(self, at: float, pod: str, node: str, devices: Iterable[str], job: str) -> None:
        """The apiserver served an eviction of `pod` (namespace/name) running on `devices`."""
        self.pods.evicted(at, pod, node, devices, job)

    # ----- the pipeline's own doings -----------------------------------------------------------------

    # ----- the pipeline's own doings -----------------------------------------------------------------

    def process(self, at: float, what: str, name: str, role: str = "") -> None:
        detail = {"name": name}
        if role:
            detail["role"] = role
        self.journal.record(at, Kind.PROCESS, what, **detail)

    def alerts(self, at: float, firing: Iterable[Mapping[str, Any]]) -> None:
        """Prometheus' firing alerts now: ALERT_FIRING for new ones, ALERT_RESOLVED for gone ones."""
        current: dict[tuple[str, str, str], dict[str, str]] = {}
        for alert in firing:
            labels = {str(k): str(v) for k, v in (alert.get("labels") or {}).items()}
            current[
                (
                    labels.get("alertname", ""),
                    labels.get("node", ""),
                    labels.get("uuid") or labels.get("device", ""),
                )
            ] = labels
        for key in current.keys() - self.firing.keys():
            labels = current[key]
            self.journal.record(
                at,
                Kind.ALERT_FIRING,
                key[0],
                key[1],
                self.names.of_labels(labels),
                action=labels.get("action", ""),
                severity=labels.get("severity", ""),
            )
        for key in self.firing.keys() - current.keys():
            self.journal.record(
                at, Kind.ALERT_RESOLVED, key[0], key[1], self.names.of_labels(self.firing[key])
            )
        self.firing = current

    def delivery(self, at: float, receiver: str, body: Any, *, via: str = "") -> None:
        """One webhook notification (an Alertmanager body) as `receiver` got it."""
        alerts = body.get("alerts") if isinstance(body, Mapping) else None
        for alert in alerts if isinstance(alerts, list) else ():
            labels = alert.get("labels") if isinstance(alert, Mapping) else None
            if not isinstance(labels, Mapping):
                continue
            labels = {str(k): str(v) for k, v in labels.items()}
            detail = {
                "alertname": labels.get("alertname", ""),
                "status": str(alert.get("status", "")),
                "action": labels.get("action", ""),
                "fingerprint": str(alert.get("fingerprint", "")),
            }
            if via:
                detail["via"] = via
            self.journal.record(
                at, Kind.DELIVERY, receiver, labels.get("node", ""), self.names.of_labels(labels), **detail
            )

    def refused_by_command(self, at: float, record: str, device: str, actor: str, message: str) -> None:
        """The release command refused a request before writing it (what the record showed)."""
        self.records.refused_by_command(at, record, device, actor, message)

    def record_of(self, device: str) -> str:
        """The name of the latest active record seen for `device` ('' when none)."""
        return self.records.record_of(device)

    # ----- object changes --------------------------------------------------------------------------

    def change(
        self, at: float, resource: str, etype: str, obj: Mapping[str, Any], devices: Iterable[str] = ()
    ) -> None:
        """One watch event; `devices` (pods only): the uuids the simulated kubelet gave the pod."""
        if resource == PODS:
            self.pods.pod(at, etype, obj, tuple(devices))
        elif (handler := self._handlers.get(resource)) is not None:
            handler(at, etype, obj)

    def _lease(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        if meta(obj).get("name") != LEADER_LEASE:
            return
        holder = "" if etype == DELETED else str((obj.get("spec") or {}).get("holderIdentity") or "")
        if holder != self.leader:
            self.journal.record(at, Kind.NOTE, "leader", holder=holder, previous=self.leader)
            self.leader = holder

    def _config_map(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        if meta(obj).get("name") != BREAKER_CONFIG_MAP or etype == DELETED:
            return
        data = obj.get("data") or {}
        try:
            state = json.loads(data.get("state") or "{}")
            history = json.loads(data.get("history") or "[]")
        except ValueError:
            state, history = {"tripped": True, "trigger": "unreadable"}, []
        tripped = bool(state.get("tripped"))
        if tripped == self._breaker_tripped:
            return
        self._breaker_tripped = tripped
        last = (
            history[-1] if isinstance(history, list) and history and isinstance(history[-1], Mapping) else {}
        )
        self.journal.record(
            at,
            Kind.BREAKER,
            "tripped" if tripped else "reset",
            trigger=str(state.get("trigger") or ""),
            actor=str(last.get("actor", "")),
            detail=str(state.get("detail") or ""),
        )
