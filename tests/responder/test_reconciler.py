"""One reconcile pass with fakes (responder.reconcile.reconciler), no I/O.

Aspects: a Pending record is enforced, written (status through the status subresource), told
as an Event and exposed as one series; the whole release walk (probe and canary Jobs of the
attempt, stability, ramp with the canary taint, release removing the enforcement and the
series); enforcement removed by a person comes back with a warning Event; an opted-out node
waits with reason NodeOptedOut; the rate limit keeps records Pending (RateLimited) and is
rebuilt from the records by a new reconciler (no second burst, nothing enforced twice); a storm
trips the breaker within one pass (audit entry, gauge) while a release goes on; one record's
exception or 409 never stops the pass and is retried on its own backoff (Retry-After the
least), a failed pass too; a health outage (the source unreachable) still enforces a firing
alert and still calls the migrate hook while the release waits (HealthUnavailable) and the
gauge says the source is down, the breaker counting against the last fleet size seen; the
migrate hook sees only enforced
`quarantine` records, goes on after the alerts resolved while the release waits
(MigrationInFlight), and gives way to the finish hook while the breaker is open; a device a
pod holds is not probed (DeviceInUse) and pods are read only when an attempt could start;
the loop stops when its term is fenced; the guardrails
rebuilt from the records never count a device twice (property).
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Collection
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gpuhealth.clock import ManualClock
from gpuhealth.kube.backoff import WatchBackoff
from gpuhealth.kube.client import ObjectList
from gpuhealth.kube.errors import Conflict, NotFound, TooManyRequests, Unavailable
from gpuhealth.kube.meta import rfc3339
from gpuhealth.kube.resources import NODE, POD, RESOURCE_SLICE, STATUS, Resource
from responder.enforce.holders import DeviceHolders
from responder.enforce.observed import Observed
from responder.enforce.shipped import Enforcer
from responder.ladder import KNOWN, LADDER, PROBING, Kind
from responder.reconcile.breaker import BreakerSettings, BreakerState
from responder.reconcile.breaker_store import AuditEntry, Stored
from responder.reconcile.events import RecordedEvents
from responder.reconcile.health import StaticHealth
from responder.reconcile.limits import BucketSettings
from responder.reconcile.policy import (
    CANARY_TAINT,
    DEVICE_IN_USE,
    HEALTH_UNAVAILABLE,
    MIGRATING,
    QUARANTINE_TAINT,
    CheckResult,
    Enforce,
    Health,
    PolicySettings,
)
from responder.reconcile.reconciler import (
    OPT_OUT_LABEL,
    UNWATCHED_RECHECK_SECONDS,
    Reconciler,
    ReconcilerSettings,
    guardrails,
    quarantine_starts,
)
from responder.records import (
    QUARANTINES,
    CheckOutcome,
    Migration,
    MigrationOutcome,
    Phase,
    Quarantine,
    Verdict,
    from_object,
    to_object,
)
from responder.webhook.intake import IntakeSettings, Write, decide
from tests.responder.test_intake import alert
from tests.support.backends import identified
from tests.support.ladders import check_names, minute_rungs

NOW = 1_800_000_000.0
POLICY = PolicySettings(**{**minute_rungs(), "stability_seconds": 120.0}, backoff_seconds=300)
"""Every rung a minute long, the stability window two."""
SETTINGS = ReconcilerSettings(policy=POLICY, bucket=BucketSettings(burst=5, per_hour=60))


# ----- fakes ------------------------------------------------------------------------------------


class FakeClient:
    """Records and nodes in memory with resourceVersions, the status subresource and 409s."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self._rv = 0
        self.conflict_once: set[str] = set()
        """Record names whose next update answers 409 (someone wrote meanwhile)."""
        self.pods: list[dict[str, Any]] = []
        """Pods on the nodes (device-plugin: the device in allocatedResourcesStatus)."""
        self.pod_lists = 0
        self.node_errors: list[Exception] = []
        """Errors the next reads of a node answer, one each."""
        self.list_errors: list[Exception] = []
        """Errors the next lists of the records answer, one each."""

    def _next(self) -> str:
        self._rv += 1
        return str(self._rv)

    def add(self, record: Quarantine, created: float = NOW) -> None:
        obj = to_object(record)
        obj["metadata"].update(
            uid=f"uid-{record.name}",
            resourceVersion=self._next(),
            creationTimestamp=rfc3339(created)[:19] + "Z",
        )
        self.objects[record.name] = obj

    def record(self, name: str) -> Quarantine:
        return from_object(self.objects[name])

    def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> ObjectList:
        if resource == POD:
            node = (field_selector or "").removeprefix("spec.nodeName=")
            self.pod_lists += 1
            pods = [p for p in self.pods if not field_selector or p["spec"]["nodeName"] == node]
            return ObjectList(copy.deepcopy(pods), str(self._rv))
        if resource == RESOURCE_SLICE:
            return ObjectList([], str(self._rv))  # no DRA driver publishes devices here
        assert resource == QUARANTINES
        if self.list_errors:
            raise self.list_errors.pop(0)
        return ObjectList([copy.deepcopy(o) for o in self.objects.values()], str(self._rv))

    def get(self, resource: Resource, name: str) -> dict[str, Any]:
        if resource == NODE and self.node_errors:
            raise self.node_errors.pop(0)
        if resource == NODE and name in self.nodes:
            return copy.deepcopy(self.nodes[name])
        raise NotFound(f"{resource.plural} {name} not found")

    def update(
        self, resource: Resource, obj: dict[str, Any], *, subresource: str | None = None
    ) -> dict[str, Any]:
        assert resource == QUARANTINES
        name = obj["metadata"]["name"]
        stored = self.objects[name]
        if name in self.conflict_once:
            self.conflict_once.discard(name)
            stored["metadata"]["resourceVersion"] = self._next()
        if obj["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]:
            raise Conflict(f"{name}: the object has been modified")
        updated = copy.deepcopy(stored)
        if subresource == STATUS:
            updated["status"] = copy.deepcopy(obj["status"])
        else:
            assert subresource is None
            updated["spec"] = copy.deepcopy(obj["spec"])  # the status subresource keeps status
        updated["metadata"]["resourceVersion"] = self._next()
        self.objects[name] = updated
        return copy.deepcopy(updated)


class FakeEnforcer:
    """Enforcement in memory; the identities and names are the shipped backends' (no slices).
    The pass's reads (nodes) go to the client it is given."""

    def __init__(self, client: Any = None) -> None:
        self.taints: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.failing: set[str] = set()
        self.unclaimed: set[str] = set()
        """Records whose device no backend claims (no slice publishes it, no node advertises it)."""
        self._names = Enforcer(None, None)
        self.client = client
        self.observed: list[Observed] = []

    def observe(
        self, nodes: Collection[str] = (), *, list_nodes: bool = False, page_size: int = 500
    ) -> Observed:
        seen = Observed(self.client)
        self.observed.append(seen)
        return seen

    def identify(
        self,
        record: Quarantine,
        seen: Observed,
        partitions: tuple[str, ...] = (),
        profiles: tuple[tuple[str, str], ...] = (),
    ) -> Quarantine:
        return record if record.name in self.unclaimed else identified(record)

    def enforced_as(self, record: Quarantine) -> str:
        return self._names.enforced_as(record)

    def holds_card(self, record: Quarantine) -> bool:
        return self._names.holds_card(record)

    def present(
        self, record: Quarantine, wanted: Enforce | None = None, seen: Observed | None = None
    ) -> bool:
        return record.name in self.taints and (wanted is None or self.taints[record.name] == wanted.taint_key)

    def enforce(self, record: Quarantine, effect: Enforce, seen: Observed | None = None) -> None:
        if record.name in self.failing:
            raise RuntimeError("the apiserver refused the rule")
        self.calls.append(("enforce", record.name))
        self.taints[record.name] = effect.taint_key

    def unenforce(self, record: Quarantine, seen: Observed | None = None) -> None:
        self.calls.append(("unenforce", record.name))
        self.taints.pop(record.name, None)


class FakeChecks:
    def __init__(self) -> None:
        self.results: dict[tuple[str, str, int], CheckResult] = {}
        self.started: list[tuple[str, str, int]] = []
        self.finished: list[tuple[str, str, int]] = []

    def start(self, record: Quarantine, kind: str, attempt: int) -> None:
        key = (record.name, kind, attempt)
        if key not in self.results:
            self.started.append(key)
            self.results[key] = CheckResult.RUNNING

    def result(self, record: Quarantine, kind: str, attempt: int) -> CheckResult:
        return self.results.get((record.name, kind, attempt), CheckResult.ABSENT)

    def complete(self, record: Quarantine, kind: str, result: CheckResult) -> None:
        self.results[(record.name, kind, record.status.attempt)] = result

    def finish(self, record: Quarantine, kind: str, attempt: int) -> None:
        self.finished.append((record.name, kind, attempt))


class FakeBreakerStore:
    def __init__(self) -> None:
        self.state = BreakerState()
        self.history: list[AuditEntry] = []

    def read(self) -> Stored:
        return Stored(self.state, tuple(self.history))

    def write(self, state: BreakerState, entry: AuditEntry) -> Stored:
        self.state = state
        self.history.append(entry)
        return self.read()


class Harness:
    def __init__(self, settings: ReconcilerSettings = SETTINGS, **kwargs: Any) -> None:
        self.clock = ManualClock(NOW)
        self.client = FakeClient()
        self.enforcer = FakeEnforcer(self.client)
        self.checks = FakeChecks()
        self.store = FakeBreakerStore()
        self.events = RecordedEvents()
        self.health = StaticHealth()
        for i in range(100):
            self.health.set("gpu-node-9", f"GPU-other-{i}", Health.HEALTHY, NOW - 86400)
        self.settings = settings
        self.kwargs = kwargs
        self.registry = CollectorRegistry()
        self.reconciler = self.new_reconciler()

    def new_reconciler(self) -> Reconciler:
        """Another reconciler over the same cluster (a restart, a new leader)."""
        self.registry = CollectorRegistry()
        # Who holds a device: the shipped backends' answer over the fake cluster's pods.
        kwargs = {"holders": DeviceHolders(self.client, Enforcer(self.client, None)), **self.kwargs}
        return Reconciler(
            self.client,
            enforcer=self.enforcer,
            health=self.health,
            checks=self.checks,
            events=self.events,
            breaker_store=self.store,
            settings=self.settings,
            clock=self.clock,
            registry=self.registry,
            **kwargs,
        )

    def add(
        self,
        device: str = "GPU-4a1c",
        *,
        person: bool = False,
        action: str = "quarantine",
        node: str = "gpu-node-1",
    ) -> str:
        decision = decide(
            None,
            alert(device=device, action=action, node=node),
            now=self.clock.now(),
            settings=IntakeSettings(),
        )
        assert isinstance(decision, Write)
        record = decision.record
        if person:
            record = replace(record, spec=replace(record.spec, actor="person/alice"))
        self.client.add(record, created=self.clock.now())
        self.health.set(record.spec.node, record.spec.device, Health.UNHEALTHY)
        return record.name

    def resolve(self, name: str, *, healthy: bool = True) -> None:
        """The record's alerts resolve; with `healthy`, because its device reads Healthy again (an
        Unhealthy alert resolves when the report it fired on is gone)."""
        obj = self.client.objects[name]
        for source in obj["spec"]["sourceAlerts"]:
            source["resolvedAt"] = rfc3339(self.clock.now())
        obj["metadata"]["resourceVersion"] = self.client._next()
        if healthy:
            spec = obj["spec"]
            self.health.set(spec["node"], spec["device"], Health.HEALTHY, self.clock.now())

    def phase(self, name: str) -> Phase:
        return self.client.record(name).status.phase

    def sample(self, metric: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(metric, labels)


# ----- the walk ---------------------------------------------------------------------------------


def test_a_pending_record_is_enforced_written_told_and_exposed() -> None:
    h = Harness()
    name = h.add()
    report = h.reconciler.reconcile_once()
    assert report.outcomes == {name: "written"}
    record = h.client.record(name)
    assert record.status.phase == Phase.QUARANTINED
    assert record.status.enforced.startswith("Node/")
    assert h.enforcer.taints == {name: QUARANTINE_TAINT}
    assert h.events.reasons(name) == ["Quarantined"]
    assert report.next_seconds == 0.0  # the policy asks to look again at once
    labels = {"node": "gpu-node-1", "device": "GPU-4a1c", "reason": record.spec.reason}
    assert h.sample("gpuhealth_device_quarantined", **labels, phase="Quarantined") == 1.0
    assert (
        h.sample("gpuhealth_quarantine_created_timestamp_seconds", node="gpu-node-1", device="GPU-4a1c")
        == NOW
    )
    assert h.sample("gpuhealth_breaker_tripped") == 0.0
    assert h.sample("gpuhealth_responder_reconcile_passes_total") == 1.0
    # Level-triggered: the next pass finds nothing to do and does nothing again.
    assert h.reconciler.reconcile_once().outcomes == {name: "unchanged"}
    assert h.enforcer.calls == [("enforce", name)]


def test_a_device_no_backend_claims_is_neither_guessed_nor_enforced_until_one_does() -> None:
    h = Harness()
    name = h.add()
    assert h.client.record(name).spec.path == ""  # the webhook records what the alert says
    h.enforcer.unclaimed.add(name)
    report = h.reconciler.reconcile_once()
    record = h.client.record(name)
    assert record.status.phase == Phase.PENDING and not record.status.enforced
    assert record.spec.path == "" and h.enforcer.calls == []
    condition = record.status.condition("Identified")
    assert condition is not None and (condition.status, condition.reason) == ("False", "NoBackendClaims")
    assert "nothing is enforced" in condition.message
    assert report.next_seconds is not None and report.next_seconds <= 5.0  # looked at again soon
    assert h.reconciler.reconcile_once().outcomes == {name: "unchanged"}  # written once
    h.enforcer.unclaimed.clear()  # its node's device plugin registered
    h.reconciler.reconcile_once()
    record = h.client.record(name)
    assert record.spec.path == "device-plugin" and record.status.phase == Phase.QUARANTINED
    assert record.status.condition("Identified") is None
    assert h.enforcer.calls == [("enforce", name)]


def test_the_release_walk_from_probe_to_released() -> None:
    h = Harness()
    name = h.add()
    h.reconciler.reconcile_once()
    h.resolve(name)
    h.clock.advance(10)
    h.reconciler.reconcile_once()
    for rung in POLICY.rungs.rungs[:-1]:  # the ladder with its lengths from the settings
        assert h.phase(name) == rung.phase
        if rung.kind == Kind.CHECK:
            # Each check's Job of the attempt is started on its rung, and its pass moves on.
            assert h.checks.started[-1] == (name, rung.name, 1)
            h.checks.complete(h.client.record(name), rung.name, CheckResult.SUCCEEDED)
        else:
            # A window lasts its length exactly: still on it a second before.
            h.clock.advance(rung.seconds - 1)
            h.reconciler.reconcile_once()
            assert h.phase(name) == rung.phase
            h.clock.advance(1)
        h.reconciler.reconcile_once()
    assert [kind for _, kind, _ in h.checks.started] == check_names()
    assert h.checks.finished == [(name, check, 1) for check in check_names()]
    executed = [r.name for r in KNOWN.timed_out()]
    checks = {
        (check, verdict): h.sample("gpuhealth_release_checks_total", check=check, verdict=verdict)
        for check in executed
        for verdict in ("passed", "failed")
    }
    # Each verdict once, counted when recorded; every series from zero (the reset's too).
    assert checks == {
        (c, v): 1.0 if (v == "passed" and c in check_names()) else 0.0
        for c in executed
        for v in ("passed", "failed")
    }
    assert "reset" in executed and ("reset", "passed") in checks
    h.reconciler.reconcile_once()
    assert all(
        h.sample("gpuhealth_release_checks_total", check=c, verdict="passed") == 1.0 for c in check_names()
    )
    ramp = POLICY.rungs.rungs[-1]
    assert h.phase(name) == ramp.phase and ramp.kind == Kind.RAMP
    assert h.enforcer.taints[name] == CANARY_TAINT == ramp.taint
    # Every outcome is exported from zero, so the first release shows in increase().
    assert h.sample("gpuhealth_responder_releases_total", outcome="released") == 0.0
    h.clock.advance(ramp.seconds - 1)
    h.reconciler.reconcile_once()
    assert h.phase(name) == ramp.phase  # the ramp lasts its length exactly too
    h.clock.advance(1)
    h.reconciler.reconcile_once()
    assert h.phase(name) == Phase.RELEASED
    assert name not in h.enforcer.taints
    assert h.sample("gpuhealth_responder_releases_total", outcome="released") == 1.0
    assert h.sample("gpuhealth_responder_releases_total", outcome="abandoned") is None  # never counted
    reason = h.client.record(name).spec.reason
    for phase in Phase:
        labels = {"node": "gpu-node-1", "device": "GPU-4a1c", "reason": reason, "phase": phase.value}
        assert h.sample("gpuhealth_device_quarantined", **labels) is None
    assert (
        h.sample("gpuhealth_quarantine_created_timestamp_seconds", node="gpu-node-1", device="GPU-4a1c")
        is None
    )


def test_a_failed_probe_extends_the_quarantine_and_writes_the_spec() -> None:
    h = Harness()
    name = h.add()
    h.reconciler.reconcile_once()
    before = h.client.record(name).spec.expires_at
    h.resolve(name)
    h.reconciler.reconcile_once()
    h.checks.complete(h.client.record(name), "probe", CheckResult.FAILED)
    h.reconciler.reconcile_once()
    record = h.client.record(name)
    assert record.status.phase == Phase.QUARANTINED
    assert record.status.failures == 1 and record.status.last_check == CheckOutcome(
        "probe", 1, Verdict.FAILED
    )
    # The day the intake gave it outlasts the first backoff: a failure never shortens it.
    assert record.spec.expires_at == before
    assert record.status.retry_at == rfc3339(h.clock.now() + POLICY.backoff_seconds)
    assert "ReleaseFailed" in h.events.reasons(name)
    assert h.sample("gpuhealth_release_checks_total", check="probe", verdict="failed") == 1.0
    assert h.sample("gpuhealth_release_checks_total", check="probe", verdict="passed") == 0.0


def test_after_a_failed_probe_the_next_one_starts_only_when_the_backoff_ran_out() -> None:
    h = Harness()
    name = h.add()
    h.reconciler.reconcile_once()
    h.resolve(name)
    h.reconciler.reconcile_once()
    h.checks.complete(h.client.record(name), "probe", CheckResult.FAILED)
    h.reconciler.reconcile_once()
    # The alerts stay resolved and the device looks healthy: passes go on, no second probe.
    h.clock.advance(POLICY.backoff_seconds - 1)
    h.reconciler.reconcile_once()
    record = h.client.record(name)
    assert (record.status.phase, record.status.phase_reason) == (Phase.QUARANTINED, "BackingOff")
    assert h.checks.started == [(name, "probe", 1)]
    h.clock.advance(1)
    h.reconciler.reconcile_once()
    assert h.phase(name) == PROBING
    assert h.checks.started == [(name, "probe", 1), (name, "probe", 2)]


def test_enforcement_removed_by_a_person_comes_back_with_a_warning() -> None:
    h = Harness()
    name = h.add()
    h.reconciler.reconcile_once()
    h.enforcer.taints.clear()  # a person deleted the rule
    h.reconciler.reconcile_once()
    assert h.phase(name) == Phase.QUARANTINED  # never Abandoned
    assert h.enforcer.calls == [("enforce", name), ("enforce", name)]  # put back
    assert name in h.enforcer.taints
    assert any(r == "EnforcementRestored" and warning for _, r, _, warning in h.events.notices)
    assert h.sample("gpuhealth_responder_releases_total", outcome="abandoned") is None  # never counted


def test_an_opted_out_node_waits_with_its_reason() -> None:
    h = Harness()
    h.client.nodes["gpu-node-1"] = {"metadata": {"name": "gpu-node-1", "labels": {OPT_OUT_LABEL: "disabled"}}}
    name = h.add()
    h.reconciler.reconcile_once()
    record = h.client.record(name)
    assert (record.status.phase, record.status.phase_reason) == (Phase.PENDING, "NodeOptedOut")
    assert h.enforcer.calls == []
    assert h.reconciler.reconcile_once().outcomes == {name: "unchanged"}


def test_the_rate_limit_is_rebuilt_from_the_records_by_a_new_reconciler() -> None:
    settings = replace(SETTINGS, bucket=BucketSettings(burst=2, per_hour=1))
    h = Harness(settings)
    names = [h.add(f"GPU-{i}") for i in range(3)]
    h.reconciler.reconcile_once()
    assert [h.phase(n) for n in names] == [Phase.QUARANTINED, Phase.QUARANTINED, Phase.PENDING]
    assert h.client.record(names[2]).status.phase_reason == "RateLimited"
    assert h.sample("gpuhealth_responder_rate_limited_quarantines") == 1.0
    # A restart: a new object, the same cluster. No second burst, nothing enforced twice.
    h.reconciler = h.new_reconciler()
    h.add("GPU-9")
    h.reconciler.reconcile_once()
    assert h.phase(names[2]) == Phase.PENDING
    assert sorted(h.enforcer.calls) == sorted(("enforce", n) for n in names[:2])
    # A person's quarantine is not rate limited.
    person = h.add("GPU-person", person=True)
    h.reconciler.reconcile_once()
    assert h.phase(person) == Phase.QUARANTINED


def test_a_storm_trips_the_breaker_in_one_pass_and_releases_go_on() -> None:
    h = Harness(replace(SETTINGS, bucket=BucketSettings(burst=100, per_hour=100)))
    first = h.add("GPU-first")
    h.reconciler.reconcile_once()
    h.resolve(first)
    h.reconciler.reconcile_once()
    assert h.phase(first) == PROBING
    storm = [h.add(f"GPU-storm-{i}") for i in range(8)]
    h.checks.complete(h.client.record(first), "probe", CheckResult.SUCCEEDED)
    h.health.set("gpu-node-1", "GPU-first", Health.HEALTHY, h.clock.now())
    h.reconciler.reconcile_once()
    # 100 + 9 devices: capacity max(15 % of 109, 4) = 16; rate max(8 % of 109, 5) = 8 within the window.
    limit = max(int(0.08 * h.health.snapshot(NOW).eligible), BreakerSettings().rate_floor)
    phases = [h.phase(n) for n in storm]
    assert phases.count(Phase.QUARANTINED) == limit - 1  # the first quarantine counts too
    assert phases.count(Phase.DEFERRED) == len(storm) - (limit - 1)
    assert h.store.state.tripped and [e.action for e in h.store.history] == ["trip"]
    assert h.sample("gpuhealth_breaker_tripped") == 1.0
    assert "BreakerOpen" in h.events.reasons()
    # The release went on while it tripped: the rung after the probe's.
    assert h.phase(first) == LADDER.phases[LADDER.phases.index(PROBING) + 1]


def test_an_admission_whose_write_is_lost_excludes_nothing_and_admits_no_one_over_the_limit() -> None:
    # Seen in the fleet-storm scenario: the webhook wrote a storm record while the pass admitted
    # it. Had the pass enforced first, the lost write would hide the exclusion from the counts and
    # let one more device in over the breaker's limit (then lift the stray exclusion again).
    h = Harness(replace(SETTINGS, bucket=BucketSettings(burst=100, per_hour=100)))
    storm = [h.add(f"GPU-storm-{i}") for i in range(12)]
    lost = storm[:2]
    h.client.conflict_once.update(lost)
    report = h.reconciler.reconcile_once()
    assert [report.outcomes[n] for n in lost] == ["conflict", "conflict"]
    limit = max(int(0.08 * h.health.snapshot(NOW).eligible), BreakerSettings().rate_floor)
    assert not set(lost) & set(h.enforcer.taints)  # nothing excluded that no record says
    assert len(h.enforcer.taints) == limit and h.store.state.tripped
    h.reconciler.reconcile_once()
    phases = [h.phase(n) for n in storm]
    assert phases.count(Phase.QUARANTINED) == limit
    assert phases.count(Phase.DEFERRED) == len(storm) - limit
    assert all(call == "enforce" for call, _ in h.enforcer.calls)  # nothing enforced was lifted
    assert {name for _, name in h.enforcer.calls} == set(h.enforcer.taints)


def test_one_records_exception_or_conflict_never_stops_the_pass() -> None:
    h = Harness()
    broken, conflicted, fine = h.add("GPU-a"), h.add("GPU-b"), h.add("GPU-c")
    h.enforcer.failing.add(broken)
    h.client.conflict_once.add(conflicted)
    report = h.reconciler.reconcile_once()
    assert report.outcomes == {broken: "error", conflicted: "conflict", fine: "written"}
    assert h.sample("gpuhealth_responder_reconcile_records_total", outcome="error") == 1.0
    h.enforcer.failing.clear()
    h.reconciler.reconcile_once()
    assert {h.phase(n) for n in (broken, conflicted, fine)} == {Phase.QUARANTINED}


def test_a_lost_event_does_not_hold_the_phase_back() -> None:
    h = Harness()
    name = h.add()

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("events are forbidden")

    h.events.emit = refuse  # type: ignore[method-assign]
    assert h.reconciler.reconcile_once().outcomes == {name: "written"}
    assert h.phase(name) == Phase.QUARANTINED


STEADY = replace(SETTINGS, retry_backoff=WatchBackoff(initial_seconds=1.0, max_seconds=8.0, jitter=0.0))
"""Retries without jitter, so each pause is exact."""


def test_an_api_outage_decides_nothing_and_is_tried_again_with_a_growing_backoff() -> None:
    h = Harness(STEADY)
    name = h.add()
    h.client.list_errors = [Unavailable("503 injected", status=503)] * 5
    pauses = []
    for _ in range(5):
        report = h.reconciler.reconcile_once()
        assert report.skipped
        pauses.append(report.next_seconds)
    # Not the whole recheck cap (30 s) per failure: 1, 2, 4, 8 s, capped.
    assert pauses == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert h.phase(name) == Phase.PENDING and h.enforcer.calls == []
    assert h.reconciler.reconcile_once().outcomes == {name: "written"}
    h.client.list_errors = [Unavailable("503 injected", status=503)]
    assert h.reconciler.reconcile_once().next_seconds == 1.0  # a success started the backoff over


def test_a_health_outage_enforces_and_moves_and_holds_only_the_release() -> None:
    moved: list[str] = []

    def migrate(record: Quarantine, now: float) -> Quarantine:
        moved.append(record.name)
        return record

    h = Harness(migrate=migrate)
    name = h.add()
    h.health.failing = True
    report = h.reconciler.reconcile_once()
    assert not report.skipped and report.outcomes == {name: "written"}
    assert h.phase(name) == Phase.QUARANTINED and h.enforcer.taints == {name: QUARANTINE_TAINT}
    assert h.sample("gpuhealth_responder_health_source_up") == 0.0
    h.reconciler.reconcile_once()
    assert moved == [name]  # the move of its work goes on too
    # The alerts resolve while the source is still away: the release attempt waits for it.
    h.resolve(name)
    h.clock.advance(10)
    h.reconciler.reconcile_once()
    record = h.client.record(name)
    assert (record.status.phase, record.status.phase_reason) == (Phase.QUARANTINED, HEALTH_UNAVAILABLE)
    assert record.status.attempt == 0 and h.checks.started == [] and record.status.failures == 0
    h.health.failing = False
    h.health.set("gpu-node-1", "GPU-4a1c", Health.HEALTHY, h.clock.now())
    h.reconciler.reconcile_once()
    assert h.phase(name) == PROBING and h.sample("gpuhealth_responder_health_source_up") == 1.0


def test_a_health_outage_counts_the_breaker_against_the_last_fleet_size_seen() -> None:
    """100 devices known: 6 quarantines at once, over the floors (5 in the window, 4 under
    quarantine) but under 8 % and 15 % of 100, are admitted; a reconciler that never heard from
    the source counts against its floors only (the capacity floor of 4 trips it)."""
    h = Harness(replace(SETTINGS, bucket=BucketSettings(burst=50, per_hour=600)))
    h.reconciler.reconcile_once()  # the source answers once: 100 devices
    h.health.failing = True
    names = [h.add(f"GPU-s{i}", node=f"gpu-node-{i}") for i in range(6)]
    h.reconciler.reconcile_once()
    assert [h.phase(n) for n in names] == [Phase.QUARANTINED] * 6
    assert not h.store.state.tripped
    fresh = Harness(replace(SETTINGS, bucket=BucketSettings(burst=50, per_hour=600)))
    fresh.health.failing = True
    names = [fresh.add(f"GPU-s{i}", node=f"gpu-node-{i}") for i in range(6)]
    fresh.reconciler.reconcile_once()
    assert sorted(fresh.phase(n) for n in names) == [Phase.DEFERRED] * 2 + [Phase.QUARANTINED] * 4
    assert fresh.store.state.tripped and "unknown number of devices" in fresh.store.state.detail


def test_a_failed_record_is_retried_on_its_own_backoff_not_the_passs() -> None:
    """A request of one record failing (reading its node's opt-out label) is that record's
    retry: it is looked at again after its own backoff (at least a server's Retry-After), not
    after the recheck cap, and the other records are decided in the same pass."""
    h = Harness(STEADY)
    name = h.add("GPU-a")
    h.client.node_errors = [Unavailable("503 injected", status=503)] * 2
    pauses = []
    for _ in range(3):
        report = h.reconciler.reconcile_once()
        pauses.append((report.outcomes[name], report.next_seconds))
    assert pauses == [("error", 1.0), ("error", 2.0), ("written", 0.0)]
    assert h.phase(name) == Phase.QUARANTINED
    # The next failure starts from the first pause again; a 429's Retry-After is the least pause.
    other = h.add("GPU-b", node="gpu-node-2")
    late = h.add("GPU-c", node="gpu-node-3")
    h.client.node_errors = [TooManyRequests("429 injected", retry_after=5.0)]
    report = h.reconciler.reconcile_once()
    assert report.outcomes[other] == "error" and report.outcomes[late] == "written"
    assert h.phase(late) == Phase.QUARANTINED  # decided in the same pass as the failure
    assert report.next_seconds == 0.0  # the written record asks to be looked at again at once
    h.client.node_errors = [Unavailable("503 injected", status=503)]
    report = h.reconciler.reconcile_once()
    # Its second failure in a row: the backoff grew (1 s, then 2 s), whatever Retry-After said before.
    assert report.outcomes[other] == "error" and report.next_seconds == 2.0


def test_the_migrate_hook_sees_only_enforced_quarantine_records() -> None:
    seen: list[str] = []

    def migrate(record: Quarantine, now: float) -> Quarantine:
        seen.append(record.name)
        return record.with_phase(Phase.QUARANTINED, time=rfc3339(now), actor="migrator", message="moved")

    h = Harness(migrate=migrate)
    moved = h.add("GPU-q")
    restricted = h.add("GPU-r", action="restrict")
    h.reconciler.reconcile_once()
    assert seen == []  # enforcement must be observed first
    h.reconciler.reconcile_once()
    assert seen == [moved]
    assert h.client.record(moved).status.history[-1].actor == "migrator"
    assert h.phase(restricted) == Phase.QUARANTINED


def test_a_migration_in_flight_or_a_running_check_is_looked_at_again_soon() -> None:
    # A move waits on pods and a check on its Job, neither watched: without a short recheck the
    # move advanced only at the 30-second cap and a probe was read only at its timeout.
    def migrate(record: Quarantine, now: float) -> Quarantine:
        waiting = Migration("ns", "Job/train", "job-uid", "key", detail="waiting for 1 checkpoint(s)")
        return record.with_migrations([waiting])

    h = Harness(migrate=migrate)
    h.add("GPU-q")
    h.reconciler.reconcile_once()  # enforced: the policy looks again at once
    assert h.reconciler.reconcile_once().next_seconds == UNWATCHED_RECHECK_SECONDS
    finished = Harness(migrate=lambda r, now: r)
    name = finished.add("GPU-q")
    finished.reconciler.reconcile_once()
    assert finished.reconciler.reconcile_once().next_seconds > UNWATCHED_RECHECK_SECONDS
    finished.resolve(name)
    finished.clock.advance(10)
    report = finished.reconciler.reconcile_once()
    assert finished.phase(name) == PROBING and POLICY.probe_timeout_seconds > UNWATCHED_RECHECK_SECONDS
    assert report.next_seconds == UNWATCHED_RECHECK_SECONDS


async def test_the_loop_stops_when_fenced_and_acts_no_more() -> None:
    h = Harness()
    name = h.add()
    task = asyncio.create_task(h.reconciler.run())
    for _ in range(3000):  # a deadline of at least 30 s, however slow the machine
        if h.phase(name) == Phase.QUARANTINED:
            break
        await asyncio.sleep(0.01)
    assert h.phase(name) == Phase.QUARANTINED
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    reason = h.client.record(name).spec.reason
    labels = {"node": "gpu-node-1", "device": "GPU-4a1c", "reason": reason, "phase": "Quarantined"}
    assert h.sample("gpuhealth_device_quarantined", **labels) is None  # a non-leader exposes none
    passes = h.sample("gpuhealth_responder_reconcile_passes_total")
    later = h.add("GPU-after")
    # Not "nothing happened yet": `run` returns only after its pass thread has finished, so no
    # pass is running or can start; the record stays Pending for good.
    assert h.phase(later) == Phase.PENDING
    assert h.sample("gpuhealth_responder_reconcile_passes_total") == passes


def test_a_fenced_pass_stops_before_acting() -> None:
    h = Harness()
    name = h.add()
    fence = threading.Event()
    fence.set()
    report = h.reconciler.reconcile_once(fence)
    assert report.skipped == "fenced"
    assert h.phase(name) == Phase.PENDING and h.enforcer.calls == []


def test_the_created_time_is_the_current_quarantines_not_the_objects() -> None:
    h = Harness()
    name = h.add()
    h.reconciler.reconcile_once()
    key = {"node": "gpu-node-1", "device": "GPU-4a1c"}
    assert h.sample("gpuhealth_quarantine_created_timestamp_seconds", **key) == NOW
    # Released, then the device fails again weeks later: the same object, a new quarantine.
    obj = h.client.objects[name]
    record = h.client.record(name).with_phase(
        Phase.RELEASED, time=rfc3339(NOW + 100), actor="responder", message="released"
    )
    reopened = record.with_phase(
        Phase.PENDING, time=rfc3339(NOW + 86400 * 20), actor="webhook", message="new"
    )
    obj["status"] = to_object(reopened)["status"]
    h.clock.advance(86400 * 20)
    h.reconciler.reconcile_once()
    assert h.sample("gpuhealth_quarantine_created_timestamp_seconds", **key) == NOW + 86400 * 20


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from([Phase.PENDING, Phase.QUARANTINED, Phase.RELEASED])),
        max_size=12,
    )
)
def test_guardrails_count_each_device_once(entries: list[tuple[int, Phase]]) -> None:
    records = []
    for i, (device, phase) in enumerate(entries):
        decision = decide(None, alert(device=f"GPU-{device}"), now=NOW, settings=IntakeSettings())
        assert isinstance(decision, Write)
        record = decision.record
        if phase != Phase.PENDING:
            record = record.with_phase(
                Phase.QUARANTINED, time=rfc3339(NOW + i), actor="responder", message=""
            )
        if phase == Phase.RELEASED:
            record = record.with_phase(Phase.RELEASED, time=rfc3339(NOW + i), actor="responder", message="")
        records.append(record)
    counts, bucket = guardrails(records, 1000, BreakerState(), now=NOW + 100, settings=SETTINGS)
    enforced = {r.spec.device for r in records if r.status.phase == Phase.QUARANTINED}
    started = {r.spec.device for r in records if quarantine_starts(r)}
    assert counts.quarantined == len(enforced)
    assert counts.started_in_window == len(started)
    # Every recorded start took a token: the rebuilt bucket is never fuller than the live one was.
    total = sum(len(quarantine_starts(r)) for r in records)
    assert (
        bucket.tokens <= max(0.0, SETTINGS.bucket.burst - total) + 100 / SETTINGS.bucket.refill_seconds + 1e-9
    )


def plugin_pod(name: str, dev: str, node: str = "gpu-node-1", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "lab", "uid": f"uid-{name}", "labels": labels},
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"allocatedResourcesStatus": [{"name": "nvidia.com/gpu", "resources": [{"resourceID": dev}]}]}
            ],
        },
    }


def test_a_move_goes_on_after_the_alerts_resolved_and_the_release_waits_for_it() -> None:
    """Found by `gpuhealth chaos` (seed 2): the record left Quarantined with its move Waiting,
    the job's pods evicted, no outcome ever written. Now the move is advanced to its end and
    only then does the release attempt start."""
    done = {"moved": False}

    def migrate(record: Quarantine, now: float) -> Quarantine:
        outcome = MigrationOutcome.SUCCEEDED if done["moved"] else MigrationOutcome.WAITING
        return record.with_migrations([Migration("research", "Job/train", "uid-train", "k", outcome=outcome)])

    h = Harness(migrate=migrate)
    name = h.add()
    h.reconciler.reconcile_once()  # enforced
    h.reconciler.reconcile_once()  # the move starts
    h.resolve(name)
    h.health.set("gpu-node-1", "GPU-4a1c", Health.HEALTHY, h.clock.now())
    for _ in range(3):
        h.clock.advance(10)
        h.reconciler.reconcile_once()
        record = h.client.record(name)
        assert (record.status.phase, record.status.phase_reason) == (Phase.QUARANTINED, MIGRATING)
    assert h.checks.started == []
    done["moved"] = True
    h.reconciler.reconcile_once()  # the migrator writes the move's end
    h.reconciler.reconcile_once()  # and the release attempt starts
    record = h.client.record(name)
    assert record.status.migrations[0].outcome is MigrationOutcome.SUCCEEDED
    assert record.status.phase == PROBING and h.checks.started == [(name, "probe", 1)]


def test_a_device_a_pod_still_holds_is_not_probed_and_its_pods_are_read_only_then() -> None:
    h = Harness()
    name = h.add(action="restrict")
    h.client.pods = [
        plugin_pod("notebook-0", "GPU-4a1c"),
        plugin_pod("probe-0", "GPU-4a1c", **{"gpuhealth.io/check": "probe"}),  # our own: not a holder
        plugin_pod("other-0", "GPU-other"),
    ]
    h.reconciler.reconcile_once()
    h.reconciler.reconcile_once()
    assert h.phase(name) == Phase.QUARANTINED and h.client.pod_lists == 0  # alerts firing: no read
    h.resolve(name)
    h.health.set("gpu-node-1", "GPU-4a1c", Health.HEALTHY, h.clock.now())
    h.reconciler.reconcile_once()
    record = h.client.record(name)
    assert (record.status.phase, record.status.phase_reason) == (Phase.QUARANTINED, DEVICE_IN_USE)
    assert (
        "lab/notebook-0" in record.status.history[-1].message
        and "probe-0" not in record.status.history[-1].message
    )
    assert h.checks.started == [] and record.status.failures == 0
    h.client.pods[0]["status"]["phase"] = "Succeeded"  # the notebook ended
    h.reconciler.reconcile_once()
    assert h.phase(name) == PROBING and h.checks.started == [(name, "probe", 1)]
    lists = h.client.pod_lists
    h.reconciler.reconcile_once()
    assert h.client.pod_lists == lists  # Probing: nobody's pods are read any more


def test_an_open_breaker_lets_a_move_under_way_end_through_the_finish_hook() -> None:
    calls: list[str] = []

    def migrate(record: Quarantine, now: float) -> Quarantine:
        calls.append("migrate")
        return record

    def finish(record: Quarantine, now: float) -> Quarantine:
        calls.append("finish")
        return record

    h = Harness(migrate=migrate, finish=finish)
    h.add()
    h.reconciler.reconcile_once()
    h.reconciler.reconcile_once()
    assert calls == ["migrate"]
    h.store.state = BreakerState(tripped=True, trigger="rate", detail="storm")
    h.reconciler.reconcile_once()
    assert calls == ["migrate", "finish"]
    # Without a finish hook nothing is advanced while the breaker is open (as before).
    bare = Harness(migrate=migrate)
    bare.add()
    bare.store.state = BreakerState(tripped=True, trigger="rate", detail="storm")
    calls.clear()
    bare.reconciler.reconcile_once()
    bare.reconciler.reconcile_once()
    assert calls == []


def test_pods_that_cannot_be_read_are_the_records_retry_and_the_policys_decision_is_kept() -> None:
    def migrate(record: Quarantine, now: float) -> Quarantine:
        raise Unavailable("503 injected", status=503)

    h = Harness(STEADY, migrate=migrate)
    name = h.add()
    h.reconciler.reconcile_once()  # enforced
    report = h.reconciler.reconcile_once()
    # Not a whole recheck (30 s) away, though the record has no move yet to say one is due.
    assert report.outcomes == {name: "error"} and report.next_seconds == 1.0
    assert h.reconciler.reconcile_once().next_seconds == 2.0
