"""Two responder replicas, each with its webhook and its leader election, on the same alerts.

Aspects: HA Alertmanager delivers every alert to both replicas' webhooks (`responder.webhook.server`
with a `Recorder` each) while both run `LeaderElector.run(reconciler.run)` on the same Lease:
the job moves once and the device is released, and every action came from one replica only
(the other's client made none of them). Then the same with the leader killed (its elector's
task cancelled: the term fenced, as when its pod stops) whenever the record moves on, a fresh
replica joining in its place: the other takes over from the records alone, the end is the
same and no effect landed twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpuhealth.kube.elector import LeaderElector
from gpuhealth.kube.lease import ElectionSettings
from gpuhealth.kube.meta import rfc3339
from responder.reconcile.policy import Health
from responder.records import QUARANTINES, MigrationOutcome, Phase, Quarantine
from responder.webhook.recorder import Recorder
from responder.webhook.server import PATH, WebhookMetrics, WebhookSettings, add_webhook
from simulator.testing import running_cluster
from tests.support.flows import (
    NS,
    SCENARIO,
    SETTINGS,
    WALK,
    Effect,
    Flow,
    World,
    check_end,
    counting_client,
    new_replica,
    prepare,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "flows-token"
LEASE = "gpuhealth-responder"
# Passes every 0.2 s at most: the probe and canary Jobs' results are not watched.
FAST = replace(SETTINGS, max_recheck_seconds=0.2)
ELECTION = ElectionSettings(lease_duration_seconds=4, renew_deadline_seconds=3.0, retry_period_seconds=0.2)
EFFECTS = ("devicetaintrules", "jobs", "leases", "pods/eviction", "resourceclaimtemplates")
DEADLINE = 120.0


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


@dataclass
class Candidate:
    """One replica: a webhook with its own recorder, and an elector whose term reconciles."""

    identity: str
    effects: Counter[Effect]
    elector: LeaderElector
    task: asyncio.Task[None]
    webhook: TestClient[Any, Any]
    closers: list[Any]

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.webhook.close()
        for close in self.closers:
            close()


async def start(w: World, identity: str, effects: Counter[Effect]) -> Candidate:
    webhook_client = counting_client(w.kubeconfig, Counter())
    elector_client = counting_client(w.kubeconfig, Counter())
    replica = new_replica(w.kubeconfig, effects, w.health, w.clock, FAST)
    app = web.Application()
    recorder = Recorder(webhook_client, w.clock)
    add_webhook(app, WebhookSettings(TOKEN), recorder.record_all, WebhookMetrics(CollectorRegistry()))
    http = TestClient(TestServer(app))
    await http.start_server()
    elector = LeaderElector(elector_client, namespace=NS, name=LEASE, identity=identity, settings=ELECTION)
    task = asyncio.create_task(elector.run(replica.reconciler.run))
    return Candidate(
        identity, effects, elector, task, http, [webhook_client.close, elector_client.close, replica.close]
    )


def payload(flow: Flow, status: str) -> str:
    alert = {
        "status": status,
        "labels": {
            "alertname": "GPUDeviceUnhealthy",
            "action": "quarantine",
            "node": flow.node,
            **flow.labels,
        },
        "annotations": {},
        "startsAt": rfc3339(flow.starts_at),
        "endsAt": rfc3339(flow.clock.now()) if status == "resolved" else "0001-01-01T00:00:00Z",
        "fingerprint": f"fp-{flow.node}-{flow.device}",
    }
    return json.dumps({"version": "4", "status": status, "receiver": "r", "alerts": [alert]})


async def deliver(candidates: list[Candidate], flow: Flow, status: str) -> None:
    """To every replica at once, as an HA Alertmanager pair does."""

    async def post(c: Candidate) -> int:
        response = await c.webhook.post(
            PATH, data=payload(flow, status), headers={"Authorization": f"Bearer {TOKEN}"}
        )
        return response.status

    assert await asyncio.gather(*(post(c) for c in candidates)) == [200] * len(candidates)


@contextlib.asynccontextmanager
async def replicas(w: World, counters: list[Counter[Effect]]) -> AsyncIterator[list[Candidate]]:
    candidates = [await start(w, f"replica-{i}", c) for i, c in enumerate(counters)]
    try:
        yield candidates
    finally:
        for c in candidates:
            await c.stop()


async def drive(w: World, flow: Flow, candidates: list[Candidate], *, kill: bool) -> tuple[Quarantine, int]:
    """The world answers (once the job moved, the device recovers, reading Healthy, and its alert
    resolves) until the record is Released; with `kill`, the leader is killed whenever the
    record moved on."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    resolved = False
    last: Quarantine | None = None
    kills = 0
    while True:
        record = await asyncio.to_thread(flow.record)
        if record.status.phase == Phase.RELEASED:
            return record, kills
        assert loop.time() < deadline, f"not released within {DEADLINE:.0f} s: {record.status.phase}"
        migration = record.status.migrations[0] if record.status.migrations else None
        if not resolved and migration is not None and migration.outcome is MigrationOutcome.SUCCEEDED:
            await asyncio.to_thread(flow.await_moved)
            await asyncio.to_thread(flow.device_fault, "recover")  # the GPU is well again
            w.health.set(flow.node, flow.device, Health.HEALTHY, w.clock.now())
            await deliver(candidates, flow, "resolved")
            resolved = True
        if kill and last is not None and last.status != record.status:
            leaders = [c for c in candidates if c.elector.is_leader]
            if leaders:
                [leader] = leaders
                # Its pod stops: the term is fenced, a fresh replica joins in its place.
                index = candidates.index(leader)
                await leader.stop()
                candidates[index] = await start(w, f"{leader.identity}-next{kills}", leader.effects)
                kills += 1
        last = record
        w.clock.advance(0.5)
        await asyncio.sleep(0.1)


async def fire(w: World, flow: Flow, candidates: list[Candidate]) -> None:
    await asyncio.to_thread(flow.device_fault, "device-unhealthy")
    w.health.set(flow.node, flow.device, Health.UNHEALTHY)
    flow.starts_at = w.clock.now() - 60
    await deliver(candidates, flow, "firing")
    [flow.name] = [
        obj["metadata"]["name"]
        for obj in await asyncio.to_thread(lambda: w.client.list(QUARANTINES).items)
        if obj["spec"]["node"] == flow.node and obj["spec"]["device"] == flow.device
    ]


@pytest.mark.parametrize("dra", [True, False], ids=["dra", "device-plugin"])
async def test_two_replicas_on_the_same_alerts_act_once(world: World, dra: bool) -> None:
    w = world
    flow, pod = await asyncio.to_thread(w.flow, dra=dra)
    counters: list[Counter[Effect]] = [Counter(), Counter()]
    async with replicas(w, counters) as candidates:
        await fire(w, flow, candidates)
        record, _ = await drive(w, flow, candidates, kill=False)
    acted = [i for i, c in enumerate(counters) if any(k[1] in EFFECTS for k in c)]
    assert len(acted) == 1, counters  # one leader all along: the other replica only recorded
    w.effects = counters[0] + counters[1]
    await asyncio.to_thread(check_end, w, flow, pod, record)
    assert record.status.history[-1].phase == WALK[-1]


@pytest.mark.parametrize("dra", [True, False], ids=["dra", "device-plugin"])
async def test_the_leader_killed_whenever_the_record_moves_on(world: World, dra: bool) -> None:
    w = world
    flow, pod = await asyncio.to_thread(w.flow, dra=dra)
    async with replicas(w, [w.effects, w.effects]) as candidates:
        await fire(w, flow, candidates)
        record, kills = await drive(w, flow, candidates, kill=True)
    assert kills >= 3, kills  # the walk saw several leaders
    await asyncio.to_thread(check_end, w, flow, pod, record)
