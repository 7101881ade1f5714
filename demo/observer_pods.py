"""The demo observer's pods: who runs on a recorded card, and who started on one. Pure.

`PodWatch` journals, for the devices any quarantine record was seen for (`recorded`), the pods
running and stopping on them (POD, with gpuhealth's holders and checks marked), each pod's start
with the cards the API gives it (POD_STARTED: its containers' `allocatedResourcesStatus` resource
IDs on device plugins, its ResourceClaims' allocations on DRA, so the same on the simulated and a
real apiserver), evicted jobs' pods running again (NOTE placed), checkpoint requests a pod was
seen with, and the Events the responder wrote about pods (TENANT_EVENT). It also keeps the cards
each check Job's pods really reached, for the check's entry (`demo.observer_records`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from demo.journal import Kind
from demo.observer_names import DELETED, DeviceNames, meta

CHECKPOINT_REQUESTED = "gpuhealth.io/checkpoint-requested"
SERVING_CONDITION = "gpuhealth.io/serving"
CANARY_OPT_IN = "gpuhealth.io/canary-ok"
"""The pod label by which a workload opts in to devices on the ramp (`docs/workloads.md`)."""
CHECK_LABEL = "gpuhealth.io/check"
HOLDER_LABEL = "gpuhealth.io/holder"
"""Label of gpuhealth's holder pods (value: the record whose card the pod holds through the
kubelet, so that no other pod is handed it): meant to be on the card, as checks are."""
RESPONDER_COMPONENT = "gpuhealth-responder"


def resource_ids(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The device IDs the kubelet reports for the pod's containers (`allocatedResourcesStatus`)."""
    ids: dict[str, None] = {}
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        for entry in (status.get("allocatedResourcesStatus") or ()) if isinstance(status, Mapping) else ():
            for resource in (entry.get("resources") or ()) if isinstance(entry, Mapping) else ():
                rid = resource.get("resourceID") if isinstance(resource, Mapping) else None
                if rid:
                    ids[str(rid)] = None
    return tuple(ids)


class PodWatch:
    """Pods, their ResourceClaims and the responder's Events about them, as journal entries."""

    def __init__(self, names: DeviceNames) -> None:
        self.names = names
        self.journal = names.journal
        self.recorded: set[str] = set()
        """uuids of devices any record was seen for: pods on them are journaled (POD)."""
        self._events_seen: set[str] = set()
        self._pods: dict[str, tuple[str, tuple[str, ...], str, bool, str]] = {}
        """namespace/name -> (node, device uuids, job, running, check kind or '')."""
        self._check_devices: dict[str, set[str]] = {}
        """namespace/name of a check Job -> uuids its pods really reached."""
        self._evicted_jobs: set[str] = set()
        self._starts_seen: set[str] = set()
        """namespace/name/uid of every pod seen Running: a pod starts once (POD_STARTED)."""
        self._starting: dict[str, tuple[float, str, str, str]] = {}
        """namespace/name -> (seen Running at, node, holder, check) of a started pod whose devices
        the API has not named yet (a claim seen after its pod, a status written later)."""
        self._holders: dict[str, str] = {}
        """Pod key -> the record a holder pod of gpuhealth's holds the card for."""
        self._status_ids: dict[str, tuple[str, ...]] = {}
        """namespace/name -> the resource IDs its containers' `allocatedResourcesStatus` names."""
        self._claims: dict[str, tuple[str, ...]] = {}
        """namespace/name of a ResourceClaim -> the pods (namespace/name) it is reserved for."""
        self._claimed: dict[str, dict[str, tuple[str, ...]]] = {}
        """namespace/name of a pod -> claim -> its allocation's devices (`<pool>/<device>`)."""
        self._requests_seen: set[tuple[str, str]] = set()
        """(pod, key) of checkpoint requests journaled."""

    def check_devices(self, job: str) -> set[str]:
        """The uuids the pods of check Job `job` (namespace/name) really reached."""
        return self._check_devices.get(job, set())

    def device_recorded(self, at: float, uuid: str) -> None:
        """A record names `uuid` for the first time: the pods running on it from now on, and now."""
        if uuid in self.recorded:
            return
        self.recorded.add(uuid)
        for pod, (node, devices, job, running, check) in sorted(self._pods.items()):
            if running and uuid in devices:
                self._placement(at, "running", pod, node, devices, job, check)

    def evicted(self, at: float, pod: str, node: str, devices: Iterable[str], job: str) -> None:
        """The apiserver served an eviction of `pod` (namespace/name) running on `devices`."""
        uuids = tuple(devices)
        if job:
            self._evicted_jobs.add(job)
        self.journal.record(
            at, Kind.EVICTION, pod, node, uuids[0] if uuids else "", job=job, devices=",".join(uuids)
        )

    def event(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        if etype == DELETED:
            return
        involved = obj.get("involvedObject") or {}
        component = obj.get("reportingComponent") or (obj.get("source") or {}).get("component")
        if involved.get("kind") != "Pod" or component != RESPONDER_COMPONENT:
            return
        m = meta(obj)
        key = f"{m.get('namespace', '')}/{m.get('name', '')}"
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

    def pod(self, at: float, etype: str, obj: Mapping[str, Any], devices: tuple[str, ...]) -> None:
        """A pod's watch event; `devices`: the uuids the simulated kubelet gave it (none elsewhere)."""
        m = meta(obj)
        key = f"{m.get('namespace', '')}/{m.get('name', '')}"
        before = self._pods.get(key)
        if etype == DELETED:
            self._pods.pop(key, None)
            self._starting.pop(key, None)
            self._status_ids.pop(key, None)
            if before is not None and before[3]:
                self._placement(at, "stopped", key, *before[:3], before[4], self._holders.pop(key, ""))
            return
        labels = m.get("labels") or {}
        job = labels.get("job-name") or labels.get("app") or ""
        job = f"{m.get('namespace', '')}/{job}" if job else ""
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        running = (obj.get("status") or {}).get("phase") == "Running" and not m.get("deletionTimestamp")
        check = str(labels.get(CHECK_LABEL) or "")
        holder = str(labels.get(HOLDER_LABEL) or "")
        if holder:
            self._holders[key] = holder
        devices = devices or (before[1] if before else ())
        if check and node:
            # A check pod without an allocation reaches its GPU through the NVIDIA runtime.
            devices = tuple(dict.fromkeys((*devices, *self.names.visible(obj, node))))
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
        status_ids = resource_ids(obj)
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

    def _started(self, at: float, key: str, obj: Mapping[str, Any], node: str) -> None:
        """The pod was seen Running: its start, once per pod (by uid), journaled when its devices
        are known (POD_STARTED)."""
        m = meta(obj)
        mark = f"{key}/{m.get('uid', '')}"
        if mark in self._starts_seen:
            return
        self._starts_seen.add(mark)
        labels = m.get("labels") or {}
        holder = str(labels.get(HOLDER_LABEL) or "")
        self._starting[key] = (at, node, holder, str(labels.get(CHECK_LABEL) or ""))

    def _start_if_known(self, key: str) -> None:
        pending = self._starting.get(key)
        if pending is None:
            return
        ids: dict[str, str] = {}
        """device ID -> its card, in the order the API gave them."""
        for rid in self._status_ids.get(key, ()):
            ids[rid] = self.names.resource_card(rid)
        for devices in self._claimed.get(key, {}).values():
            for device in devices:
                pool, _, name = device.partition("/")
                ids[device] = self.names.slice_card(pool, name)
        named = {rid: card for rid, card in ids.items() if card}
        if not named:
            return  # not yet (or never: a pod without a GPU, forgotten when it is deleted)
        del self._starting[key]
        cards = tuple(dict.fromkeys(named.values()))
        if not any(card in self.recorded for card in cards):
            return  # on no device gpuhealth has a record for (a fleet's pods would swamp the journal)
        at, node, holder, check = pending
        detail = {"devices": ",".join(cards), "deviceIDs": ",".join(named)}
        if holder:
            detail["holder"] = holder
        if check:
            detail["check"] = check
        self.journal.record(at, Kind.POD_STARTED, key, node, cards[0], **detail)

    def claim(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        """A ResourceClaim: the devices its allocation gives the pods it is reserved for."""
        m = meta(obj)
        namespace = str(m.get("namespace", ""))
        key = f"{namespace}/{m.get('name', '')}"
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
        if not any(d in self.recorded for d in devices):
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
        request = (meta(obj).get("annotations") or {}).get(CHECKPOINT_REQUESTED)
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
