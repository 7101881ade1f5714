"""The journal of one demo run: everything the pipeline observed, on one time axis.

Pure data. The pipeline (`demo.pipeline`) appends what it sees — faults the simulator applied,
health the kubelet reported, alerts Prometheus fired, deliveries Alertmanager made, what the
responders did in the cluster (records and their phases, DeviceTaintRules, node annotations,
evictions, Events), component processes started and killed — and everything after the run
reads it: the live status block (`demo.progress`), the summary and the HTML report
(`demo.summary`, `demo.report`), the safety verdict (`demo.safety`) and the scenario's
expected outcome (`demo.expectations`). One record serves them all, so the verdict and the
report can never disagree about what happened.

Times are scenario seconds: simulated seconds since the scenario's start (the lead-in, when
the pipeline warms up on a healthy fleet, is negative). An entry's time is when the pipeline
saw it, never earlier than it happened; latencies computed from the journal are therefore
upper bounds, off by at most one observation interval (`Journal.resolution_seconds`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    """What an entry records. `what` and `detail` per kind are listed beside each."""

    FAULT = "fault"
    """The simulator applied a timeline fault. what: fault kind (`xid`, `device-unknown`, ...);
    detail: `xid`, `duration`, `message` as the scenario gave them. node and device set for
    device faults, node only for node faults."""
    HEALTH = "health"
    """A device's health as the cluster reports it changed. what: `Healthy|Unhealthy|Unknown`."""
    ALERT_FIRING = "alert-firing"
    """Prometheus started firing an alert. what: alertname; detail: `action`, `severity`."""
    ALERT_RESOLVED = "alert-resolved"
    """An alert stopped firing. what: alertname."""
    DELIVERY = "delivery"
    """Alertmanager delivered an alert to a receiver. what: receiver (`responder`, `page`,
    `ticket`, `tenant`); detail: `alertname`, `status` (firing|resolved), `action`."""
    PHASE = "phase"
    """A DeviceQuarantine record entered a phase (a new record: its first phase). what: the phase
    (`Pending`, `Quarantined`, `Probing`, `Canary`, `Stabilizing`, `Ramp`, `Released`,
    `Deferred`, ...); detail: `reason`, `record` (its name), `actor`, `attempt` (release
    attempts started), `episode` (entries into Quarantined), `requested` (the actor of a
    pending release request, if any), and on an ended enforced quarantine `verdict`
    (`responder.verdicts`: confirmed|unconfirmed|restricted-unknown)."""
    ENFORCED = "enforced"
    """The device became excluded: a DeviceTaintRule (detail: `rule`, `taint`, `effect`) or the
    node annotation listing it (detail: `annotation`). what: `quarantine` or `canary` (the taint
    key's meaning)."""
    LIFTED = "lifted"
    """The exclusion went away (rule deleted, device gone from the annotation). what: as ENFORCED."""
    EVICTION = "eviction"
    """A pod was evicted through the Eviction API. node/device: where it ran (device: one of its
    devices, detail `devices` lists all, comma-separated); what: `namespace/pod`; detail: `job`."""
    MIGRATION = "migration"
    """A migration of a job's work reached an outcome. what: `succeeded|failed|unrecoverable`;
    detail: `job`, `reason`, `record`, `episode` (the record's episode the move belongs to: a job
    is moved once per episode)."""
    CHECK = "check"
    """A probe or canary finished. what: `probe|canary`; detail: `result` (passed|failed), `record`,
    `job`, `attempt` (the release attempt the Job belongs to), `ranOn` (uuids of the devices its
    pod really reached, comma-separated: allocated through its claim, or exposed by
    `NVIDIA_VISIBLE_DEVICES` on its node; empty when no pod of it was seen on a device)."""
    POD = "pod"
    """A pod holding a device gpuhealth has a record for started or stopped running on it (pods
    on devices never recorded are left out: a large fleet's pods would swamp the journal).
    what: `running|stopped`; node; device: its first device; detail: `pod` (namespace/name),
    `job`, `devices` (comma-separated uuids), `check` (`probe|canary` for a check Job's pod)."""
    POD_STARTED = "pod-started"
    """A pod's containers started running (its first sight Running) with a device gpuhealth has a
    record for among its devices, as the API names them: the resource IDs of its container
    statuses' `allocatedResourcesStatus` on device plugins (`<uuid>`, `<uuid>::<n>` for a
    time-sliced replica, a MIG partition's UUID for its card), the devices its ResourceClaims'
    allocations give it on DRA (`<pool>/<device>`; a MIG device for its card). One entry per pod,
    stamped when it was first seen Running, even when its devices became known later. what:
    `namespace/name`; node; device: its first card; detail: `devices` (the cards' uuids,
    comma-separated), `deviceIDs` (the IDs the API gave, comma-separated), `holder` (the record a
    gpuhealth holder pod holds its card for: its `gpuhealth.io/holder` label), `check`
    (`probe|canary` for a check Job's pod). The safety verdict's exposure counts them."""
    REQUEST = "request"
    """A person's release request and its answer. what: `requested` (the request as written),
    `honoured` or `refused` (the answer: by the responder, the record's `ReleaseRequest`
    condition, or by the command before it wrote anything); detail: `record`, `actor`,
    `reason` (the answer's reason, e.g. `FailureStands`), `message`, `by`
    (`responder|command`)."""
    HEALTH_SOURCE = "health-source"
    """The responders' health source (their Prometheus) became unreachable or reachable again
    (the demo cuts it: `demo.healthSourceDown`). what: `down|up`."""
    BREAKER = "breaker"
    """The circuit breaker changed. what: `tripped|reset`; detail: `trigger`, `actor`."""
    NODE_ACTION = "node-action"
    """Something node-wide was done to a node by gpuhealth (cordon, node taint). what: the action;
    detail: `key`. A node action without a justification that held then breaks a safety invariant
    (`demo.safety`: only gpuhealth's escalation taint can have one)."""
    TENANT_EVENT = "tenant-event"
    """A Kubernetes Event for the tenant on a pod. what: its reason; detail: `pod`, `message`."""
    PROCESS = "process"
    """A component process started, was killed or exited. what: `started|killed|exited`; node is
    empty, device is empty; detail: `name` (`responder-0`, `alertmanager-1`, `exporter-gpu-dp-0`),
    `role` (`leader|follower` when known)."""
    RESET = "reset"
    """The cluster's reset controller (NVSentinel's janitor) started or finished resetting a card.
    what: `started|succeeded|failed`; detail: `request` (the GPUReset), `reason` (the outcome's).
    One entry per card the request names."""
    NOTE = "note"
    """A line for the narrative that fits no other kind (a warning, a scenario stage)."""


@dataclass(frozen=True, slots=True)
class Entry:
    at: float
    """Scenario seconds (simulated seconds since the scenario started) when it was seen."""
    kind: Kind
    what: str
    node: str = ""
    device: str = ""
    """The device's uuid (the identity alerts and records carry); empty for node-wide entries."""
    detail: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"at": self.at, "kind": self.kind.value, "what": self.what}
        if self.node:
            data["node"] = self.node
        if self.device:
            data["device"] = self.device
        if self.detail:
            data["detail"] = dict(self.detail)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Entry:
        at = float(data["at"])
        if not math.isfinite(at):
            raise ValueError(f"journal entry time {data['at']!r} is not a finite number")
        return cls(
            at=at,
            kind=Kind(data["kind"]),
            what=str(data["what"]),
            node=str(data.get("node", "")),
            device=str(data.get("device", "")),
            detail={str(k): str(v) for k, v in (data.get("detail") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class Device:
    """A GPU of the scenario's fleet, as the narrative names it."""

    uuid: str
    node: str
    index: int
    path: str
    """`dra` or `device-plugin`."""
    partitions: tuple[str, ...] = ()
    """A MIG card's partitions (their MIG UUIDs): what the node annotation and a check's
    `NVIDIA_VISIBLE_DEVICES` name the card by on the device-plugin path."""

    @property
    def label(self) -> str:
        return f"{self.node}/gpu-{self.index}"


@dataclass(frozen=True, slots=True)
class Recovery:
    """Migration recovery times of one `path` (gpuhealth_migration_recovery_seconds{path}: a move's
    first eviction to its job running again on healthy devices), as the run's Prometheus held
    them at its end; in scenario seconds (the responders' wall seconds times the speed)."""

    path: str
    moves: int
    mean_seconds: float
    p50_seconds: float | None = None
    p99_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "moves": self.moves,
            "meanSeconds": self.mean_seconds,
            "p50Seconds": self.p50_seconds,
            "p99Seconds": self.p99_seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recovery:
        def optional(key: str) -> float | None:
            value = data.get(key)
            return None if value is None else float(value)

        return cls(
            path=str(data["path"]),
            moves=int(data["moves"]),
            mean_seconds=float(data["meanSeconds"]),
            p50_seconds=optional("p50Seconds"),
            p99_seconds=optional("p99Seconds"),
        )


@dataclass
class Journal:
    scenario: str
    description: str
    speed: float
    """Simulated seconds per wall second."""
    devices: dict[str, Device]
    """Every GPU of the fleet by uuid."""
    floor_seconds: float = 0.0
    """The detection pipeline's floor in scenario seconds: scrape interval + evaluation interval
    + the alert's `for:` + Alertmanager's group_wait (the fastest any detection can be)."""
    resolution_seconds: float = 0.0
    """Scenario seconds between two observations: how late an entry may be stamped."""
    entries: list[Entry] = field(default_factory=list)
    ended_at: float = 0.0
    """Scenario seconds when the run stopped observing."""
    recoveries: list[Recovery] = field(default_factory=list)
    """Migration recovery times by path, read from the run's Prometheus at the end (none: no moves)."""

    def add(self, entry: Entry) -> None:
        self.entries.append(entry)

    def record(
        self, at: float, kind: Kind, what: str, node: str = "", device: str = "", **detail: str
    ) -> Entry:
        entry = Entry(at, kind, what, node, device, detail)
        self.entries.append(entry)
        return entry

    def of(self, *kinds: Kind, device: str | None = None, node: str | None = None) -> Iterator[Entry]:
        """Entries of these kinds (all kinds when none given), in order, optionally of one device/node."""
        wanted = set(kinds)
        for entry in self.entries:
            if wanted and entry.kind not in wanted:
                continue
            if device is not None and entry.device != device:
                continue
            if node is not None and entry.node != node:
                continue
            yield entry

    def first(
        self, kind: Kind, *, device: str | None = None, what: str | None = None, after: float = -math.inf
    ) -> Entry | None:
        """The earliest entry of `kind` (optionally of `device`, with `what`) at or after `after`."""
        for entry in self.of(kind, device=device):
            if entry.at >= after and (what is None or entry.what == what):
                return entry
        return None

    def label(self, device: str) -> str:
        """`node/gpu-i` for a known uuid; the uuid itself otherwise."""
        known = self.devices.get(device)
        return known.label if known else device

    def touched_devices(self) -> list[str]:
        """Devices any entry names, in order of first mention."""
        seen: dict[str, None] = {}
        for entry in self.entries:
            if entry.device:
                seen.setdefault(entry.device, None)
        return list(seen)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "description": self.description,
            "speed": self.speed,
            "floorSeconds": self.floor_seconds,
            "resolutionSeconds": self.resolution_seconds,
            "endedAt": self.ended_at,
            "devices": [
                {"uuid": d.uuid, "node": d.node, "index": d.index, "path": d.path}
                | ({"partitions": list(d.partitions)} if d.partitions else {})
                for d in self.devices.values()
            ],
            "entries": [e.to_dict() for e in self.entries],
            "migrationRecovery": [r.to_dict() for r in self.recoveries],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Journal:
        devices = (
            Device(
                str(d["uuid"]),
                str(d["node"]),
                int(d["index"]),
                str(d["path"]),
                tuple(str(p) for p in d.get("partitions") or ()),
            )
            for d in data["devices"]
        )
        return cls(
            scenario=str(data["scenario"]),
            description=str(data.get("description", "")),
            speed=float(data["speed"]),
            devices={d.uuid: d for d in devices},
            floor_seconds=float(data.get("floorSeconds", 0.0)),
            resolution_seconds=float(data.get("resolutionSeconds", 0.0)),
            entries=[Entry.from_dict(e) for e in data.get("entries", [])],
            ended_at=float(data.get("endedAt", 0.0)),
            recoveries=[Recovery.from_dict(r) for r in data.get("migrationRecovery", [])],
        )


def sorted_entries(entries: Iterable[Entry]) -> list[Entry]:
    """Entries by time; equal times keep their order of recording (the order things were seen)."""
    return sorted(entries, key=lambda e: e.at)
