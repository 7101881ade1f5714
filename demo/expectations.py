"""A scenario's expected outcome (its `expect:` section), and the check of a run against it.

Pure: no I/O. `parse` turns the raw section the simulator keeps (`Scenario.expect`) into frozen
`Expectations`, refusing anything it cannot read with an `ExpectationError` that names the file
and the field path (`scenarios/x.yaml: expect.quarantined[0].gpu: 9 is out of range ...`);
`check` evaluates them over the journal of a run (`demo.journal`) and returns one readable line
per expectation that did not hold (empty: the outcome was the one expected). The format is
documented in `docs/scenarios.md`, "Expected outcomes".

Everything is judged from the journal alone, the one record the summary, the report and the
safety verdict read as well, so an expectation can never pass on evidence the report does not
show. Devices are named as the scenario names them (`node`, `gpu` index); the journal's device
table maps them to the uuids its entries carry. Times are scenario (simulated) seconds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from demo.journal import Entry, Journal, Kind
from responder.ladder import KNOWN, LADDER, RAMP
from responder.reconcile.escalation import TAINT_KEY as ESCALATION_TAINT
from responder.records import PHASES, RELEASE_PHASES
from simulator.model import DEVICE_PLUGIN, DRA, NodeGroup, Scenario

# One reader for the scenario grammar: the simulator's parser checks its own sections with it.
from simulator.scenario import FieldReader, ScenarioError, format_path

__all__ = [
    "AlertExpectation",
    "ChecksExpectation",
    "Count",
    "DeviceExpectation",
    "ExpectationError",
    "Expectations",
    "Latency",
    "NodeOrDevice",
    "OutageExpectation",
    "RampExpectation",
    "RequestExpectation",
    "TenantEventExpectation",
    "check",
    "evaluate",
    "parse",
]

UNKNOWN_REASON = "Unknown"
"""The reason of every restrict (the responder's `intake.UNKNOWN_REASON`): a record with it is a
restriction, any other reason a quarantine."""
RELEASE_WALK = RELEASE_PHASES
"""The phases a released device walks, in order: the release ladder's, then Released."""
CLIMBING = frozenset((*KNOWN.phases, *RELEASE_PHASES))
"""Phases of a release attempt, the optional reset's included: leaving one for Quarantined is a
failed attempt."""
WALK = " -> ".join(RELEASE_WALK)
MIGRATION_OUTCOMES = ("succeeded", "failed", "unrecoverable")
RESET_OUTCOMES = ("succeeded", "failed")
"""What a GPU reset the cluster's reset controller finished came to (`Kind.RESET`)."""
PATHS = (DRA, DEVICE_PLUGIN)

_MAX_COUNT = 1_000_000
_MAX_LIST = 10_000
"""Items in one list: far above any fleet a demo runs, low enough that a bad file fails fast."""
_MAX_LATENCY = 30 * 86400.0
_QUARANTINE = "quarantine"
_ACTS = frozenset({Kind.PHASE, Kind.ENFORCED, Kind.MIGRATION})
"""Entries that say the responder acted on a device itself."""
"""`what` of ENFORCED and LIFTED entries for the quarantine taint or annotation."""

_Path = tuple[str | int, ...]


class ExpectationError(ScenarioError):
    """An `expect:` section that cannot be used; the message names the file and the field path.

    A `ScenarioError`, so whatever refuses a bad scenario file refuses a bad expectation the same
    way (`gpuhealth demo` exits 2).
    """


# ---------------------------------------------------------------------------- the schema


@dataclass(frozen=True, slots=True)
class Count:
    """How many: `min <= n <= max` (either bound may be open)."""

    min: int = 0
    max: int | None = None

    def holds(self, n: int) -> bool:
        return n >= self.min and (self.max is None or n <= self.max)

    def describe(self) -> str:
        if self.max == self.min:
            return f"exactly {self.min}"
        if self.max is None:
            return f"at least {self.min}"
        if self.min == 0:
            return f"at most {self.max}"
        return f"between {self.min} and {self.max}"


@dataclass(frozen=True, slots=True)
class DeviceExpectation:
    """A device that must end up quarantined or restricted."""

    node: str
    gpu: int
    reason: str | None = None
    """The record's reason (`FatalXid`, `Unhealthy`, ...); None: any (for quarantine: any but Unknown)."""
    path: str | None = None
    """`dra` (a DeviceTaintRule) or `device-plugin` (the node annotation); None: either."""
    within: float | None = None
    """Most scenario seconds from the device's first fault to its enforcement; None: no bound
    (for quarantines, `maxDetectionLatency` applies when set)."""

    @property
    def label(self) -> str:
        return f"{self.node}/gpu-{self.gpu}"


@dataclass(frozen=True, slots=True)
class NodeOrDevice:
    """One device (`gpu` set), or every device of a node."""

    node: str
    gpu: int | None = None
    not_before: float | None = None
    """`released` only: no rung of the release walk began before this many scenario seconds (a
    device whose failure evidence stands until then, e.g. a driver's taint, is held)."""

    @property
    def label(self) -> str:
        return self.node if self.gpu is None else f"{self.node}/gpu-{self.gpu}"


@dataclass(frozen=True, slots=True)
class HeldExpectation:
    """A device that ends the run Quarantined and excluded, never Released on the way."""

    node: str
    gpu: int
    failed_attempts: Count | None = None
    """Release attempts that went back to Quarantined (a rung left for a failure); None: any."""

    @property
    def label(self) -> str:
        return f"{self.node}/gpu-{self.gpu}"


@dataclass(frozen=True, slots=True)
class AlertExpectation:
    """An alert by name, optionally on one node or one device."""

    name: str
    node: str | None = None
    gpu: int | None = None

    @property
    def label(self) -> str:
        where = self.node if self.gpu is None else f"{self.node}/gpu-{self.gpu}"
        return f"{self.name} on {where}" if where else self.name


@dataclass(frozen=True, slots=True)
class RampExpectation:
    """A device whose ramp took a job that opted in to it (`ramp:`)."""

    node: str
    gpu: int
    job: str
    """`namespace/name` of the opted-in workload a pod of which must land on the device during its
    ramp."""

    @property
    def label(self) -> str:
        return f"{self.node}/gpu-{self.gpu}"


@dataclass(frozen=True, slots=True)
class TenantEventExpectation:
    """Kubernetes Events for tenants with this reason (and namespace), counted."""

    reason: str
    namespace: str | None = None
    count: Count = Count(min=1)


@dataclass(frozen=True, slots=True)
class ChecksExpectation:
    """The probes and canaries of the run: each ran on its record's device (`onDevice`), and how
    many passed."""

    on_device: bool = False
    passed: Count | None = None


@dataclass(frozen=True, slots=True)
class RequestExpectation:
    """A person's release request of a device, answered so (and for this reason)."""

    node: str
    gpu: int
    answer: str
    """`honoured` or `refused`."""
    reason: str | None = None
    """The answer's reason (`FailureStands`, `Honoured`, `RefusedByCommand`, ...); None: any."""

    @property
    def label(self) -> str:
        return f"{self.node}/gpu-{self.gpu}"


@dataclass(frozen=True, slots=True)
class OutageExpectation:
    """What happened while the responders' health source was down (`demo.healthSourceDown`):
    devices enforced, moves that succeeded, releases."""

    enforced: Count | None = None
    succeeded: Count | None = None
    released: Count | None = None


@dataclass(frozen=True, slots=True)
class Latency:
    """A bound on detection latency: `seconds`, plus the journal's floor when `over_floor`."""

    seconds: float
    over_floor: bool = False

    def bound(self, journal: Journal) -> float:
        # An entry may be stamped up to one observation late (Journal.resolution_seconds).
        floor = journal.floor_seconds if self.over_floor else 0.0
        return floor + self.seconds + journal.resolution_seconds

    def describe(self) -> str:
        text = _seconds(self.seconds)
        return f"the pipeline's floor + {text}" if self.over_floor else text


@dataclass(frozen=True, slots=True)
class Expectations:
    """Everything a scenario's `expect:` section states; every part optional."""

    quarantined: tuple[DeviceExpectation, ...] = ()
    restricted: tuple[DeviceExpectation, ...] = ()
    untouched: tuple[NodeOrDevice, ...] = ()
    released: tuple[NodeOrDevice, ...] = ()
    quarantined_at_end: tuple[HeldExpectation, ...] = ()
    alerts_fired: tuple[AlertExpectation, ...] = ()
    alerts_not_fired: tuple[AlertExpectation, ...] = ()
    migrations: Mapping[str, Count] | None = None
    evictions: Count | None = None
    enforced_devices: Count | None = None
    phases: Mapping[str, Count] | None = None
    breaker: str | None = None
    """`tripped` or `closed`."""
    tenant_events: tuple[TenantEventExpectation, ...] = ()
    tenant_events_total: Count | None = None
    node_actions: Count | None = None
    escalated: tuple[str, ...] | None = None
    """Nodes gpuhealth escalated (its `gpuhealth.io/node-escalated` taint): exactly these."""
    escalations_lifted: tuple[str, ...] = ()
    """Nodes whose escalation taint was lifted by the end of the run (and not put back)."""
    max_detection_latency: Latency | None = None
    stopped_before_checkpoint: Count | None = None
    """Pods behind the `gpuhealth.io/serving` readiness gate that were out of their Services'
    endpoints (not Ready) when their checkpoint was first requested. A gated pod asked while
    still Ready is a failure line of its own whenever this is stated."""
    ramp: tuple[RampExpectation, ...] = ()
    checks: ChecksExpectation | None = None
    release_requests: tuple[RequestExpectation, ...] = ()
    health_source_down: OutageExpectation | None = None
    resets: Mapping[str, Count] | None = None
    """GPU resets the cluster's reset controller finished, by outcome (`succeeded`, `failed`):
    one per card and request."""

    def empty(self) -> bool:
        return self == Expectations()


_TOP = {
    "quarantined",
    "restricted",
    "untouched",
    "released",
    "quarantinedAtEnd",
    "alerts",
    "migrations",
    "evictions",
    "enforcedDevices",
    "phases",
    "breaker",
    "tenantEvents",
    "nodeActions",
    "escalated",
    "escalationsLifted",
    "maxDetectionLatency",
    "stoppedBeforeCheckpoint",
    "ramp",
    "checks",
    "releaseRequests",
    "healthSourceDown",
    "resets",
}
ANSWERS = ("honoured", "refused")


class _Reader(FieldReader):
    """The scenario parser's typed field access, its refusals worded for this section.

    The raw section comes without line numbers (the simulator keeps it as plain data), so a
    refusal names the file and the field path: `x.yaml: expect.quarantined[0].gpu: ...`.
    """

    def __init__(self, source: str, nodes: Mapping[str, NodeGroup] | None) -> None:
        super().__init__(source, {})
        self.nodes = nodes

    def fail(self, path: _Path, message: str) -> NoReturn:
        raise ExpectationError(f"{self.source}: {format_path(('expect', *path))}: {message}")

    def items(self, value: Any, path: _Path) -> list[Any]:
        items = self.sequence(value, path)
        if len(items) > _MAX_LIST:
            self.fail(path, f"more than {_MAX_LIST} items")
        return items

    def text(self, value: Any, path: _Path) -> str:
        if not self.string(value, path):
            self.fail(path, "must not be empty")
        return str(value)

    def whole(self, value: Any, path: _Path, high: int = _MAX_COUNT) -> int:
        return self.integer(value, path, 0, high)

    def within(self, value: Any, path: _Path) -> float:
        seconds = self.duration(value, path)
        if seconds > _MAX_LATENCY:
            self.fail(path, f"longer than {_seconds(_MAX_LATENCY)}: no run lasts that long")
        return seconds

    def count(self, value: Any, path: _Path) -> Count:
        """A whole number (exactly that many) or `{min: a, max: b}` (either may be left out)."""
        if not isinstance(value, dict):
            n = self.whole(value, path)
            return Count(n, n)
        data = self.mapping(value, path, ("min", "max"))
        if not data:
            self.fail(path, "give min, max or both")
        low = self.whole(data["min"], (*path, "min")) if "min" in data else 0
        high = self.whole(data["max"], (*path, "max")) if "max" in data else None
        if high is not None and high < low:
            self.fail((*path, "max"), f"{high} is below min ({low})")
        return Count(low, high)

    def node(self, value: Any, path: _Path) -> str:
        name = self.text(value, path)
        if self.nodes is not None and name not in self.nodes:
            self.fail(path, f"no node {name!r} in the scenario's fleet")
        return name

    def gpu(self, value: Any, path: _Path, node: str) -> int:
        group = self.nodes.get(node) if self.nodes is not None else None
        if group is None:
            return self.whole(value, path, 1023)
        index = self.whole(value, path)
        if index >= group.gpus_per_node:
            self.fail(path, f"{index} is out of range (node {node} has {group.gpus_per_node} GPUs)")
        return index


def parse(raw: Any, source: str, *, nodes: Mapping[str, NodeGroup] | None = None) -> Expectations:
    """The `expect:` section `raw` of the scenario read from `source` (None or {}: nothing expected).

    With `nodes` (the scenario's nodes by name), every node must exist, every GPU index be in
    range and every `path` be the node's own: a misspelt device is an error here, not a failed
    expectation after a five-minute run.
    """
    r = _Reader(source, nodes)
    if raw is None:
        return Expectations()
    data = r.mapping(raw, (), _TOP)
    alerts = r.mapping(data.get("alerts", {}), ("alerts",), ("fired", "notFired"))
    fired = _alerts(r, alerts.get("fired", []), ("alerts", "fired"))
    not_fired = _alerts(r, alerts.get("notFired", []), ("alerts", "notFired"))
    clash = {a for a in fired} & {a for a in not_fired}
    if clash:
        r.fail(("alerts", "notFired"), f"{sorted(clash, key=str)[0].label} is also in alerts.fired")
    tenant_events, tenant_total = _tenant_events(r, data.get("tenantEvents"))
    expectations = Expectations(
        quarantined=_devices(r, data.get("quarantined", []), ("quarantined",), reasons=True),
        restricted=_devices(r, data.get("restricted", []), ("restricted",), reasons=False),
        untouched=_places(r, data.get("untouched", []), ("untouched",), whole_node=True),
        released=_places(r, data.get("released", []), ("released",), whole_node=False, not_before=True),
        quarantined_at_end=_held(r, data.get("quarantinedAtEnd", []), ("quarantinedAtEnd",)),
        alerts_fired=fired,
        alerts_not_fired=not_fired,
        migrations=_counts(r, data, "migrations", MIGRATION_OUTCOMES),
        resets=_counts(r, data, "resets", RESET_OUTCOMES),
        evictions=r.count(data["evictions"], ("evictions",)) if "evictions" in data else None,
        enforced_devices=(
            r.count(data["enforcedDevices"], ("enforcedDevices",)) if "enforcedDevices" in data else None
        ),
        phases=_counts(r, data, "phases", PHASES),
        breaker=r.choice(data["breaker"], ("breaker",), ("tripped", "closed")) if "breaker" in data else None,
        tenant_events=tenant_events,
        tenant_events_total=tenant_total,
        node_actions=r.count(data["nodeActions"], ("nodeActions",)) if "nodeActions" in data else None,
        escalated=_escalated(r, data["escalated"], "escalated") if "escalated" in data else None,
        escalations_lifted=(
            _escalated(r, data["escalationsLifted"], "escalationsLifted")
            if "escalationsLifted" in data
            else ()
        ),
        max_detection_latency=_latency(r, data),
        stopped_before_checkpoint=(
            r.count(data["stoppedBeforeCheckpoint"], ("stoppedBeforeCheckpoint",))
            if "stoppedBeforeCheckpoint" in data
            else None
        ),
        ramp=_ramps(r, data.get("ramp", [])),
        checks=_checks(r, data["checks"]) if "checks" in data else None,
        release_requests=_requests(r, data.get("releaseRequests", [])),
        health_source_down=_outage(r, data["healthSourceDown"]) if "healthSourceDown" in data else None,
    )
    _check_consistent(r, expectations)
    return expectations


def _devices(r: _Reader, raw: Any, path: _Path, *, reasons: bool) -> tuple[DeviceExpectation, ...]:
    out: list[DeviceExpectation] = []
    allowed = ("node", "gpu", "reason", "path", "within") if reasons else ("node", "gpu", "path", "within")
    for i, item in enumerate(r.items(raw, path)):
        here = (*path, i)
        data = r.mapping(item, here, allowed)
        node = _required_node(r, data, here)
        gpu = r.gpu(r.required(data, "gpu", here), (*here, "gpu"), node)
        reason = r.text(data["reason"], (*here, "reason")) if "reason" in data else None
        if reason == UNKNOWN_REASON:
            r.fail(
                (*here, "reason"), "Unknown is the reason of a restriction: list the device under restricted"
            )
        device_path = r.choice(data["path"], (*here, "path"), PATHS) if "path" in data else None
        group = r.nodes.get(node) if r.nodes is not None else None
        if device_path is not None and group is not None and group.path != device_path:
            r.fail((*here, "path"), f"node {node} is on the {group.path} path, not {device_path}")
        within = r.within(data["within"], (*here, "within")) if "within" in data else None
        out.append(DeviceExpectation(node, gpu, reason, device_path, within))
    return tuple(out)


def _escalated(r: _Reader, raw: Any, key: str) -> tuple[str, ...]:
    """`escalated:` (or `escalationsLifted:`): nodes of the fleet."""
    return tuple(r.node(n, (key, i)) for i, n in enumerate(r.items(raw, (key,))))


def _held(r: _Reader, raw: Any, path: _Path) -> tuple[HeldExpectation, ...]:
    out: list[HeldExpectation] = []
    for i, item in enumerate(r.items(raw, path)):
        here = (*path, i)
        data = r.mapping(item, here, ("node", "gpu", "failedAttempts"))
        node = _required_node(r, data, here)
        gpu = r.gpu(r.required(data, "gpu", here), (*here, "gpu"), node)
        failed = (
            r.count(data["failedAttempts"], (*here, "failedAttempts")) if "failedAttempts" in data else None
        )
        out.append(HeldExpectation(node, gpu, failed))
    return tuple(out)


def _places(
    r: _Reader, raw: Any, path: _Path, *, whole_node: bool, not_before: bool = False
) -> tuple[NodeOrDevice, ...]:
    out: list[NodeOrDevice] = []
    for i, item in enumerate(r.items(raw, path)):
        here = (*path, i)
        data = r.mapping(item, here, ("node", "gpu", "notBefore") if not_before else ("node", "gpu"))
        node = _required_node(r, data, here)
        if "gpu" not in data and not whole_node:
            r.fail((*here, "gpu"), "is required")
        gpu = r.gpu(data["gpu"], (*here, "gpu"), node) if "gpu" in data else None
        after = r.within(data["notBefore"], (*here, "notBefore")) if "notBefore" in data else None
        out.append(NodeOrDevice(node, gpu, after))
    return tuple(out)


def _ramps(r: _Reader, raw: Any) -> tuple[RampExpectation, ...]:
    out: list[RampExpectation] = []
    path: _Path = ("ramp",)
    for i, item in enumerate(r.items(raw, path)):
        here = (*path, i)
        data = r.mapping(item, here, ("node", "gpu", "job"))
        node = _required_node(r, data, here)
        gpu = r.gpu(r.required(data, "gpu", here), (*here, "gpu"), node)
        job = r.text(r.required(data, "job", here), (*here, "job"))
        if job.count("/") != 1 or not all(job.split("/")):
            r.fail((*here, "job"), f"{job!r} must be namespace/name")
        out.append(RampExpectation(node, gpu, job))
    return tuple(out)


def _alerts(r: _Reader, raw: Any, path: _Path) -> tuple[AlertExpectation, ...]:
    out: list[AlertExpectation] = []
    for i, item in enumerate(r.items(raw, path)):
        here = (*path, i)
        if isinstance(item, str):
            out.append(AlertExpectation(r.text(item, here)))
            continue
        data = r.mapping(item, here, ("name", "node", "gpu"))
        name = r.text(r.required(data, "name", here), (*here, "name"))
        node = r.node(data["node"], (*here, "node")) if "node" in data else None
        gpu = None
        if "gpu" in data:
            if node is None:
                r.fail((*here, "node"), "is required with gpu")
            gpu = r.gpu(data["gpu"], (*here, "gpu"), node)
        out.append(AlertExpectation(name, node, gpu))
    return tuple(out)


def _tenant_events(r: _Reader, raw: Any) -> tuple[tuple[TenantEventExpectation, ...], Count | None]:
    path: _Path = ("tenantEvents",)
    if raw is None:
        return (), None
    if not isinstance(raw, list):
        return (), r.count(raw, path)
    out: list[TenantEventExpectation] = []
    for i, item in enumerate(r.items(raw, path)):
        here = (*path, i)
        data = r.mapping(item, here, ("reason", "namespace", "count"))
        reason = r.text(r.required(data, "reason", here), (*here, "reason"))
        namespace = r.text(data["namespace"], (*here, "namespace")) if "namespace" in data else None
        count = r.count(data["count"], (*here, "count")) if "count" in data else Count(min=1)
        out.append(TenantEventExpectation(reason, namespace, count))
    return tuple(out), None


def _counts(
    r: _Reader, data: Mapping[str, Any], key: str, names: Iterable[str]
) -> Mapping[str, Count] | None:
    if key not in data:
        return None
    raw = r.mapping(data[key], (key,), names)
    if not raw:
        r.fail((key,), f"give at least one of: {', '.join(names)}")
    return {str(name): r.count(value, (key, str(name))) for name, value in raw.items()}


def _latency(r: _Reader, data: Mapping[str, Any]) -> Latency | None:
    path: _Path = ("maxDetectionLatency",)
    if "maxDetectionLatency" not in data:
        return None
    raw = data["maxDetectionLatency"]
    if isinstance(raw, dict):
        body = r.mapping(raw, path, ("overFloor",))
        return Latency(r.duration(r.required(body, "overFloor", path), (*path, "overFloor")), over_floor=True)
    return Latency(r.within(raw, path))


def _checks(r: _Reader, raw: Any) -> ChecksExpectation:
    path: _Path = ("checks",)
    data = r.mapping(raw, path, ("onDevice", "passed"))
    if not data:
        r.fail(path, "give onDevice, passed or both")
    on_device = False
    if "onDevice" in data:
        if not isinstance(data["onDevice"], bool):
            r.fail((*path, "onDevice"), f"expected true or false, got {data['onDevice']!r}")
        on_device = data["onDevice"]
    passed = r.count(data["passed"], (*path, "passed")) if "passed" in data else None
    return ChecksExpectation(on_device, passed)


def _requests(r: _Reader, raw: Any) -> tuple[RequestExpectation, ...]:
    path: _Path = ("releaseRequests",)
    out: list[RequestExpectation] = []
    for i, item in enumerate(r.items(raw, path)):
        here = (*path, i)
        data = r.mapping(item, here, ("node", "gpu", "answer", "reason"))
        node = _required_node(r, data, here)
        gpu = r.gpu(r.required(data, "gpu", here), (*here, "gpu"), node)
        answer = r.choice(r.required(data, "answer", here), (*here, "answer"), ANSWERS)
        reason = r.text(data["reason"], (*here, "reason")) if "reason" in data else None
        out.append(RequestExpectation(node, gpu, str(answer), reason))
    return tuple(out)


def _outage(r: _Reader, raw: Any) -> OutageExpectation:
    path: _Path = ("healthSourceDown",)
    data = r.mapping(raw, path, ("enforced", "succeeded", "released"))
    if not data:
        r.fail(path, "give at least one of: enforced, succeeded, released")
    counts = {key: r.count(value, (*path, key)) for key, value in data.items()}
    return OutageExpectation(counts.get("enforced"), counts.get("succeeded"), counts.get("released"))


def _required_node(r: _Reader, data: Mapping[str, Any], path: _Path) -> str:
    return r.node(r.required(data, "node", path), (*path, "node"))


def _check_consistent(r: _Reader, e: Expectations) -> None:
    """Refuse a section that contradicts itself: it could never be met."""
    acted: dict[tuple[str, int], tuple[str, int]] = {}
    for key, items in (("quarantined", e.quarantined), ("restricted", e.restricted)):
        for i, item in enumerate(items):
            place = (item.node, item.gpu)
            if place in acted:
                other = f"{acted[place][0]}[{acted[place][1]}]"
                r.fail((key, i), f"{item.label} is already expected in {other}")
            acted[place] = (key, i)
    for i, spot in enumerate(e.untouched):
        for (node, gpu), (key, j) in acted.items():
            if node == spot.node and spot.gpu in (None, gpu):
                r.fail(("untouched", i), f"{spot.label} contradicts {key}[{j}] ({node}/gpu-{gpu})")
        for j, released in enumerate(e.released):
            if released.node == spot.node and spot.gpu in (None, released.gpu):
                r.fail(("untouched", i), f"{spot.label} contradicts released[{j}] ({released.label})")
    for i, held in enumerate(e.quarantined_at_end):
        for j, released in enumerate(e.released):
            if (released.node, released.gpu) == (held.node, held.gpu):
                r.fail(("quarantinedAtEnd", i), f"{held.label} is also expected in released[{j}]")
        for spot in e.untouched:
            if spot.node == held.node and spot.gpu in (None, held.gpu):
                r.fail(("quarantinedAtEnd", i), f"{held.label} contradicts untouched ({spot.label})")
    if e.breaker == "closed" and e.phases is not None and e.phases.get("Deferred", Count()).min > 0:
        r.fail(("phases", "Deferred"), "only an open breaker defers devices (breaker: closed)")


# ---------------------------------------------------------------------------- the check


def check(scenario: Scenario, journal: Journal) -> list[str]:
    """Each of `scenario`'s expectations that the run in `journal` did not meet, as one line.

    ExpectationError when the section itself is invalid (the demo refuses it before running).
    """
    return evaluate(parse(scenario.expect, scenario.source, nodes=scenario.nodes), journal)


def evaluate(expectations: Expectations, journal: Journal) -> list[str]:
    """One line per expectation `journal` does not meet; empty: every one held."""
    view = _View(journal)
    failures: list[str] = []
    for item in expectations.quarantined:
        failures += _quarantined(view, item, expectations.max_detection_latency)
    for item in expectations.restricted:
        failures += _restricted(view, item)
    for spot in expectations.untouched:
        failures += _untouched(view, spot)
    for spot in expectations.released:
        failures += _released(view, spot)
    for held in expectations.quarantined_at_end:
        failures += _held_at_end(view, held)
    for ramp in expectations.ramp:
        failures += _ramp(view, ramp)
    for alert in expectations.alerts_fired:
        if not view.alerts(alert):
            failures.append(f"alert {alert.label}: expected to fire, never did{view.fired_hint(alert.name)}")
    for alert in expectations.alerts_not_fired:
        seen = view.alerts(alert)
        if seen:
            failures.append(f"alert {alert.label}: expected not to fire, fired {_where(view, seen)}")
    failures += _tallies(view, expectations)
    if expectations.checks is not None:
        failures += _checks_held(view, expectations.checks)
    for request in expectations.release_requests:
        failures += _request_held(view, request)
    if expectations.health_source_down is not None:
        failures += _outage_held(view, expectations.health_source_down)
    return failures


def _checks_held(view: _View, want: ChecksExpectation) -> list[str]:
    checks = view.of_kind(Kind.CHECK)
    out: list[str] = []
    if want.on_device:
        if not checks:
            out.append("checks: expected probes and canaries on their devices, none ran")
        for e in checks:
            ran_on = [d for d in e.detail.get("ranOn", "").split(",") if d]
            if ran_on != [e.device]:
                where = ", ".join(view.journal.label(d) for d in ran_on) or "no device seen"
                out.append(
                    f"checks: the {e.what} at t+{e.at:.0f}s for {view.journal.label(e.device)} ran on {where}"
                )
    passed = sum(1 for e in checks if e.detail.get("result") == "passed")
    if want.passed is not None and not want.passed.holds(passed):
        out.append(f"checks passed: expected {want.passed.describe()}, got {passed}")
    return out


def _request_held(view: _View, want: RequestExpectation) -> list[str]:
    uuid = view.uuid(want.node, want.gpu)
    answers = [e for e in view.of(Kind.REQUEST, uuid or "") if e.what in ANSWERS]
    if any(e.what == want.answer and want.reason in (None, e.detail.get("reason")) for e in answers):
        return []
    why = f" ({want.reason})" if want.reason else ""
    seen = ", ".join(f"{e.what} ({e.detail.get('reason', '?')}) at t+{e.at:.0f}s" for e in answers)
    return [
        f"release request of {want.label}: expected {want.answer}{why}; "
        + (f"got {seen}" if seen else "no answer")
    ]


def _outage_held(view: _View, want: OutageExpectation) -> list[str]:
    spans: list[tuple[float, float]] = []
    since: float | None = None
    for e in view.of_kind(Kind.HEALTH_SOURCE):
        if e.what == "down" and since is None:
            since = e.at
        elif e.what == "up" and since is not None:
            spans.append((since, e.at))
            since = None
    if since is not None:
        spans.append((since, math.inf))
    if not spans:
        return ["healthSourceDown: the health source never went down in this run"]

    def during(e: Entry) -> bool:
        return any(a <= e.at < b for a, b in spans)

    enforced = {e.device for e in view.of_kind(Kind.ENFORCED) if e.what == _QUARANTINE and during(e)}
    succeeded = [e for e in view.of_kind(Kind.MIGRATION) if e.what == "succeeded" and during(e)]
    released = {e.device for e in view.of_kind(Kind.PHASE) if e.what == "Released" and during(e)}
    out: list[str] = []
    for label, count, n in (
        ("devices enforced", want.enforced, len(enforced)),
        ("moves succeeded", want.succeeded, len(succeeded)),
        ("devices released", want.released, len(released)),
    ):
        if count is not None and not count.holds(n):
            out.append(f"healthSourceDown: {label} while it was down: expected {count.describe()}, got {n}")
    return out


class _View:
    """The journal indexed for the questions expectations ask."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.uuid_of = {(d.node, d.index): uuid for uuid, d in journal.devices.items()}
        self.entries = sorted(journal.entries, key=lambda e: e.at)

    def uuid(self, node: str, gpu: int) -> str | None:
        return self.uuid_of.get((node, gpu))

    def uuids(self, spot: NodeOrDevice) -> list[str]:
        if spot.gpu is not None:
            uuid = self.uuid(spot.node, spot.gpu)
            return [uuid] if uuid else []
        return [uuid for (node, _), uuid in sorted(self.uuid_of.items()) if node == spot.node]

    def of(self, kind: Kind, uuid: str, what: str | None = None) -> list[Entry]:
        return [e for e in self.entries if e.kind == kind and e.device == uuid and what in (None, e.what)]

    def evictions(self, uuid: str) -> list[Entry]:
        # An eviction names one of the pod's devices; `devices` lists them all.
        return [
            e
            for e in self.entries
            if e.kind == Kind.EVICTION
            and (e.device == uuid or uuid in e.detail.get("devices", "").split(","))
        ]

    def alerts(self, alert: AlertExpectation) -> list[Entry]:
        uuid = self.uuid(alert.node, alert.gpu) if alert.node is not None and alert.gpu is not None else None
        return [
            e
            for e in self.entries
            if e.kind == Kind.ALERT_FIRING
            and e.what == alert.name
            and (alert.node is None or e.node == alert.node)
            and (alert.gpu is None or (uuid is not None and e.device == uuid))
        ]

    def fired_hint(self, name: str) -> str:
        where = sorted(
            {self.where(e) for e in self.entries if e.kind == Kind.ALERT_FIRING and e.what == name}
        )
        return f" (it fired on {', '.join(where[:5])})" if where else ""

    def where(self, entry: Entry) -> str:
        if entry.device:
            return self.journal.label(entry.device)
        return entry.node or "the fleet"

    def of_kind(self, kind: Kind) -> list[Entry]:
        return [e for e in self.entries if e.kind == kind]

    def phases(self, uuid: str) -> list[str]:
        return [e.what for e in self.of(Kind.PHASE, uuid)]


def _where(view: _View, entries: list[Entry]) -> str:
    places = sorted({view.where(e) for e in entries})
    shown = ", ".join(places[:5]) + (f" and {len(places) - 5} more" if len(places) > 5 else "")
    return f"at t+{entries[0].at:.0f}s on {shown}"


def _enforcement(
    view: _View, item: DeviceExpectation, uuid: str, restrict: bool
) -> tuple[list[str], Entry | None]:
    """Problems with `item`'s enforcement, and its first enforcement entry."""
    kind_word = "restricted" if restrict else "quarantined"
    quarantined = [
        e
        for e in view.of(Kind.PHASE, uuid, "Quarantined")
        if (e.detail.get("reason") == UNKNOWN_REASON) == restrict
        and (item.reason is None or e.detail.get("reason") == item.reason)
    ]
    enforced = view.of(Kind.ENFORCED, uuid, _QUARANTINE)
    problems: list[str] = []
    if not quarantined:
        reasons = sorted({e.detail.get("reason", "?") for e in view.of(Kind.PHASE, uuid)})
        phases = ", ".join(dict.fromkeys(view.phases(uuid)))
        seen = f"phases seen: {phases} (reasons: {', '.join(reasons)})" if reasons else "no record at all"
        want = f" with reason {item.reason}" if item.reason else (" with reason Unknown" if restrict else "")
        problems.append(f"never reached Quarantined{want}; {seen}")
    if not enforced:
        problems.append("never enforced (no DeviceTaintRule or node annotation seen)")
    elif item.path is not None:
        mechanism = "rule" if item.path == DRA else "annotation"
        if not any(mechanism in e.detail for e in enforced):
            kinds = {k for e in enforced for k in e.detail if k in ("rule", "annotation")}
            how = ", ".join(sorted(kinds)) or "?"
            problems.append(f"enforced through {how}, not the {item.path} path's {mechanism}")
    return [f"{kind_word} {_describe(item)}: {p}" for p in problems], (enforced[0] if enforced else None)


def _describe(item: DeviceExpectation) -> str:
    extras = [f"reason {item.reason}"] if item.reason else []
    extras += [f"path {item.path}"] if item.path else []
    return f"{item.label} ({', '.join(extras)})" if extras else item.label


def _latency_problem(view: _View, uuid: str, enforced: Entry, bound: float, said: str) -> str | None:
    device = view.journal.devices.get(uuid)
    # A node fault (a dead or stale health stream) is a fault of each of the node's devices.
    node_faults = [
        e for e in view.entries if e.kind == Kind.FAULT and not e.device and device and e.node == device.node
    ]
    faults = sorted([*view.of(Kind.FAULT, uuid), *node_faults], key=lambda e: e.at)
    if not faults:
        return "enforced with no fault recorded on the device"
    latency = enforced.at - faults[0].at
    if latency > bound:
        return (
            f"enforced {_seconds(latency)} after its first fault (t+{faults[0].at:.0f}s), "
            f"more than {said} (bound {_seconds(bound)} with the journal's resolution)"
        )
    return None


def _quarantined(view: _View, item: DeviceExpectation, default: Latency | None) -> list[str]:
    uuid = view.uuid(item.node, item.gpu)
    if uuid is None:
        return [f"quarantined {item.label}: not a device of the run's fleet"]
    problems, enforced = _enforcement(view, item, uuid, restrict=False)
    latency = Latency(item.within) if item.within is not None else default
    if enforced is not None and latency is not None:
        problem = _latency_problem(view, uuid, enforced, latency.bound(view.journal), latency.describe())
        if problem:
            problems.append(f"quarantined {_describe(item)}: {problem}")
    return problems


def _restricted(view: _View, item: DeviceExpectation) -> list[str]:
    uuid = view.uuid(item.node, item.gpu)
    if uuid is None:
        return [f"restricted {item.label}: not a device of the run's fleet"]
    problems, enforced = _enforcement(view, item, uuid, restrict=True)
    if enforced is not None and item.within is not None:
        bound = Latency(item.within).bound(view.journal)
        problem = _latency_problem(view, uuid, enforced, bound, _seconds(item.within))
        if problem:
            problems.append(f"restricted {item.label}: {problem}")
    # A restriction never moves work: nothing on the device may be evicted or migrated.
    evicted = view.evictions(uuid)
    if evicted:
        problems.append(f"restricted {item.label}: {len(evicted)} eviction(s) of its pods, {evicted[0].what}")
    migrated = view.of(Kind.MIGRATION, uuid)
    if migrated:
        problems.append(f"restricted {item.label}: a migration ({migrated[0].what}) of its work")
    return problems


def _untouched(view: _View, spot: NodeOrDevice) -> list[str]:
    uuids = view.uuids(spot)
    if not uuids:
        return [f"untouched {spot.label}: no such device in the run's fleet"]
    problems: list[str] = []
    for uuid in uuids:
        # The device itself acted on: a record, an exclusion, a migration of its work. A pod
        # evicted because a sibling device of its job failed is the job's move, not this
        # device's (`evictions:` counts every eviction).
        acts = [e for e in view.entries if e.device == uuid and e.kind in _ACTS]
        if acts:
            problems.append(
                f"untouched {view.journal.label(uuid)}: acted on at t+{acts[0].at:.0f}s "
                f"({acts[0].kind.value} {acts[0].what}) and {len(acts) - 1} more"
            )
    return problems


def _released(view: _View, spot: NodeOrDevice) -> list[str]:
    assert spot.gpu is not None  # the parser requires it
    uuid = view.uuid(spot.node, spot.gpu)
    if uuid is None:
        return [f"released {spot.label}: not a device of the run's fleet"]
    phases = view.phases(uuid)
    walked = _subsequence(phases, RELEASE_WALK)
    problems: list[str] = []
    if walked < len(RELEASE_WALK):
        shown = _sequence(phases) or "no record"
        problems.append(f"did not walk {WALK}: stopped before {RELEASE_WALK[walked]} ({shown})")
    released_at = next((e.at for e in reversed(view.of(Kind.PHASE, uuid, "Released"))), math.inf)
    for check_kind in (r.name for r in LADDER.checks()):
        passed = [e for e in view.of(Kind.CHECK, uuid, check_kind) if e.detail.get("result") == "passed"]
        if not passed or passed[0].at > released_at:
            problems.append(f"no passed {check_kind} before release")
    marks = [e for e in view.entries if e.device == uuid and e.kind in (Kind.ENFORCED, Kind.LIFTED)]
    if marks and marks[-1].kind == Kind.ENFORCED:
        problems.append(f"still excluded at the end ({marks[-1].what} since t+{marks[-1].at:.0f}s)")
    if spot.not_before is not None:
        early = [e for e in view.of(Kind.PHASE, uuid, RELEASE_WALK[0]) if e.at < spot.not_before]
        if early:
            problems.append(
                f"began its release walk at t+{early[0].at:.0f}s, before t+{spot.not_before:.0f}s (notBefore)"
            )
    return [f"released {spot.label}: {p}" for p in problems]


def _held_at_end(view: _View, held: HeldExpectation) -> list[str]:
    uuid = view.uuid(held.node, held.gpu)
    if uuid is None:
        return [f"quarantinedAtEnd {held.label}: not a device of the run's fleet"]
    phases = view.phases(uuid)
    problems: list[str] = []
    if "Released" in phases:
        at = view.of(Kind.PHASE, uuid, "Released")[0].at
        problems.append(f"released at t+{at:.0f}s ({_sequence(phases)})")
    if not phases or phases[-1] != "Quarantined":
        problems.append(f"ends in {phases[-1] if phases else 'no record'}, not Quarantined")
    marks = [e for e in view.entries if e.device == uuid and e.kind in (Kind.ENFORCED, Kind.LIFTED)]
    if not marks or marks[-1].kind != Kind.ENFORCED:
        problems.append("not excluded at the end")
    if held.failed_attempts is not None:
        # A rung of the ladder followed by Quarantined: an attempt that failed and was counted.
        failed = sum(1 for a, b in itertools.pairwise(phases) if a in CLIMBING and b == "Quarantined")
        if not held.failed_attempts.holds(failed):
            problems.append(
                f"failed release attempts: expected {held.failed_attempts.describe()}, got {failed} "
                f"({_sequence(phases)})"
            )
    return [f"quarantinedAtEnd {held.label}: {p}" for p in problems]


def _ramp(view: _View, item: RampExpectation) -> list[str]:
    """The device ramped with a pod of `item.job` on it, and while its record was active
    (Quarantined until Released) no pod landed on it but opted-in ones during a Ramp."""
    uuid = view.uuid(item.node, item.gpu)
    if uuid is None:
        return [f"ramp {item.label}: not a device of the run's fleet"]
    phases = view.of(Kind.PHASE, uuid)
    late = view.journal.resolution_seconds  # a pod is seen running up to one observation late
    ramps = [
        (e.at, phases[i + 1].at + late if i + 1 < len(phases) else math.inf)
        for i, e in enumerate(phases)
        if e.what == RAMP
    ]
    if not ramps:
        shown = _sequence([e.what for e in phases]) or "no record"
        return [f"ramp {item.label}: never reached {RAMP} ({shown})"]
    placed = [
        e
        for e in view.entries
        if e.kind == Kind.NOTE and e.what == "placed" and uuid in e.detail.get("devices", "").split(",")
    ]
    problems: list[str] = []
    if not any(e.detail.get("job") == item.job and any(a <= e.at < b for a, b in ramps) for e in placed):
        others = sorted({e.detail.get("job", "?") for e in placed})
        seen = f" (placed there: {', '.join(others)})" if others else " (no pod was placed there)"
        problems.append(f"no pod of {item.job} was placed on it during its ramp{seen}")
    quarantined = [e.at for e in phases if e.what == "Quarantined"]
    released = [e.at for e in phases if e.what == "Released"]
    for e in placed:
        active = any(q <= e.at and not any(q <= r < e.at for r in released) for q in quarantined)
        ramping = any(a <= e.at < b for a, b in ramps)
        opted = e.detail.get("optedIn") == "true"
        if active and not (ramping and opted):
            why = "it did not opt in" if not opted else "the device was not on its ramp"
            problems.append(
                f"{e.detail.get('pod', '?')} was placed on it at t+{e.at:.0f}s before its release ({why})"
            )
    return [f"ramp {item.label}: {p}" for p in problems]


def _sequence(phases: list[str], keep: int = 4) -> str:
    """`phases` as an arrow chain, the middle left out when long (a device probed 400 times
    must not make a 400-phase line)."""
    if len(phases) <= 2 * keep + 1:
        return " -> ".join(phases)
    left_out = len(phases) - 2 * keep
    return " -> ".join([*phases[:keep], f"({left_out} more)", *phases[-keep:]])


def _subsequence(seen: list[str], wanted: tuple[str, ...]) -> int:
    """How many of `wanted` appear in `seen` in order (restarting after a return to Quarantined)."""
    best = done = 0
    for phase in seen:
        if phase == "Quarantined":
            done = 0  # a failed check sends the device back: the walk starts over
        elif done < len(wanted) and phase == wanted[done]:
            done += 1
        best = max(best, done)
    return best


def _tallies(view: _View, e: Expectations) -> list[str]:
    out: list[str] = []

    def compare(label: str, count: Count | None, n: int, detail: str = "") -> None:
        if count is not None and not count.holds(n):
            out.append(f"{label}: expected {count.describe()}, got {n}{detail}")

    # A job is moved once per episode of a record: the same outcome seen twice is one move.
    migrations = {
        (m.what, m.device, m.detail.get("job", ""), m.detail.get("record", ""), m.detail.get("episode", ""))
        for m in view.entries
        if m.kind == Kind.MIGRATION
    }
    for outcome, count in (e.migrations or {}).items():
        compare(f"migrations {outcome}", count, sum(1 for m in migrations if m[0] == outcome))
    resets = {(x.what, x.device, x.detail.get("request", "")) for x in view.entries if x.kind == Kind.RESET}
    for outcome, count in (e.resets or {}).items():
        compare(f"resets {outcome}", count, sum(1 for x in resets if x[0] == outcome))
    evicted = sorted({x.what for x in view.entries if x.kind == Kind.EVICTION})
    compare("evictions", e.evictions, len(evicted), f" ({', '.join(evicted[:5])})" if evicted else "")
    enforced = {x.device for x in view.entries if x.kind == Kind.ENFORCED and x.what == _QUARANTINE}
    compare("enforced devices", e.enforced_devices, len(enforced))
    for phase, count in (e.phases or {}).items():
        devices = {x.device for x in view.entries if x.kind == Kind.PHASE and x.what == phase}
        compare(f"devices entering {phase}", count, len(devices))
    if e.stopped_before_checkpoint is not None:
        asked = [
            x
            for x in view.entries
            if x.kind == Kind.NOTE and x.what == "checkpoint-requested" and x.detail.get("gated") == "true"
        ]
        stopped = sorted({x.detail.get("pod", "") for x in asked if x.detail.get("ready") == "False"})
        compare(
            "pods out of their endpoints before their checkpoint request",
            e.stopped_before_checkpoint,
            len(stopped),
        )
        serving = sorted({x.detail.get("pod", "") for x in asked if x.detail.get("ready") != "False"})
        if serving:
            out.append(
                f"checkpoint requested while still in their Services' endpoints: {', '.join(serving[:5])}"
            )
    trips = [x for x in view.entries if x.kind == Kind.BREAKER and x.what == "tripped"]
    if e.breaker == "tripped" and not trips:
        out.append("breaker: expected to trip, never did")
    if e.breaker == "closed" and trips:
        trigger = trips[0].detail.get("trigger", "?")
        out.append(f"breaker: expected to stay closed, tripped at t+{trips[0].at:.0f}s (trigger {trigger})")
    events = [x for x in view.entries if x.kind == Kind.TENANT_EVENT]
    compare("tenant events", e.tenant_events_total, len(events))
    for want in e.tenant_events:
        n = sum(1 for x in events if x.what == want.reason and want.namespace in (None, _namespace(x)))
        where = f" in {want.namespace}" if want.namespace else ""
        compare(f"tenant events {want.reason}{where}", want.count, n)
    actions = [x for x in view.entries if x.kind == Kind.NODE_ACTION]
    detail = f" ({actions[0].what} on {actions[0].node})" if actions else ""
    compare("node-wide actions", e.node_actions, len(actions), detail)
    if e.escalated is not None:
        taints = (x for x in actions if x.what == "taint" and x.detail.get("key") == ESCALATION_TAINT)
        got = ", ".join(sorted({x.node for x in taints})) or "none"
        wanted = ", ".join(sorted(set(e.escalated))) or "none"
        if got != wanted:
            out.append(f"escalated: expected {wanted}, got {got}")
    for node in e.escalations_lifted:
        ours = [x for x in view.entries if x.node == node and x.detail.get("key") == ESCALATION_TAINT]
        last = ours[-1] if ours else None  # the journal's order
        if last is None or last.kind is not Kind.NOTE:
            out.append(f"escalationsLifted: {node}'s escalation was not lifted by the end of the run")
    return out


def _namespace(entry: Entry) -> str:
    pod = entry.detail.get("pod", "")
    return pod.split("/", 1)[0] if "/" in pod else ""


def _seconds(value: float) -> str:
    return f"{value:.0f}s" if value >= 10 else f"{value:.1f}s"
