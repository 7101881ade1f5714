"""The responder's whole flow on a simulated fleet, for both paths, with one leader and with the
leader replaced at every step.

Aspects: a checkpointable Job holds a device that fails; the alert, delivered through the
`Recorder` (the webhook's sink), opens the record; the reconciler (migrator hooked in as the
service does) enforces it, asks the job for its checkpoint, evicts it once committed, and the
Job comes back on another device (never the quarantined one); the alert resolves and the device
walks Probing -> Canary -> Stabilizing -> Ramp -> Released with real probe and canary Jobs; the
history holds every phase in order, the enforcement is gone, and every effect landed once (one
rule or annotation, one checkpoint request and one eviction per pod, one migration Lease, one
probe and one canary Job). The same flow with two replicas (each its own client) handing over
whenever the record moved on: a new leader continues from the records alone, same end, same
single effects.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from responder.records import Quarantine
from simulator.testing import running_cluster
from tests.support.flows import SCENARIO, WALK, Replica, World, check_end, prepare

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
