"""Holder pods on the simulated cluster: the kubelet allocates a quarantined card to gpuhealth.

Aspects: a free quarantined card is held by one holder pod the kubelet gave it (the fill's
other holders gone, the node's free GPUs back), the node annotation telling the extender it is
held and the record's `Held` condition True; a holder deleted by someone is made again; a card
still running a pod waits (CardBusy, the extender told to keep new GPU pods off the node), and
is held once that pod is gone; the holders go when the record reaches the ramp; in dry-run no
holder is made; on a node whose kubelet names no pod's devices (before 1.36) and no exporter's
series read, the hold gives up as `AllocationUnreadable`, saying which sources it tried. The
reconciler runs with a ManualClock and a static health source.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gpuhealth.clock import ManualClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.meta import rfc3339
from gpuhealth.kube.resources import NAMESPACE, NODE, POD, STATUS, Resource
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import wait_until
from responder.enforce.hold import HoldSettings, device_ids, holds
from responder.enforce.hold_devices import AllocationSource
from responder.enforce.hold_plan import HOLDER_LABEL, HoldState
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import discover
from responder.reconcile.breaker_store import BreakerStore
from responder.reconcile.events import KubeEvents
from responder.reconcile.health import StaticHealth
from responder.reconcile.limits import BucketSettings
from responder.reconcile.policy import Health, PolicySettings
from responder.reconcile.reconciler import Reconciler, ReconcilerSettings
from responder.records import HELD, QUARANTINES, Phase, Quarantine, from_object, to_object
from responder.webhook.intake import IntakeSettings, Write, decide
from simulator.fleet.objects import gpu_uuid
from simulator.testing import ClusterHandle, running_cluster
from tests.responder.test_intake import alert
from tests.support.holds import wiring

pytestmark = pytest.mark.integration

CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
NS = "gpuhealth-system"
NODE_NAME = "dp-0"
SCENARIO: dict[str, Any] = {
    "name": "hold",
    "fleet": [{"name": "dp", "count": 1, "gpusPerNode": 4, "path": "device-plugin"}],
    # First fit: the pods run on GPUs 0 and 1; 2 and 3 are free.
    "workloads": [{"name": "serve", "namespace": "inference", "replicas": 2, "gpusPerPod": 1}],
}
SETTINGS = ReconcilerSettings(
    policy=PolicySettings(stability_seconds=120, ramp_seconds=60, backoff_seconds=300),
    bucket=BucketSettings(burst=50, per_hour=60),
)


class World:
    def __init__(self, client: KubeClient, cluster: ClusterHandle) -> None:
        self.client = client
        self.cluster = cluster
        self.clock = ManualClock()
        self.health = StaticHealth()
        for i in range(4):
            self.health.set(NODE_NAME, gpu_uuid(NODE_NAME, i), Health.HEALTHY, 0.0)
        self.reconciler = self.new_reconciler(SETTINGS)

    def new_reconciler(
        self, settings: ReconcilerSettings, allocations: AllocationSource | None = None
    ) -> Reconciler:
        return Reconciler(
            self.client,
            health=self.health,
            **wiring(self.client, Enforcer(self.client, discover(self.client)), allocations=allocations),
            events=KubeEvents(self.client),
            breaker_store=BreakerStore(self.client, NS),
            settings=settings,
            clock=self.clock,
            registry=CollectorRegistry(),
        )

    def add(self, index: int) -> str:
        uuid = gpu_uuid(NODE_NAME, index)
        decision = decide(
            None,
            alert(node=NODE_NAME, device=uuid, uuid=uuid),
            now=self.clock.now(),
            settings=IntakeSettings(),
        )
        assert isinstance(decision, Write)
        obj = to_object(decision.record)
        status = obj.pop("status")
        created = self.client.create(QUARANTINES, obj)
        self.client.update(QUARANTINES, {**created, "status": status}, subresource=STATUS)
        self.health.set(NODE_NAME, uuid, Health.UNHEALTHY)
        return decision.record.name

    def record(self, name: str) -> Quarantine:
        return from_object(self.client.get(QUARANTINES, name))

    def held(self, name: str) -> str:
        condition = self.record(name).status.condition(HELD)
        return "" if condition is None else condition.reason

    def holders(self) -> list[dict[str, Any]]:
        pods = self.client.list(POD, namespace=NS, label_selector=HOLDER_LABEL).items
        return [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]

    def passes_until(self, what: str, done: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.reconciler.reconcile_once()
            if done():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not reached within {timeout} s: {what}")
            time.sleep(0.2)


@contextlib.contextmanager
def running_world(scenario: dict[str, Any]) -> Iterator[World]:
    with running_cluster(scenario, speed=10) as cluster:
        client = KubeClient(KubeTransport(api_client(str(cluster.kubeconfig_path))))
        client.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
        client.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait_until("the CRD served", lambda: client.list(QUARANTINES) is not None, timeout=20)
        try:
            yield World(client, cluster)
        finally:
            client.close()


@pytest.fixture
def world() -> Iterator[World]:
    with running_world(SCENARIO) as w:
        yield w


@pytest.fixture
def old_kubelet_world() -> Iterator[World]:
    """The node's kubelet writes no allocatedResourcesStatus (before 1.36, or the gate off)."""
    with running_world({**SCENARIO, "fleet": [{**SCENARIO["fleet"][0], "resourceHealthStatus": False}]}) as w:
        yield w


def test_a_free_quarantined_card_is_held_by_a_holder_the_kubelet_gave_it(world: World) -> None:
    w = world
    card = gpu_uuid(NODE_NAME, 3)
    name = w.add(3)
    w.passes_until("the card held", lambda: w.held(name) == HoldState.HELD)
    holders = w.holders()
    assert [device_ids(p) for p in holders] == [(card,)]
    meta = holders[0]["metadata"]
    assert meta["labels"][HOLDER_LABEL] == name
    assert meta["ownerReferences"][0]["name"] == name
    assert holders[0]["spec"]["nodeName"] == NODE_NAME
    assert holds(w.client.get(NODE, NODE_NAME)) == {card: "held"}
    assert w.record(name).status.condition(HELD).status == "True"  # type: ignore[union-attr]

    # Someone deletes the holder: the card is filled and held again.
    w.client.delete(POD, meta["name"], namespace=NS)
    w.passes_until(
        "the card held again",
        lambda: (
            [device_ids(p) for p in w.holders()] == [(card,)]
            and w.holders()[0]["metadata"]["name"] != meta["name"]
            and w.held(name) == HoldState.HELD
        ),
    )


def test_a_card_in_use_waits_for_its_pod_and_is_held_once_it_left(world: World) -> None:
    w = world
    card = gpu_uuid(NODE_NAME, 0)
    pods = w.client.list(POD, namespace="inference").items
    on_card = [p for p in pods if card in device_ids(p)]
    assert len(on_card) == 1
    name = w.add(0)
    w.passes_until("the hold waiting for the pod", lambda: w.held(name) == HoldState.CARD_BUSY)
    assert holds(w.client.get(NODE, NODE_NAME)) == {card: "pending"}
    w.passes_until("no holder on other cards", lambda: not w.holders())
    # The pod leaves (its move, done by hand here): the card is held.
    w.client.delete(POD, on_card[0]["metadata"]["name"], namespace="inference")
    w.passes_until("the card held", lambda: w.held(name) == HoldState.HELD)
    assert [device_ids(p) for p in w.holders()] == [(card,)]


def test_the_holders_go_when_the_record_reaches_the_ramp(world: World) -> None:
    w = world
    name = w.add(2)
    w.passes_until("the card held", lambda: w.held(name) == HoldState.HELD)
    obj = w.client.get(QUARANTINES, name)
    obj["status"]["phase"] = "Ramp"
    obj["status"]["phaseSince"] = rfc3339(w.clock.now())
    w.client.update(QUARANTINES, obj, subresource=STATUS)
    # On the ramp the hold may step aside for its first opted-in work for at most hold.ramp_fill;
    # past that, every holder goes.
    w.clock.advance(HoldSettings().ramp_fill_seconds)
    w.passes_until(
        "the holders gone", lambda: not w.holders() and w.record(name).status.condition(HELD) is None
    )
    assert holds(w.client.get(NODE, NODE_NAME)) == {}
    assert w.record(name).status.phase in ("Ramp", Phase.QUARANTINED, Phase.RELEASED)


def test_in_dry_run_no_holder_is_made(world: World) -> None:
    w = world
    w.reconciler = w.new_reconciler(
        ReconcilerSettings(policy=PolicySettings(dry_run=True), bucket=SETTINGS.bucket)
    )
    name = w.add(3)
    for _ in range(5):
        w.reconciler.reconcile_once()
        time.sleep(0.2)
    assert w.record(name).status.phase == Phase.QUARANTINED
    assert not w.holders()
    assert w.record(name).status.condition(HELD) is None


def test_a_kubelet_that_names_no_devices_leaves_the_card_unreadable_saying_what_was_tried(
    old_kubelet_world: World,
) -> None:
    w = old_kubelet_world
    name = w.add(3)

    def running() -> bool:
        holders = w.holders()
        return len(holders) == 2 and all(p["status"].get("phase") == "Running" for p in holders)

    w.passes_until("the fill's holders running", running)
    assert w.held(name) == HoldState.FILLING
    assert [device_ids(p) for p in w.holders()] == [(), ()]
    w.clock.advance(61)
    w.passes_until("the hold given up", lambda: w.held(name) == HoldState.UNREADABLE)
    condition = w.record(name).status.condition(HELD)
    assert condition is not None and condition.status == "False"
    assert "allocatedResourcesStatus" in condition.message
    assert "gpu_device_allocation_info in Prometheus (not configured)" in condition.message
