"""The responder's whole flow on a simulated fleet, for both paths, with one leader and with the
leader replaced at every step.

Aspects: a checkpointable Job holds a device that fails; the alert, delivered through the
`Recorder` (the webhook's sink), opens the record; the reconciler (migrator hooked in as the
service does) enforces it, asks the job for its checkpoint, evicts it once committed, and the
Job comes back on another device (never the quarantined one); the alert resolves and the device
walks the release ladder (as shipped Probing -> Canary -> Stabilizing -> Ramp) to Released with
a real Job for each check; the
history holds every phase in order, the enforcement is gone, and every effect landed once (one
rule or annotation, one checkpoint request and one eviction per pod, one migration Lease, one
Job per check). The same flow with two replicas (each its own client) handing over
whenever the record moved on: a new leader continues from the records alone, same end, same
single effects. With the responder's Prometheus unreachable (a closed port) the alert is still
enforced and the job still moved, while the release waits for health (HealthUnavailable) and
goes on once a replica can read it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from gpuhealth.testing.loopback import wait_until
from responder.ladder import PROBING
from responder.reconcile.health import PrometheusHealth
from responder.reconcile.policy import HEALTH_UNAVAILABLE, Health
from responder.records import MigrationOutcome, Phase, Quarantine
from simulator.testing import running_cluster
from tests.support.flows import DEADLINE, SCENARIO, WALK, Replica, World, check_end, new_replica, prepare

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with running_cluster(SCENARIO, speed=20) as handle:
        prepare(handle.kubeconfig_path)
        yield handle


@pytest.fixture
def world(cluster: Any) -> Iterator[World]:
    w = World(cluster.kubeconfig_path)
    try:
        yield w
    finally:
        w.close()


@pytest.mark.parametrize("dra", [True, False], ids=["dra", "device-plugin"])
def test_one_leader_moves_the_job_and_releases_the_device(world: World, dra: bool) -> None:
    w = world
    flow, pod = w.flow(dra=dra)
    leader = w.replica()
    flow.fire()
    record = flow.drive(lambda _: leader)
    check_end(w, flow, pod, record)


@pytest.mark.parametrize("dra", [True, False], ids=["dra", "device-plugin"])
def test_a_new_leader_at_every_step_changes_nothing(world: World, dra: bool) -> None:
    w = world
    flow, pod = w.flow(dra=dra)
    replicas = [w.replica(), w.replica()]
    current = {"index": 0, "status": None, "handovers": 0}

    def leader(record: Quarantine) -> Replica:
        # Whenever the record moved on (a phase, a migration step), the leader is gone and the
        # other replica takes over from what is stored.
        if current["status"] is not None and current["status"] != record.status:
            current["index"] = 1 - int(current["index"] or 0)
            current["handovers"] = int(current["handovers"] or 0) + 1
        current["status"] = record.status
        return replicas[int(current["index"] or 0)]

    flow.fire()
    record = flow.drive(leader)
    assert int(current["handovers"] or 0) >= len(WALK) - 1
    check_end(w, flow, pod, record)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("dra", [True, False], ids=["dra", "device-plugin"])
def test_with_prometheus_away_the_alert_is_enforced_and_the_job_moved_and_the_release_waits(
    world: World, dra: bool
) -> None:
    w = world
    flow, _ = w.flow(dra=dra)
    away = PrometheusHealth(f"http://127.0.0.1:{closed_port()}", timeout_seconds=1)
    blind = new_replica(w.kubeconfig, w.effects, away, w.clock)
    w.replicas.append(blind)
    # Each World's clock starts at the same instant: a new alert episode (startsAt) needs time
    # past the ones the module's other tests fired and resolved for the same device.
    w.clock.advance(3600)
    flow.fire()

    def passed(until: Any) -> Any:
        def once() -> Any:
            blind.reconciler.reconcile_once()
            w.clock.advance(0.5)
            record = flow.record()
            return record if until(record) else None

        return once

    def moved(record: Quarantine) -> bool:
        # This episode's move: the device may have been quarantined (and its job moved) before
        # by the other tests of the module, in earlier episodes of the same record.
        return record.status.phase == Phase.QUARANTINED and any(
            m.episode == record.status.episode and m.outcome is MigrationOutcome.SUCCEEDED
            for m in record.status.migrations
        )

    record = wait_until("the job moved with Prometheus away", passed(moved), timeout=DEADLINE)
    assert record.status.phase == Phase.QUARANTINED and record.status.enforced
    flow.await_moved()
    flow.device_fault("recover")
    flow.resolve()
    record = wait_until(
        "the release waits for health",
        passed(lambda r: r.status.phase_reason == HEALTH_UNAVAILABLE),
        timeout=DEADLINE,
    )
    attempt = record.status.attempt
    for _ in range(5):
        blind.reconciler.reconcile_once()
        w.clock.advance(60)
    held = flow.record()
    assert (held.status.phase, held.status.attempt) == (Phase.QUARANTINED, attempt)
    # A replica that reads health again carries the release attempt out.
    w.health.set(flow.node, flow.device, Health.HEALTHY, w.clock.now())
    seeing = w.replica()

    def probing() -> bool:
        seeing.reconciler.reconcile_once()
        w.clock.advance(0.5)
        return flow.record().status.phase == PROBING

    wait_until("the release attempt begins", probing, timeout=DEADLINE)
