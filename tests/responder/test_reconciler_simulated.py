"""The reconciler against the simulated cluster (kubelets, scheduler, Job controller, GC).

Aspects: a DRA record walks Pending -> Quarantined (a DeviceTaintRule owned by the record) ->
Probing (a probe Job the simulated kubelet runs on that very device, through a claim that
selects it by uuid) -> Canary -> Stabilizing -> Ramp (canary taint) -> Released (the rule
deleted), with Events on the record; on device plugins the probe asks for no GPU and reaches
its device through `NVIDIA_VISIBLE_DEVICES`, so a device that still fails fails its probe while
the node's other cards are Healthy, and a canary (its own workload) fails when its device
breaks; a person deleting the rule or the node annotation's entry sees it come back, with a
warning Event, the record never Abandoned; a device-plugin record's ramp moves its entry to the
ramp annotation with the configured bound, and an entry moved back to the quarantine list by
hand, or a DRA rule's canary taint turned back, is put back as the phase holds it, with the
Event; the release lifts both; a person's release request (spec.releaseRequest) after
a Stabilizing failure is refused with the reason (condition and Event), and one during
Stabilizing with no failure shortens the window and the ramp but still ramps; a record on an
opted-out node waits (NodeOptedOut); a storm of records trips the breaker (ConfigMap with the
trip audited) while a release still flows; a restarted reconciler (a new object, same cluster)
resumes from the records and doubles nothing.
The health source is a static fake, the reconciler's clock a ManualClock (fast policy).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gpuhealth.clock import ManualClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.elector import LeaderElector
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.meta import rfc3339
from gpuhealth.kube.resources import CONFIG_MAP, NAMESPACE, NODE, POD, STATUS, Resource
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import wait_until
from responder.checks.jobs import CANARY as CANARY_CHECK
from responder.checks.jobs import JOB, PROBE, CheckSettings, job_name
from responder.enforce.backends import Backends
from responder.enforce.hold import device_ids
from responder.enforce.node_annotation import (
    NODE_ANNOTATION,
    RAMP_ANNOTATION,
    NodeAnnotation,
    listed,
    ramping,
)
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import discover
from responder.ladder import CANARY, LADDER, PROBING, RAMP, STABILIZING, Kind
from responder.reconcile import requests
from responder.reconcile.breaker_store import NAME as BREAKER_CONFIG_MAP
from responder.reconcile.breaker_store import BreakerStore
from responder.reconcile.events import EVENT, KubeEvents
from responder.reconcile.health import StaticHealth
from responder.reconcile.limits import BucketSettings
from responder.reconcile.policy import (
    CANARY_TAINT,
    QUARANTINE_TAINT,
    STILL_UNHEALTHY,
    CheckResult,
    Health,
    PolicySettings,
)
from responder.reconcile.reconciler import OPT_OUT_LABEL, Reconciler, ReconcilerSettings
from responder.records import HELD, QUARANTINES, Phase, Quarantine, from_object, to_object
from responder.webhook.intake import IntakeSettings, Write, decide
from simulator.apiserver.faults import FaultRule
from simulator.fleet.objects import gpu_uuid
from simulator.testing import ClusterHandle, running_cluster
from tests.responder.test_intake import alert
from tests.support.backends import job_checks
from tests.support.holds import wiring

pytestmark = pytest.mark.integration

CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
NS = "gpuhealth-system"
SCENARIO: dict[str, Any] = {
    "name": "reconciler",
    "fleet": [
        {"name": "dra", "count": 1, "gpusPerNode": 4, "path": "dra"},
        {"name": "dp", "count": 2, "gpusPerNode": 4, "path": "device-plugin"},
    ],
    "workloads": [],
}
_LENGTHS: dict[str, Any] = {
    r.setting: 600.0 if r.kind == Kind.CHECK else 60.0 for r in LADDER.rungs if r.setting
}
POLICY = PolicySettings(**{**_LENGTHS, "stability_seconds": 120.0}, backoff_seconds=300)
"""Ten minutes for each check of the ladder (a Job in the simulated cluster), a minute for each
wait, two for the stability window."""


def climb(w: World, name: str, to: str, policy: PolicySettings = POLICY) -> None:
    """The record up the ladder from the rung it stands on to `to` (a phase, or Released), each
    rung in order: each check's Job runs in the simulated cluster and must pass, each wait runs
    its length."""
    rungs = policy.rungs
    while (phase := w.record(name).status.phase) != to:
        rung = rungs.rung(phase)
        assert rung is not None, phase
        if rung.kind == Kind.CHECK:
            passed = lambda check=rung.name: w.check(name, check) == CheckResult.SUCCEEDED  # noqa: E731
            wait_until(f"the {rung.name} passed", passed, timeout=60)
        else:
            w.clock.advance(rung.seconds)
        w.reconciler.reconcile_once()
        after = rungs.after(rung)
        assert w.record(name).status.phase == (after.phase if after else Phase.RELEASED)


SETTINGS = ReconcilerSettings(policy=POLICY, bucket=BucketSettings(burst=50, per_hour=60))


@dataclass
class World:
    client: KubeClient
    clock: ManualClock
    health: StaticHealth
    reconciler: Reconciler
    kubeconfig: Path
    cluster: ClusterHandle

    def new_reconciler(self, settings: ReconcilerSettings = SETTINGS) -> Reconciler:
        rules = discover(self.client)
        return Reconciler(
            self.client,
            health=self.health,
            **wiring(self.client, Enforcer(self.client, rules)),
            events=KubeEvents(self.client),
            breaker_store=BreakerStore(self.client, NS),
            settings=settings,
            clock=self.clock,
            registry=CollectorRegistry(),
        )

    def add(self, node: str, index: int, *, dra: bool) -> str:
        uuid = gpu_uuid(node, index)
        labels = (
            {
                "device": f"gpu.nvidia.com/{node}/gpu-{index}",
                "driver": "gpu.nvidia.com",
                "pool": node,
                "device_name": f"gpu-{index}",
                "uuid": uuid,
            }
            if dra
            else {"device": uuid, "uuid": uuid}
        )
        decision = decide(None, alert(node=node, **labels), now=self.clock.now(), settings=IntakeSettings())
        assert isinstance(decision, Write)
        obj = to_object(decision.record)
        status = obj.pop("status")
        created = self.client.create(QUARANTINES, obj)
        self.client.update(QUARANTINES, {**created, "status": status}, subresource=STATUS)
        self.health.set(node, labels["device"], Health.UNHEALTHY)
        return decision.record.name

    def record(self, name: str) -> Quarantine:
        return from_object(self.client.get(QUARANTINES, name))

    def resolve(self, name: str) -> None:
        obj = self.client.get(QUARANTINES, name)
        for source in obj["spec"]["sourceAlerts"]:
            source["resolvedAt"] = rfc3339(self.clock.now())
        self.client.update(QUARANTINES, obj)

    def rule(self, name: str) -> dict[str, Any] | None:
        rules = discover(self.client)
        assert rules is not None
        try:
            return self.client.get(rules, name)
        except NotFound:
            return None

    def events(self, name: str) -> list[tuple[str, str]]:
        return [
            (e["reason"], e["type"])
            for e in self.client.list(EVENT, namespace="default").items
            if e["involvedObject"].get("name") == name
        ]

    def check(self, name: str, kind: str) -> CheckResult:
        """The check's result; while its Job is absent, a reconcile pass (as the reconciler makes
        every few seconds while a device-plugin card's hold steps aside for the check)."""
        result = job_checks(self.client, CheckSettings(namespace=NS)).result(self.record(name), kind, 1)
        if result is CheckResult.ABSENT:
            self.reconciler.reconcile_once()
        return result


@pytest.fixture
def world() -> Iterator[World]:
    with running_cluster(SCENARIO, speed=10) as cluster:
        client = KubeClient(KubeTransport(api_client(str(cluster.kubeconfig_path))))
        client.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
        client.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait_until("the CRD served", lambda: client.list(QUARANTINES) is not None, timeout=20)
        health = StaticHealth()
        for node in ("dra-0", "dp-0", "dp-1"):
            for i in range(4):
                device = f"gpu.nvidia.com/{node}/gpu-{i}" if node == "dra-0" else gpu_uuid(node, i)
                health.set(node, device, Health.HEALTHY, 0.0)
        w = World(client, ManualClock(), health, None, cluster.kubeconfig_path, cluster)  # type: ignore[arg-type]
        w.reconciler = w.new_reconciler()
        try:
            yield w
        finally:
            client.close()


def test_a_dra_record_walks_from_pending_to_released(world: World) -> None:
    w = world
    name = w.add("dra-0", 3, dra=True)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == Phase.QUARANTINED
    rule = w.rule(name)
    assert rule is not None
    assert rule["spec"]["taint"]["key"] == QUARANTINE_TAINT
    assert rule["metadata"]["ownerReferences"][0]["uid"] == w.record(name).uid

    # The device recovers (its health reads Healthy again), then its alert resolves.
    w.health.set("dra-0", "gpu.nvidia.com/dra-0/gpu-3", Health.HEALTHY, w.clock.now())
    w.resolve(name)
    w.clock.advance(5)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == PROBING
    job = w.client.get(JOB, job_name(w.record(name), "probe", 1), namespace=NS)
    assert job["metadata"]["ownerReferences"][0]["name"] == name
    climb(w, name, RAMP)
    ramp_rule = w.rule(name)
    assert ramp_rule is not None and ramp_rule["spec"]["taint"]["key"] == CANARY_TAINT
    climb(w, name, Phase.RELEASED)
    assert w.rule(name) is None
    reasons = [reason for reason, _ in w.events(name)]
    assert "Quarantined" in reasons


def test_a_finished_probes_pod_goes_with_its_job_while_conflicts_are_injected(world: World) -> None:
    """`gpuhealth chaos` seed 3 (`docs/reliability.md`, finding 5): in an `api-409` window the
    probe Job's deletion lost its propagationPolicy (the fault injector had read the body), so
    the Job's default, Orphan, left its pod behind holding the card's claim, and the canary
    never got the card. Deleting the Job (Background) is all it takes: no sweep of pods by label."""
    w = world
    name = w.add("dra-0", 2, dra=True)
    w.reconciler.reconcile_once()
    w.health.set("dra-0", "gpu.nvidia.com/dra-0/gpu-2", Health.HEALTHY, w.clock.now())
    w.resolve(name)
    w.clock.advance(5)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == PROBING
    wait_until("the probe passed", lambda: w.check(name, "probe") == CheckResult.SUCCEEDED, timeout=60)
    probe = job_name(w.record(name), "probe", 1)
    assert w.client.list(POD, namespace=NS, label_selector=f"job-name={probe}").items
    # A conflict rule reads every delete's body to find its preconditions; none fires.
    w.cluster.call(lambda c: c.api_faults.configure((FaultRule("conflict", probability=0.0),)))
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == CANARY
    wait_until(
        "the probe's pod gone with its Job",
        lambda: not w.client.list(POD, namespace=NS, label_selector=f"job-name={probe}").items,
        timeout=30,
    )
    wait_until("the canary passed", lambda: w.check(name, "canary") == CheckResult.SUCCEEDED, timeout=60)


def test_a_rule_deleted_by_a_person_comes_back_with_an_event(world: World) -> None:
    w = world
    name = w.add("dra-0", 1, dra=True)
    w.reconciler.reconcile_once()
    rules = discover(w.client)
    assert rules is not None and w.rule(name) is not None
    w.client.delete(rules, name)
    assert w.rule(name) is None
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == Phase.QUARANTINED  # never Abandoned
    rule = w.rule(name)
    assert rule is not None and rule["spec"]["taint"]["key"] == QUARANTINE_TAINT
    assert ("EnforcementRestored", "Warning") in w.events(name)


def test_an_annotation_entry_deleted_by_a_person_comes_back_with_an_event(world: World) -> None:
    w = world
    uuid = gpu_uuid("dp-0", 1)
    name = w.add("dp-0", 1, dra=False)
    w.reconciler.reconcile_once()
    node = w.client.get(NODE, "dp-0")
    assert uuid in listed(node)
    node["metadata"]["annotations"].pop(NODE_ANNOTATION)
    w.client.update(NODE, node)
    assert uuid not in listed(w.client.get(NODE, "dp-0"))
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == Phase.QUARANTINED  # never Abandoned
    assert uuid in listed(w.client.get(NODE, "dp-0"))
    assert ("EnforcementRestored", "Warning") in w.events(name)


def test_a_device_plugin_ramp_is_the_ramp_annotation_and_an_altered_one_comes_back(world: World) -> None:
    w = world
    uuid = gpu_uuid("dp-1", 2)
    name = w.add("dp-1", 2, dra=False)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == Phase.QUARANTINED
    w.resolve(name)
    w.health.set("dp-1", uuid, Health.HEALTHY, w.clock.now())
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == PROBING
    climb(w, name, RAMP)
    node = w.client.get(NODE, "dp-1")
    assert uuid not in listed(node) and ramping(node) == {uuid: 1}

    # A person puts the device back on the quarantine list (or widens the bound): the ramp comes back.
    annotations = node["metadata"]["annotations"]
    annotations[NODE_ANNOTATION] = json.dumps([uuid])
    annotations[RAMP_ANNOTATION] = json.dumps({uuid: 5})
    w.client.update(NODE, node)
    w.reconciler.reconcile_once()
    node = w.client.get(NODE, "dp-1")
    assert uuid not in listed(node) and ramping(node) == {uuid: 1}
    assert w.record(name).status.phase == RAMP
    assert ("EnforcementRestored", "Warning") in w.events(name)

    w.clock.advance(POLICY.ramp_seconds)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == Phase.RELEASED
    annotations = w.client.get(NODE, "dp-1")["metadata"].get("annotations") or {}
    assert NODE_ANNOTATION not in annotations and RAMP_ANNOTATION not in annotations


def test_a_quarantine_taint_turned_canary_by_hand_is_put_back(world: World) -> None:
    w = world
    name = w.add("dra-0", 2, dra=True)
    w.reconciler.reconcile_once()
    rules = discover(w.client)
    rule = w.rule(name)
    assert rules is not None and rule is not None
    rule["spec"]["taint"]["key"] = CANARY_TAINT  # would let opted-in claims onto a quarantined device
    w.client.update(rules, rule)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == Phase.QUARANTINED
    restored = w.rule(name)
    assert restored is not None and restored["spec"]["taint"]["key"] == QUARANTINE_TAINT
    assert ("EnforcementRestored", "Warning") in w.events(name)


def climb_to_stabilizing(w: World, name: str, device: str) -> None:
    """A DRA record (quarantined) through the passing checks before it onto the stability window."""
    w.resolve(name)
    w.health.set("dra-0", device, Health.HEALTHY, w.clock.now())
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == PROBING
    climb(w, name, STABILIZING)


def request_release(w: World, name: str) -> None:
    """What `gpuhealth quarantine release` writes (or a person with the operator role by hand):
    the request in the spec, nothing in the status."""
    obj = w.client.get(QUARANTINES, name)
    request = {"actor": "person/alice", "reason": "card reseated", "requestedAt": rfc3339(w.clock.now())}
    w.client.update(QUARANTINES, {**obj, "spec": {**obj["spec"], "releaseRequest": request}})


def test_a_release_request_after_a_stabilizing_failure_is_refused_with_the_reason(world: World) -> None:
    w = world
    device = "gpu.nvidia.com/dra-0/gpu-2"
    name = w.add("dra-0", 2, dra=True)
    w.reconciler.reconcile_once()
    climb_to_stabilizing(w, name, device)
    w.health.set("dra-0", device, Health.UNHEALTHY)  # relapses while idle
    w.clock.advance(5)
    w.reconciler.reconcile_once()
    assert (w.record(name).status.phase, w.record(name).status.failures) == (Phase.QUARANTINED, 1)
    w.health.set("dra-0", device, Health.HEALTHY, w.clock.now())
    request_release(w, name)
    w.clock.advance(5)
    w.reconciler.reconcile_once()
    record = w.record(name)
    condition = record.status.condition(requests.CONDITION)
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", requests.FAILURE_STANDS)
    assert "refused: 1 failure(s) since its last release" in condition.message
    assert ("ReleaseRequestFailureStands", "Warning") in w.events(name)
    assert (record.status.phase, record.status.phase_reason) == (Phase.QUARANTINED, "BackingOff")
    rule = w.rule(name)
    assert rule is not None and rule["spec"]["taint"]["key"] == QUARANTINE_TAINT


def test_a_release_request_while_stabilizing_shortens_the_waits_and_still_ramps(world: World) -> None:
    w = world
    policy = replace(POLICY, stability_seconds=3600, ramp_seconds=3600, requested_wait_seconds=60)
    w.reconciler = w.new_reconciler(replace(SETTINGS, policy=policy))
    device = "gpu.nvidia.com/dra-0/gpu-0"
    name = w.add("dra-0", 0, dra=True)
    w.reconciler.reconcile_once()
    climb_to_stabilizing(w, name, device)
    w.clock.advance(10)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == STABILIZING  # an hour's window, 10 s in
    request_release(w, name)
    w.reconciler.reconcile_once()
    condition = w.record(name).status.condition(requests.CONDITION)
    assert condition is not None and (condition.status, condition.reason) == ("True", requests.HONOURED)
    assert ("ReleaseRequestHonoured", "Normal") in w.events(name)
    w.clock.advance(60)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == RAMP  # the window cut to a minute; the ramp still comes
    ramp_rule = w.rule(name)
    assert ramp_rule is not None and ramp_rule["spec"]["taint"]["key"] == CANARY_TAINT
    w.clock.advance(60)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == Phase.RELEASED
    assert w.rule(name) is None
    phases = [h.phase for h in w.record(name).status.history]
    assert phases.index(RAMP) > phases.index(STABILIZING) > phases.index(CANARY) > phases.index(PROBING)


def test_an_opted_out_node_waits(world: World) -> None:
    w = world
    node = w.client.get(NODE, "dp-1")
    node["metadata"].setdefault("labels", {})[OPT_OUT_LABEL] = "disabled"
    w.client.update(NODE, node)
    name = w.add("dp-1", 0, dra=False)
    w.reconciler.reconcile_once()
    record = w.record(name)
    assert (record.status.phase, record.status.phase_reason) == (Phase.PENDING, "NodeOptedOut")
    annotations = w.client.get(NODE, "dp-1")["metadata"].get("annotations") or {}
    assert "gpuhealth.io/quarantined-devices" not in annotations


def test_a_storm_trips_the_breaker_and_a_release_flows(world: World) -> None:
    w = world
    first = w.add("dra-0", 0, dra=True)
    w.reconciler.reconcile_once()
    w.health.set("dra-0", "gpu.nvidia.com/dra-0/gpu-0", Health.HEALTHY, w.clock.now())  # recovered
    w.resolve(first)
    w.reconciler.reconcile_once()
    assert w.record(first).status.phase == PROBING
    storm = [w.add(node, i, dra=False) for node in ("dp-0", "dp-1") for i in range(4)]
    wait_until("the probe passed", lambda: w.check(first, "probe") == CheckResult.SUCCEEDED, timeout=60)
    w.reconciler.reconcile_once()
    # 12 devices: capacity max(15 % of 12, 4) = 4 under quarantine, rate max(8 %, 5) = 5 starts.
    phases = [w.record(n).status.phase for n in storm]
    assert phases.count(Phase.QUARANTINED) == 3  # the fourth would exceed the capacity of 4
    assert phases.count(Phase.DEFERRED) == 5
    stored = w.client.get(CONFIG_MAP, BREAKER_CONFIG_MAP, namespace=NS)
    assert json.loads(stored["data"]["state"])["tripped"] is True
    assert [e["action"] for e in json.loads(stored["data"]["history"])] == ["trip"]
    # The release went on: the rung after the probe's.
    assert w.record(first).status.phase == LADDER.phases[LADDER.phases.index(PROBING) + 1]


def test_a_restarted_reconciler_resumes_and_doubles_nothing(world: World) -> None:
    w = world
    names = [w.add("dp-0", i, dra=False) for i in range(2)] + [w.add("dra-0", 2, dra=True)]
    w.reconciler.reconcile_once()
    assert {w.record(n).status.phase for n in names} == {Phase.QUARANTINED}

    def held() -> bool:
        w.reconciler.reconcile_once()
        conditions = [w.record(n).status.condition(HELD) for n in names[:2]]
        return all(c is not None and c.reason == "Held" for c in conditions)

    wait_until("the device-plugin cards held by holder pods", held, timeout=30)
    versions = {n: w.client.get(QUARANTINES, n)["metadata"]["resourceVersion"] for n in names}
    rule_version = (w.rule(names[2]) or {})["metadata"]["resourceVersion"]
    events = {n: w.events(n) for n in names}
    w.reconciler = w.new_reconciler()
    report = w.reconciler.reconcile_once()
    assert report.outcomes == dict.fromkeys(names, "unchanged")
    assert {n: w.client.get(QUARANTINES, n)["metadata"]["resourceVersion"] for n in names} == versions
    assert (w.rule(names[2]) or {})["metadata"]["resourceVersion"] == rule_version
    assert {n: w.events(n) for n in names} == events
    annotation = w.client.get(NODE, "dp-0")["metadata"]["annotations"]["gpuhealth.io/quarantined-devices"]
    assert sorted(json.loads(annotation)) == sorted(gpu_uuid("dp-0", i) for i in range(2))


async def test_the_leader_runs_the_loop_woken_by_the_watch_and_stops_when_it_stops_leading(
    world: World,
) -> None:
    w = world
    watch_client = KubeClient(KubeTransport(api_client(str(w.kubeconfig))))
    # Passes come only on a watched change or after an hour: promptness below is the watch's.
    reconciler = Reconciler(
        w.client,
        health=w.health,
        **wiring(w.client, Enforcer(w.client, discover(w.client))),
        events=KubeEvents(w.client),
        breaker_store=BreakerStore(w.client, NS),
        settings=replace(SETTINGS, max_recheck_seconds=3600),
        clock=w.clock,
        registry=CollectorRegistry(),
        watch_client=watch_client,
    )
    elector = LeaderElector(w.client, namespace=NS, name="gpuhealth-responder", identity="replica-a")
    leading = asyncio.create_task(elector.run(reconciler.run))
    try:
        await asyncio.to_thread(wait_until, "leading", lambda: elector.is_leader, timeout=30)
        name = await asyncio.to_thread(w.add, "dp-0", 3, dra=False)

        def quarantined() -> bool:
            return w.record(name).status.phase == Phase.QUARANTINED

        await asyncio.to_thread(wait_until, "the record quarantined", quarantined, timeout=30)
    finally:
        leading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leading
        watch_client.close()
    assert not elector.is_leader
    later = await asyncio.to_thread(w.add, "dp-0", 2, dra=False)
    record = await asyncio.to_thread(w.record, later)
    assert record.status.phase == Phase.PENDING  # nobody leads: nothing acts


def check_pod(w: World, name: str, kind: str) -> dict[str, Any]:
    job = job_name(w.record(name), kind, 1)
    (pod,) = w.client.list(POD, namespace=NS, label_selector=f"job-name={job}").items
    return pod


def test_a_device_plugin_check_runs_on_its_device_and_follows_its_health(world: World) -> None:
    w = world
    uuid = gpu_uuid("dp-1", 2)
    name = w.add("dp-1", 2, dra=False)
    w.reconciler.reconcile_once()
    w.health.set("dp-1", uuid, Health.HEALTHY, w.clock.now())  # the card recovers, its alert resolves
    w.resolve(name)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == PROBING
    wait_until("the probe passed", lambda: w.check(name, "probe") == CheckResult.SUCCEEDED, timeout=60)
    probe = check_pod(w, name, "probe")
    # The diagnostic (an init container that started its own hostengine) reached the card and
    # the judge read its report: the Job passed because the simulated dcgmi found the card good.
    # The kubelet gave it the card (the hold had stepped aside: the node's other free GPUs held),
    # and says so for the judge, which asked for the same GPU.
    (container,) = probe["spec"]["initContainers"]
    assert probe["spec"]["nodeName"] == "dp-1" and container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "NVIDIA_VISIBLE_DEVICES" not in json.dumps(container)
    assert device_ids(probe) == (uuid,)
    assert container["command"] == list(PROBE.command)
    assert [s["state"]["terminated"]["exitCode"] for s in probe["status"]["initContainerStatuses"]] == [0]
    # The card breaks again before the canary (the node's other cards stay Healthy), unseen by
    # the metrics the reconciler reads: the canary, a workload on that card, fails.
    w.cluster.inject({"fault": "device-unhealthy", "device": {"node": "dp-1", "gpu": 2}})
    w.health.set("dp-1", uuid, Health.HEALTHY, w.clock.now())
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == CANARY
    wait_until("the canary failed", lambda: w.check(name, "canary") == CheckResult.FAILED, timeout=60)
    (canary,) = check_pod(w, name, "canary")["spec"]["containers"]
    assert (canary["image"], canary["command"]) == (CANARY_CHECK.image, list(CANARY_CHECK.command))
    assert canary["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    w.reconciler.reconcile_once()
    record = w.record(name)
    assert record.status.phase == Phase.QUARANTINED
    assert (
        record.status.last_check is not None
        and record.status.last_check.check == "canary"
        and record.status.last_check.failed
    )


def test_a_device_plugin_probe_of_a_card_that_still_fails_fails(world: World) -> None:
    """The alert resolved and the metrics the reconciler reads say Healthy, but the card still
    fails when used: the device plugin would hand a GPU request one of the node's three Healthy
    cards and pass; the probe tests this one and fails. While the metrics still read it
    Unhealthy, no attempt starts at all (StillUnhealthy)."""
    w = world
    name = w.add("dp-0", 1, dra=False)
    w.cluster.inject({"fault": "device-unhealthy", "device": {"node": "dp-0", "gpu": 1}})
    w.reconciler.reconcile_once()
    w.resolve(name)
    w.reconciler.reconcile_once()
    record = w.record(name)
    assert (record.status.phase, record.status.phase_reason) == (Phase.QUARANTINED, STILL_UNHEALTHY)
    w.health.set("dp-0", gpu_uuid("dp-0", 1), Health.HEALTHY, w.clock.now())  # unseen by the metrics
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == PROBING
    wait_until("the probe failed", lambda: w.check(name, "probe") == CheckResult.FAILED, timeout=60)
    w.reconciler.reconcile_once()
    record = w.record(name)
    assert record.status.phase == Phase.QUARANTINED
    assert (
        record.status.last_check is not None
        and record.status.last_check.check == "probe"
        and record.status.last_check.failed
    )


def test_a_dra_device_whose_alert_carries_no_driver_label_is_enforced_with_a_rule(world: World) -> None:
    """The alert names the device by its UUID only (its `gpu_device_info` series was missing):
    the record opens with no path, and the slices say it is a DRA device."""
    w = world
    name = w.add("dra-0", 2, dra=False)
    assert w.record(name).spec.path == ""
    w.reconciler.reconcile_once()
    record = w.record(name)
    assert record.status.phase == Phase.QUARANTINED
    assert (record.spec.path, record.spec.driver, record.spec.pool, record.spec.device_name) == (
        "dra",
        "gpu.nvidia.com",
        "dra-0",
        "gpu-2",
    )
    assert record.status.enforced == f"DeviceTaintRule/{name}"
    rule = w.rule(name)
    assert rule is not None
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "dra-0", "device": "gpu-2"}
    annotations = w.client.get(NODE, "dra-0")["metadata"].get("annotations") or {}
    assert NODE_ANNOTATION not in annotations


def test_an_enforcement_is_handed_over_when_the_devices_identity_changes(world: World) -> None:
    """A record identified on the device-plugin path (its node served the card through the
    device plugin then) and enforced through the node annotation by a responder that knew no
    DRA backend, for what the slices now publish as a DRA device: the rule is put in place,
    then the entry lifted."""
    w = world
    name = w.add("dra-0", 1, dra=False)
    stored = w.client.get(QUARANTINES, name)
    w.client.update(QUARANTINES, {**stored, "spec": {**stored["spec"], "path": "device-plugin"}})
    plugin_only = Reconciler(
        w.client,
        health=w.health,
        **wiring(w.client, Backends(w.client, (NodeAnnotation(w.client),))),
        events=KubeEvents(w.client),
        breaker_store=BreakerStore(w.client, NS),
        settings=SETTINGS,
        clock=w.clock,
        registry=CollectorRegistry(),
    )
    plugin_only.reconcile_once()
    assert w.record(name).status.enforced == "Node/dra-0"
    assert gpu_uuid("dra-0", 1) in listed(w.client.get(NODE, "dra-0"))

    w.clock.advance(5)
    w.reconciler.reconcile_once()
    record = w.record(name)
    assert record.status.phase == Phase.QUARANTINED
    assert record.spec.path == "dra" and record.status.enforced == f"DeviceTaintRule/{name}"
    rule = w.rule(name)
    assert rule is not None and rule["spec"]["taint"]["key"] == QUARANTINE_TAINT
    assert gpu_uuid("dra-0", 1) not in listed(w.client.get(NODE, "dra-0"))
    assert "enforcement moved from Node/dra-0 to DeviceTaintRule/" in record.status.history[-1].message
    # Once moved, nothing moves again.
    w.reconciler.reconcile_once()
    assert w.record(name).status.history == record.status.history
