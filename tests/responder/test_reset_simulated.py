"""The reset hand-off against the simulated cluster with NVSentinel's janitor (simulated).

Aspects: the GPUReset the executor writes is accepted by the janitor's CRD as served (its schema
checks the node and the UUID's shape) and served by the janitor: Complete True with
GPUResetSucceeded for a card whose fault a reset clears, with ResetJobFailed for one it cannot
fix; a record on the reset ladder walks Quarantined -> Resetting -> Probing, and the probe Job
passes on the card the reset cleared (it fails on such a card until it is reset: a probe before
the reset fails); a card whose reset fails goes back to Quarantined with the failure counted and
is never probed; the request is deleted once the record moves on; a request naming a node the
cluster does not have fails with NodeNotFound.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gpuhealth.clock import ManualClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.meta import rfc3339
from gpuhealth.kube.resources import NAMESPACE, STATUS
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import wait_until
from responder.checks.jobs import JOB, CheckSettings, job_name
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import discover
from responder.ladder import LADDER, PROBING, RESET, with_reset
from responder.reconcile.breaker_store import BreakerStore
from responder.reconcile.events import KubeEvents
from responder.reconcile.health import StaticHealth
from responder.reconcile.policy import CheckResult, Health
from responder.reconcile.reconciler import Reconciler
from responder.records import QUARANTINES, Phase, Quarantine, from_object, to_object
from responder.reset.handoff import ResetHandoff, ResetSettings
from responder.webhook.intake import IntakeSettings, Write, decide
from simulator.fleet.objects import gpu_uuid
from simulator.testing import running_cluster
from tests.responder.test_intake import alert
from tests.responder.test_reconciler_simulated import CRD_FILE, CRDS, NS, POLICY, SETTINGS
from tests.support.backends import identified, job_checks
from tests.support.holds import wiring

pytestmark = pytest.mark.integration

SCENARIO: dict[str, Any] = {
    "name": "reset",
    "fleet": [{"name": "dra", "count": 1, "gpusPerNode": 3, "path": "dra"}],
    "workloads": [],
    "janitor": {"resetSeconds": "20s"},
    "timeline": [
        # Short faults that leave the card needing a reset: cleared by one (gpu-0), not (gpu-1).
        {
            "at": "0s",
            "fault": "device-unhealthy",
            "device": {"node": "dra-0", "gpu": gpu},
            "duration": "1s",
            "reset": reset,
        }
        for gpu, reset in ((0, "clears"), (1, "fails"))
    ],
}
RESET_SETTINGS = replace(
    SETTINGS, policy=replace(POLICY, ladder=with_reset(LADDER), reset_timeout_seconds=300)
)


@dataclass
class World:
    client: KubeClient
    clock: ManualClock
    health: StaticHealth
    reconciler: Reconciler
    resets: ResetHandoff

    def add(self, index: int, node: str = "dra-0") -> str:
        uuid = gpu_uuid(node, index)
        labels = {
            "device": f"gpu.nvidia.com/{node}/gpu-{index}",
            "driver": "gpu.nvidia.com",
            "pool": node,
            "device_name": f"gpu-{index}",
            "uuid": uuid,
        }
        decision = decide(None, alert(node=node, **labels), now=self.clock.now(), settings=IntakeSettings())
        assert isinstance(decision, Write)
        obj = to_object(decision.record)
        status = obj.pop("status")
        created = self.client.create(QUARANTINES, obj)
        self.client.update(QUARANTINES, {**created, "status": status}, subresource=STATUS)
        return decision.record.name

    def record(self, name: str) -> Quarantine:
        return from_object(self.client.get(QUARANTINES, name))

    def recover(self, name: str, index: int) -> None:
        """The device reads Healthy again and its alert resolves."""
        self.health.set("dra-0", f"gpu.nvidia.com/dra-0/gpu-{index}", Health.HEALTHY, self.clock.now())
        obj = self.client.get(QUARANTINES, name)
        for source in obj["spec"]["sourceAlerts"]:
            source["resolvedAt"] = rfc3339(self.clock.now())
        self.client.update(QUARANTINES, obj)

    def reset_of(self, name: str) -> dict[str, Any] | None:
        try:
            return self.client.get(ResetSettings().resource, job_name(self.record(name), RESET.name, 1))
        except NotFound:
            return None


@pytest.fixture
def world() -> Iterator[World]:
    with running_cluster(SCENARIO, speed=10) as cluster:
        client = KubeClient(KubeTransport(api_client(str(cluster.kubeconfig_path))))
        client.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
        client.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait_until("the CRD served", lambda: client.list(QUARANTINES) is not None, timeout=20)
        health = StaticHealth()
        for i in range(3):
            health.set("dra-0", f"gpu.nvidia.com/dra-0/gpu-{i}", Health.UNHEALTHY)
        clock = ManualClock()
        resets = ResetHandoff(client)
        reconciler = Reconciler(
            client,
            health=health,
            **wiring(client, Enforcer(client, discover(client))),
            events=KubeEvents(client),
            breaker_store=BreakerStore(client, NS),
            settings=RESET_SETTINGS,
            clock=clock,
            registry=CollectorRegistry(),
            resets=resets,
        )
        try:
            yield World(client, clock, health, reconciler, resets)
        finally:
            client.close()


def _outcome(obj: dict[str, Any] | None) -> tuple[str, str] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or ():
        if c.get("type") == "Complete" and c.get("status") == "True":
            return str(obj["status"].get("phase")), str(c.get("reason"))  # type: ignore[index]
    return None


def test_a_reset_that_clears_the_card_leads_to_a_probe_that_passes(world: World) -> None:
    w = world
    name = w.add(0)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == Phase.QUARANTINED
    w.recover(name, 0)
    w.clock.advance(5)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == RESET.phase
    request = w.reset_of(name)
    assert request is not None
    assert request["spec"] == {"nodeName": "dra-0", "selector": {"uuids": [gpu_uuid("dra-0", 0)]}}
    wait_until("the janitor reset the card", lambda: _outcome(w.reset_of(name)) is not None, timeout=30)
    assert _outcome(w.reset_of(name)) == ("Succeeded", "GPUResetSucceeded")
    w.reconciler.reconcile_once()
    record = w.record(name)
    assert record.status.phase == PROBING
    assert w.reset_of(name) is None  # deleted once the record moved on
    checks = job_checks(w.client, CheckSettings(namespace=NS))
    wait_until(
        "the probe finished",
        lambda: checks.result(record, "probe", 1) in (CheckResult.SUCCEEDED, CheckResult.FAILED),
        timeout=60,
    )
    assert checks.result(record, "probe", 1) == CheckResult.SUCCEEDED


def test_a_reset_that_fails_quarantines_again_and_nothing_is_probed(world: World) -> None:
    w = world
    name = w.add(1)
    w.reconciler.reconcile_once()
    w.recover(name, 1)
    w.clock.advance(5)
    w.reconciler.reconcile_once()
    assert w.record(name).status.phase == RESET.phase
    wait_until("the janitor finished", lambda: _outcome(w.reset_of(name)) is not None, timeout=30)
    assert _outcome(w.reset_of(name)) == ("Failed", "ResetJobFailed")
    w.reconciler.reconcile_once()
    record = w.record(name)
    assert record.status.phase == Phase.QUARANTINED
    assert record.status.failures == 1
    assert record.status.last_check is not None and record.status.last_check.check == "reset"
    assert record.status.last_check.failed
    assert not w.client.list(JOB, namespace=NS).items  # no probe of a card the reset did not fix


def test_a_probe_of_a_card_that_needs_a_reset_fails(world: World) -> None:
    # The sticky state is the card's: without the reset its probe fails though it reads Healthy.
    w = world
    record = identified(w.record(w.add(0)))
    checks = job_checks(w.client, CheckSettings(namespace=NS))
    checks.start(record, "probe", 1)
    wait_until(
        "the probe finished",
        lambda: checks.result(record, "probe", 1) in (CheckResult.SUCCEEDED, CheckResult.FAILED),
        timeout=60,
    )
    assert checks.result(record, "probe", 1) == CheckResult.FAILED


def test_a_request_for_a_node_the_cluster_lacks_fails(world: World) -> None:
    w = world
    name = w.add(2)
    record = w.record(name)
    record = replace(record, spec=replace(record.spec, node="no-such-node"))
    w.resets.start(record, RESET.name, 1)
    wait_until(
        "the janitor finished",
        lambda: w.resets.result(record, RESET.name, 1) == CheckResult.FAILED,
        timeout=30,
    )
    obj = w.client.get(ResetSettings().resource, job_name(record, RESET.name, 1))
    assert _outcome(obj) == ("Failed", "NodeNotFound")
