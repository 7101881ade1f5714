"""What the demo sees, turned into journal entries: one pure translator, fed by the pipeline.

Pure: no I/O, no clock. The pipeline (`demo.pipeline`) hands every observation here with the
scenario time it was seen at: the simulator's fleet events, each object change its watches on
the simulated apiserver report (records, rules, nodes, Jobs, Events, pods, the leader Lease, the
breaker's ConfigMap), each eviction the apiserver served, the alerts Prometheus fires, the
deliveries Alertmanager makes and the processes the pipeline starts and kills. `Observer`
diffs each object against the last version it saw and appends what changed to the journal
(`demo.journal`; the kinds' docstrings say what each entry holds).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from demo.journal import Journal, Kind
from responder.checks.jobs import job_result
from responder.reconcile.policy import CheckResult
from responder.reconcile.requests import CONDITION as REQUEST_CONDITION
from responder.records import MigrationOutcome, RecordError, from_object
from responder.verdicts import verdict_of
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

NODE_ANNOTATION = "gpuhealth.io/quarantined-devices"
CHECKPOINT_REQUESTED = "gpuhealth.io/checkpoint-requested"
SERVING_CONDITION = "gpuhealth.io/serving"
RAMP_ANNOTATION = "gpuhealth.io/ramping-devices"
CANARY_OPT_IN = "gpuhealth.io/canary-ok"
"""The pod label by which a workload opts in to devices on the ramp (`docs/workloads.md`)."""
QUARANTINE_TAINT = "gpuhealth.io/quarantine"
CHECK_LABEL = "gpuhealth.io/check"
HOLDER_LABEL = "gpuhealth.io/holder"
"""Label of gpuhealth's holder pods (value: the record whose card the pod holds through the
kubelet, so that no other pod is handed it): meant to be on the card, as checks are."""
RECORD_LABEL = "gpuhealth.io/record"
LEADER_LEASE = "gpuhealth-responder"
BREAKER_CONFIG_MAP = "gpuhealth-breaker"
RESPONDER_COMPONENT = "gpuhealth-responder"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
"""The NVIDIA container runtime's variable: the GPUs a container without an allocation reaches."""
DELETED = "DELETED"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _resource_ids(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The device IDs the kubelet reports for the pod's containers (`allocatedResourcesStatus`)."""
    ids: dict[str, None] = {}
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        for entry in (status.get("allocatedResourcesStatus") or ()) if isinstance(status, Mapping) else ():
            for resource in (entry.get("resources") or ()) if isinstance(entry, Mapping) else ():
                rid = resource.get("resourceID") if isinstance(resource, Mapping) else None
                if rid:
                    ids[str(rid)] = None
    return tuple(ids)


class Observer:
    """Appends to `journal` what each observation changed."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._uuid_at = {(d.node, f"gpu-{d.index}"): d.uuid for d in journal.devices.values()}
        self._card_of = {p: d.uuid for d in journal.devices.values() for p in d.partitions}
        """MIG UUID -> its card's uuid: a MIG card is named by its partitions on the device-plugin path."""
        self._records: dict[str, tuple[str, str, str, dict[tuple[str, int], str]]] = {}
        """record name -> (phase, node, uuid, finished migration outcomes by (job, episode))."""
        self._requests: dict[str, tuple[str, str, str]] = {}
        """record name -> (requestedAt of its release request, answer status, answer reason)."""
        self._recorded: set[str] = set()
        """uuids of devices any record was seen for: pods on them are journaled (POD)."""
        self._record_labels: dict[str, str] = {}
        """The record label of check Jobs (name cut to 63) -> record name."""
        self._rules: dict[str, tuple[str, str, str]] = {}
        """rule name -> (taint key meaning, node, uuid)."""
        self._annotated: dict[str, set[str]] = {}
        self._ramping: dict[str, set[str]] = {}
        """node -> devices its ramp annotation lists (device-plugin devices on the ramp)."""
        self._node_state: dict[str, tuple[bool, frozenset[str]]] = {}
        """node -> (cordoned, gpuhealth taint keys)."""
        self._checks_done: set[str] = set()
        self._events_seen: set[str] = set()
        self._pods: dict[str, tuple[str, tuple[str, ...], str, bool, str]] = {}
        """namespace/name -> (node, device uuids, job, running, check kind or '')."""
        self._check_devices: dict[str, set[str]] = {}
        """namespace/name of a check Job -> uuids its pods really reached."""
        self._evicted_jobs: set[str] = set()
        self._starts_seen: set[str] = set()
        """namespace/name/uid of every pod seen Running: a pod starts once (POD_STARTED)."""
        self._starting: dict[str, tuple[float, str, str, str]] = {}
        self._holders: dict[str, str] = {}
        """Pod key -> the record a holder pod of gpuhealth's holds the card for."""
        """namespace/name -> (seen Running at, node, holder, check) of a started pod whose devices
        the API has not named yet (a claim seen after its pod, a status written later)."""
        self._status_ids: dict[str, tuple[str, ...]] = {}
        """namespace/name -> the resource IDs its containers' `allocatedResourcesStatus` names."""
        self._claims: dict[str, tuple[str, ...]] = {}
        """namespace/name of a ResourceClaim -> the pods (namespace/name) it is reserved for."""
        self._claimed: dict[str, dict[str, tuple[str, ...]]] = {}
        """namespace/name of a pod -> claim -> its allocation's devices (`<pool>/<device>`)."""
        self._requests_seen: set[tuple[str, str]] = set()
        """(pod, key) of checkpoint requests journaled."""
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
            device = (
                self._uuid_at.get((node, f"gpu-{fault.device.gpu}"), "") if fault.device is not None else ""
            )
            detail = {"message": fault.describe()}
            if fault.xid is not None:
                detail["xid"] = str(fault.xid)
            if fault.duration is not None:
                detail["duration"] = f"{fault.duration:g}"
            j.record(at, Kind.FAULT, fault.kind, node, device, **detail)
        elif isinstance(event, DeviceHealthChanged):
            device = self._uuid_at.get((event.node, event.device), "")
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
        uuids = tuple(devices)
        if job:
            self._evicted_jobs.add(job)
        self.journal.record(
            at, Kind.EVICTION, pod, node, uuids[0] if uuids else "", job=job, devices=",".join(uuids)
        )

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
                self._device_of(labels),
                action=labels.get("action", ""),
                severity=labels.get("severity", ""),
            )
        for key in self.firing.keys() - current.keys():
            self.journal.record(at, Kind.ALERT_RESOLVED, key[0], key[1], self._device_of(self.firing[key]))
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
                at, Kind.DELIVERY, receiver, labels.get("node", ""), self._device_of(labels), **detail
            )

    def _device_of(self, labels: Mapping[str, str]) -> str:
        """The uuid an alert's labels name (the `uuid` label, a device-plugin device, or pool/device)."""
        if labels.get("uuid"):
            return labels["uuid"]
        device = labels.get("device", "")
        if device in self.journal.devices:
            return device
        parts = device.split("/")
        if len(parts) == 3:
            return self._uuid_at.get((parts[1], parts[2]), device)
        return device

    # ----- object changes --------------------------------------------------------------------------

    def change(
        self, at: float, resource: str, etype: str, obj: Mapping[str, Any], devices: Iterable[str] = ()
    ) -> None:
        """One watch event; `devices` (pods only): the uuids the simulated kubelet gave the pod."""
        handler = {
            QUARANTINES: self._record,
            RULES: self._rule,
            NODES: self._node,
            JOBS: self._job,
            EVENTS: self._event,
            LEASES: self._lease,
            CONFIG_MAPS: self._config_map,
            CLAIMS: self._claim,
        }.get(resource)
        if resource == PODS:
            self._pod(at, etype, obj, tuple(devices))
        elif handler is not None:
            handler(at, etype, obj)

    def _record(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        if etype == DELETED:
            return
        try:
            record = from_object(dict(obj))
        except RecordError as exc:
            self.journal.record(at, Kind.NOTE, "unreadable record", detail=str(exc))
            return
        spec, status = record.spec, record.status
        uuid = spec.uuid or (
            spec.device if spec.device in self.journal.devices else self._device_of({"device": spec.device})
        )
        before = self._records.get(record.name)
        phase = str(status.phase)
        outcomes = dict(before[3]) if before else {}
        if before is None or before[0] != phase:
            # An ended quarantine carries the verdict the responder counts for it (the same pure
            # function of the same record), for the summary to set beside the ground truth.
            verdict = verdict_of(record)
            self.journal.record(
                at,
                Kind.PHASE,
                phase,
                spec.node,
                uuid,
                reason=spec.reason,
                record=record.name,
                actor=spec.actor,
                action=spec.action,
                why=status.phase_reason,
                attempt=str(status.attempt),
                episode=str(status.episode),
                **({"requested": spec.release_request.actor} if spec.release_request is not None else {}),
                **({"verdict": verdict.value} if verdict is not None else {}),
            )
        if uuid and uuid not in self._recorded:
            self._recorded.add(uuid)
            for pod, (node, devices, job, running, check) in sorted(self._pods.items()):
                if running and uuid in devices:
                    self._placement(at, "running", pod, node, devices, job, check)
        self._request(at, record.name, spec.node, uuid, record)
        for migration in status.migrations:
            job = f"{migration.namespace}/{migration.owner.rsplit('/', 1)[-1]}"
            move = (job, migration.episode)
            if move not in outcomes:
                # The move's deadline counts from here (the safety verdict's pods left behind).
                outcomes[move] = ""
                self.journal.record(
                    at,
                    Kind.NOTE,
                    "move-started",
                    spec.node,
                    uuid,
                    record=record.name,
                    job=job,
                    episode=str(migration.episode),
                    detail=f"move of {job} off {self.journal.label(uuid)} started",
                )
            if migration.outcome is MigrationOutcome.WAITING or outcomes.get(move) == migration.outcome.value:
                continue
            outcomes[move] = migration.outcome.value
            self.journal.record(
                at,
                Kind.MIGRATION,
                migration.outcome.value.lower(),
                spec.node,
                uuid,
                job=job,
                owner=migration.owner,
                reason=migration.detail,
                record=record.name,
                episode=str(migration.episode),
                evictions=str(len(migration.evictions)),
            )
        self._records[record.name] = (phase, spec.node, uuid, outcomes)
        self._record_labels[record.name[:63].rstrip("-.")] = record.name

    def _request(self, at: float, name: str, node: str, uuid: str, record: Any) -> None:
        """REQUEST entries for a new release request and each new answer the responder gives."""
        request = record.spec.release_request
        answer = record.status.condition(REQUEST_CONDITION)
        before = self._requests.get(name, ("", "", ""))
        requested_at = request.requested_at if request is not None else ""
        state = (answer.status, answer.reason) if answer is not None and request is not None else ("", "")
        if request is not None and requested_at != before[0]:
            self.journal.record(
                at,
                Kind.REQUEST,
                "requested",
                node,
                uuid,
                record=name,
                actor=request.actor,
                message=request.reason[:300],
                by="responder",
            )
        if answer is not None and request is not None and (requested_at, *state) != before:
            self.journal.record(
                at,
                Kind.REQUEST,
                "honoured" if answer.status == "True" else "refused",
                node,
                uuid,
                record=name,
                actor=request.actor,
                reason=answer.reason,
                message=answer.message[:300],
                by="responder",
            )
        self._requests[name] = (requested_at, *state)

    def refused_by_command(self, at: float, record: str, device: str, actor: str, message: str) -> None:
        """The release command refused a request before writing it (what the record showed)."""
        known = self.journal.devices.get(device)
        self.journal.record(
            at,
            Kind.REQUEST,
            "refused",
            known.node if known else "",
            device,
            record=record,
            actor=actor,
            reason="RefusedByCommand",
            message=message[:300],
            by="command",
        )

    def record_of(self, device: str) -> str:
        """The name of the latest active record seen for `device` ('' when none)."""
        names = [n for n, (phase, _, uuid, _) in self._records.items() if uuid == device]
        active = [n for n in names if self._records[n][0] not in ("Released", "Abandoned")]
        return (active or names or [""])[-1]

    def _rule(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        meta = _meta(obj)
        name = str(meta.get("name", ""))
        owners = meta.get("ownerReferences") or []
        if not any(isinstance(o, Mapping) and o.get("kind") == "DeviceQuarantine" for o in owners):
            return  # not gpuhealth's
        spec = obj.get("spec") or {}
        selector = spec.get("deviceSelector") or {}
        taint = spec.get("taint") or {}
        node = str(selector.get("pool", ""))
        selected = str(selector.get("device", ""))
        uuid = self._slice_card(node, selected)
        meaning = "quarantine" if taint.get("key") == QUARANTINE_TAINT else "canary"
        before = self._rules.get(name)
        detail = {
            "rule": name,
            "taint": str(taint.get("key", "")),
            "effect": str(taint.get("effect", "")),
            "deviceName": selected,
        }
        if etype == DELETED:
            if before is not None:
                self.journal.record(
                    at, Kind.LIFTED, before[0], before[1], before[2], rule=name, deviceName=selected
                )
                del self._rules[name]
            return
        if before is not None and before[0] == meaning:
            return
        if before is not None:
            self.journal.record(
                at, Kind.LIFTED, before[0], before[1], before[2], rule=name, deviceName=selected
            )
        self.journal.record(at, Kind.ENFORCED, meaning, node, uuid, **detail)
        self._rules[name] = (meaning, node, uuid)

    def _node(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        meta = _meta(obj)
        node = str(meta.get("name", ""))
        raw = (meta.get("annotations") or {}).get(NODE_ANNOTATION) if etype != DELETED else None
        listed: set[str] = set()
        if raw:
            try:
                parsed = json.loads(raw)
                listed = {self._card(str(d)) for d in parsed} if isinstance(parsed, list) else set()
            except ValueError:
                self.journal.record(at, Kind.NOTE, "unreadable annotation", node, annotation=str(raw)[:200])
        ramp_raw = (meta.get("annotations") or {}).get(RAMP_ANNOTATION) if etype != DELETED else None
        ramping: set[str] = set()
        if ramp_raw:
            try:
                parsed = json.loads(ramp_raw)
                ramping = {self._card(str(d)) for d in parsed} if isinstance(parsed, dict) else set()
            except ValueError:
                self.journal.record(
                    at, Kind.NOTE, "unreadable annotation", node, annotation=str(ramp_raw)[:200]
                )
        before = self._annotated.get(node, set())
        ramped = self._ramping.get(node, set())
        # What leaves a list is lifted before what enters the other is enforced, as a DeviceTaintRule's
        # taint switched between quarantine and canary is journaled.
        for device in sorted(before - listed):
            self.journal.record(at, Kind.LIFTED, "quarantine", node, device, annotation=NODE_ANNOTATION)
        for device in sorted(ramped - ramping):
            self.journal.record(at, Kind.LIFTED, "canary", node, device, annotation=RAMP_ANNOTATION)
        for device in sorted(listed - before):
            self.journal.record(at, Kind.ENFORCED, "quarantine", node, device, annotation=NODE_ANNOTATION)
        for device in sorted(ramping - ramped):
            self.journal.record(at, Kind.ENFORCED, "canary", node, device, annotation=RAMP_ANNOTATION)
        self._annotated[node] = listed
        self._ramping[node] = ramping
        spec = obj.get("spec") or {}
        cordoned = bool(spec.get("unschedulable"))
        taints = frozenset(
            str(t.get("key"))
            for t in spec.get("taints") or ()
            if isinstance(t, Mapping) and str(t.get("key", "")).startswith("gpuhealth.io/")
        )
        was_cordoned, was_tainted = self._node_state.get(node, (False, frozenset()))
        if cordoned and not was_cordoned:
            # The simulated cluster never cordons a node itself: a cordon here is gpuhealth's.
            self.journal.record(at, Kind.NODE_ACTION, "cordon", node, key="spec.unschedulable")
        for key in sorted(taints - was_tainted):
            self.journal.record(at, Kind.NODE_ACTION, "taint", node, key=key)
        self._node_state[node] = (cordoned, taints)

    def _job(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        meta = _meta(obj)
        labels = meta.get("labels") or {}
        kind = labels.get(CHECK_LABEL)
        name = str(meta.get("name", ""))
        if not kind or etype == DELETED or name in self._checks_done:
            return
        result = job_result(dict(obj))
        if result is CheckResult.RUNNING:
            return
        self._checks_done.add(name)
        record = self._record_labels.get(str(labels.get(RECORD_LABEL, "")), "")
        _, node, uuid, _ = self._records.get(record, ("", "", "", {}))
        ran_on = self._check_devices.get(f"{meta.get('namespace', '')}/{name}", set())
        self.journal.record(
            at,
            Kind.CHECK,
            str(kind),
            node,
            uuid,
            result="passed" if result is CheckResult.SUCCEEDED else "failed",
            job=name,
            record=record,
            attempt=str((meta.get("annotations") or {}).get("gpuhealth.io/attempt", "")),
            ranOn=",".join(sorted(ran_on)),
        )

    def _event(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        if etype == DELETED:
            return
        involved = obj.get("involvedObject") or {}
        component = obj.get("reportingComponent") or (obj.get("source") or {}).get("component")
        if involved.get("kind") != "Pod" or component != RESPONDER_COMPONENT:
            return
        meta = _meta(obj)
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if key in self._events_seen:
            return
        self._events_seen.add(key)
        pod = f"{involved.get('namespace', '')}/{involved.get('name', '')}"
        node, devices, _, _, _ = self._pods.get(pod, ("", (), "", False, ""))
        self.journal.record(
            at,
            Kind.TENANT_EVENT,
            str(obj.get("reason", "")),
            node,
            devices[0] if devices else "",
            pod=pod,
            message=str(obj.get("message", ""))[:300],
            type=str(obj.get("type", "")),
        )

    def _pod(self, at: float, etype: str, obj: Mapping[str, Any], devices: tuple[str, ...]) -> None:
        meta = _meta(obj)
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        before = self._pods.get(key)
        if etype == DELETED:
            self._pods.pop(key, None)
            self._starting.pop(key, None)
            self._status_ids.pop(key, None)
            if before is not None and before[3]:
                self._placement(at, "stopped", key, *before[:3], before[4], self._holders.pop(key, ""))
            return
        labels = meta.get("labels") or {}
        job = labels.get("job-name") or labels.get("app") or ""
        job = f"{meta.get('namespace', '')}/{job}" if job else ""
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        running = (obj.get("status") or {}).get("phase") == "Running" and not meta.get("deletionTimestamp")
        check = str(labels.get(CHECK_LABEL) or "")
        holder = str(labels.get(HOLDER_LABEL) or "")
        if holder:
            self._holders[key] = holder
        devices = devices or (before[1] if before else ())
        if check and node:
            # A check pod without an allocation reaches its GPU through the NVIDIA runtime.
            devices = tuple(dict.fromkeys((*devices, *self._visible(obj, node))))
        if check and job and devices:
            self._check_devices.setdefault(job, set()).update(devices)
        if running and devices and not (before and before[3]) and job in self._evicted_jobs:
            self.journal.record(
                at,
                Kind.NOTE,
                "placed",
                node,
                devices[0],
                pod=key,
                job=job,
                devices=",".join(devices),
                optedIn=str(labels.get(CANARY_OPT_IN) == "true").lower(),
                detail=f"{key} of {job} running again on "
                + ", ".join(self.journal.label(d) for d in devices),
            )
        status_ids = _resource_ids(obj)
        if status_ids:
            self._status_ids[key] = status_ids
        if running:
            self._started(at, key, obj, node)
        self._start_if_known(key)
        was_running = bool(before and before[3])
        if running != was_running and devices:
            self._placement(at, "running" if running else "stopped", key, node, devices, job, check, holder)
        self._pods[key] = (node, devices, job, running, check)
        self._checkpoint_requested(at, key, obj, node, devices)

    def _visible(self, obj: Mapping[str, Any], node: str) -> tuple[str, ...]:
        """uuids of the node's GPUs the pod's `NVIDIA_VISIBLE_DEVICES` names (uuids or indexes)."""
        found: list[str] = []
        spec = obj.get("spec") or {}
        # Init containers too: the probe's diagnostic, the one that uses the card, is one.
        for container in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
            for var in (container.get("env") or ()) if isinstance(container, Mapping) else ():
                if not isinstance(var, Mapping) or var.get("name") != VISIBLE_DEVICES:
                    continue
                for entry in str(var.get("value") or "").split(","):
                    entry = entry.strip()
                    uuid = (
                        self._uuid_at.get((node, f"gpu-{entry}"), "")
                        if entry.isdigit()
                        else self._card(entry)
                    )
                    known = self.journal.devices.get(uuid)
                    if known is not None and known.node == node and uuid not in found:
                        found.append(uuid)
        return tuple(found)

    def _card(self, device: str) -> str:
        """The card a device ID names: a MIG partition's card, else the ID itself."""
        return self._card_of.get(device, device)

    def _slice_card(self, pool: str, device: str) -> str:
        """The card (uuid) of a DRA slice device of `pool` (its node); '' for none of the fleet's."""
        # A MIG device of the NVIDIA DRA driver (`gpu-<minor>-mig-...`) is of its card `gpu-<minor>`.
        return self._uuid_at.get((pool, device)) or self._uuid_at.get((pool, device.split("-mig-")[0]), "")

    def _resource_card(self, resource_id: str) -> str:
        """The card (uuid) a device plugin's resource ID names: the card's own uuid, a time-sliced
        replica of it (`<uuid>::<n>`) or a MIG partition of it; '' for none of the fleet's (a DRA
        CDI device name: its claim's allocation names the device)."""
        card = self._card(resource_id.split("::", 1)[0])
        return card if card in self.journal.devices else ""

    # ----- pods starting on devices, as the API says ---------------------------------------------------

    def _started(self, at: float, key: str, obj: Mapping[str, Any], node: str) -> None:
        """The pod was seen Running: its start, once per pod (by uid), journaled when its devices
        are known (POD_STARTED)."""
        meta = _meta(obj)
        mark = f"{key}/{meta.get('uid', '')}"
        if mark in self._starts_seen:
            return
        self._starts_seen.add(mark)
        labels = meta.get("labels") or {}
        holder = str(labels.get(HOLDER_LABEL) or "")
        self._starting[key] = (at, node, holder, str(labels.get(CHECK_LABEL) or ""))

    def _start_if_known(self, key: str) -> None:
        pending = self._starting.get(key)
        if pending is None:
            return
        ids: dict[str, str] = {}
        """device ID -> its card, in the order the API gave them."""
        for rid in self._status_ids.get(key, ()):
            ids[rid] = self._resource_card(rid)
        for devices in self._claimed.get(key, {}).values():
            for device in devices:
                pool, _, name = device.partition("/")
                ids[device] = self._slice_card(pool, name)
        named = {rid: card for rid, card in ids.items() if card}
        if not named:
            return  # not yet (or never: a pod without a GPU, forgotten when it is deleted)
        del self._starting[key]
        cards = tuple(dict.fromkeys(named.values()))
        if not any(card in self._recorded for card in cards):
            return  # on no device gpuhealth has a record for (a fleet's pods would swamp the journal)
        at, node, holder, check = pending
        detail = {"devices": ",".join(cards), "deviceIDs": ",".join(named)}
        if holder:
            detail["holder"] = holder
        if check:
            detail["check"] = check
        self.journal.record(at, Kind.POD_STARTED, key, node, cards[0], **detail)

    def _claim(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        """A ResourceClaim: the devices its allocation gives the pods it is reserved for."""
        meta = _meta(obj)
        namespace = str(meta.get("namespace", ""))
        key = f"{namespace}/{meta.get('name', '')}"
        status = (obj.get("status") or {}) if etype != DELETED else {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
        devices = tuple(
            f"{r.get('pool', '')}/{r.get('device', '')}" for r in results if isinstance(r, Mapping)
        )
        pods = tuple(
            f"{namespace}/{r.get('name', '')}"
            for r in status.get("reservedFor") or ()
            if isinstance(r, Mapping) and r.get("resource") == "pods"
        )
        for pod in self._claims.pop(key, ()):
            claimed = self._claimed.get(pod, {})
            claimed.pop(key, None)
            if not claimed:
                self._claimed.pop(pod, None)
        if not (devices and pods):
            return
        self._claims[key] = pods
        for pod in pods:
            self._claimed.setdefault(pod, {})[key] = devices
            self._start_if_known(pod)

    def _placement(
        self,
        at: float,
        what: str,
        pod: str,
        node: str,
        devices: tuple[str, ...],
        job: str,
        check: str,
        holder: str = "",
    ) -> None:
        if not any(d in self._recorded for d in devices):
            return
        detail = {"pod": pod, "job": job, "devices": ",".join(devices)}
        if check:
            detail["check"] = check
        if holder:
            detail["holder"] = holder  # gpuhealth's own, meant to be on the card
        self.journal.record(at, Kind.POD, what, node, devices[0], **detail)

    def _checkpoint_requested(
        self, at: float, key: str, obj: Mapping[str, Any], node: str, devices: tuple[str, ...]
    ) -> None:
        """A pod's first sight with a checkpoint request of a key: whether new requests had
        stopped (its `gpuhealth.io/serving` condition, its Ready condition, the readiness gate)."""
        request = (_meta(obj).get("annotations") or {}).get(CHECKPOINT_REQUESTED)
        if not request or (key, request) in self._requests_seen:
            return
        self._requests_seen.add((key, request))
        conditions = {
            str(c.get("type")): str(c.get("status"))
            for c in (obj.get("status") or {}).get("conditions") or ()
            if isinstance(c, Mapping)
        }
        gates = (obj.get("spec") or {}).get("readinessGates") or ()
        gated = any(isinstance(g, Mapping) and g.get("conditionType") == SERVING_CONDITION for g in gates)
        self.journal.record(
            at,
            Kind.NOTE,
            "checkpoint-requested",
            node,
            devices[0] if devices else "",
            pod=key,
            serving=conditions.get(SERVING_CONDITION, ""),
            ready=conditions.get("Ready", ""),
            gated="true" if gated else "false",
        )

    def _lease(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        if _meta(obj).get("name") != LEADER_LEASE:
            return
        holder = "" if etype == DELETED else str((obj.get("spec") or {}).get("holderIdentity") or "")
        if holder != self.leader:
            self.journal.record(at, Kind.NOTE, "leader", holder=holder, previous=self.leader)
            self.leader = holder

    def _config_map(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        if _meta(obj).get("name") != BREAKER_CONFIG_MAP or etype == DELETED:
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
