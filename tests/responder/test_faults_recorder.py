"""The webhook and recorder under injected API faults (tests.support.faulty_transport).

Aspects: every delivery is answered 200 (recorded) or 503, never another status; redelivered
until 200, as Alertmanager does, each device's record ends exactly as a fault-free run leaves
it (one history entry per episode, every alert's key, nothing lost, nothing doubled) under a
seeded mix of 500/503/409/429/timeouts, including writes that landed but whose responses
were lost; and the scripted hard cases one by one.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpuhealth.clock import ManualClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.resources import Resource
from gpuhealth.kube.transport import KubeTransport
from responder.records import QUARANTINES, from_object, record_name
from responder.webhook.recorder import Recorder
from responder.webhook.server import WebhookMetrics, WebhookSettings, add_webhook
from tests.simulator.conftest import ServedCluster
from tests.support.faulty_transport import WATCH_ONLY, Fault, FaultyTransport

pytestmark = pytest.mark.integration

CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
TOKEN = "t0ken"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
NODE = "gpu-node-1"
REDELIVERIES = 60
REQUEST_FAULTS = [f for f in Fault if f not in WATCH_ONLY]


def alert(device: int, episode: int, status: str = "firing") -> dict[str, Any]:
    name = f"gpu-{device}"
    return {
        "status": status,
        "labels": {
            "alertname": "GPUDeviceUnhealthy",
            "action": "quarantine",
            "node": NODE,
            "device": f"gpu.nvidia.com/{NODE}/{name}",
            "driver": "gpu.nvidia.com",
            "pool": NODE,
            "device_name": name,
            "severity": "critical",
        },
        "annotations": {"summary": "x"},
        "startsAt": f"2026-11-30T1{episode}:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": f"f{device}",
    }


def deliveries(seed: int, devices: int = 4) -> list[list[dict[str, Any]]]:
    """A seeded stream: each device fires, some resolve, some fire again; HA peers repeat some."""
    rng = random.Random(seed)
    out: list[list[dict[str, Any]]] = []
    for device in range(devices):
        out.append([alert(device, 0)])
        if rng.random() < 0.5:
            out.append([alert(device, 0, "resolved")])
        if rng.random() < 0.5:
            out.append([alert(device, 1)])
    out += [rng.choice(out) for _ in range(len(out) // 2)]  # duplicates from an HA peer
    rng.shuffle(out)
    return out


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.served = ServedCluster(tmp / "kubeconfig")
        self.client = KubeClient(KubeTransport(api_client(str(self.served.kubeconfig))))
        self.client.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))

    def records(self) -> dict[str, dict[str, Any]]:
        """Each record's spec and status, without what a write's timing stamps (resourceVersion)."""
        items = self.client.list(QUARANTINES).items
        for o in items:
            from_object(o)  # every record stays readable by the responder
        return {o["metadata"]["name"]: {"spec": o["spec"], "status": o.get("status", {})} for o in items}

    def close(self) -> None:
        self.client.close()
        self.served.stop()


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[tuple[Cluster, Cluster]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    pair = Cluster(tmp_path / "a"), Cluster(tmp_path / "b")
    try:
        yield pair
    finally:
        for c in pair:
            c.close()


async def webhook(transport: Any) -> TestClient[web.Request, web.Application]:
    recorder = Recorder(KubeClient(transport), ManualClock(1_796_032_900.0))
    app = web.Application()
    add_webhook(app, WebhookSettings(TOKEN), recorder.record_all, WebhookMetrics(CollectorRegistry()))
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def deliver_until_accepted(client: TestClient[web.Request, web.Application], body: bytes) -> int:
    """Alertmanager's behaviour: redeliver on 5xx; returns the number of 503s seen."""
    for refused in range(REDELIVERIES):
        answer = await client.post("/webhook", data=body, headers=HEADERS)
        assert answer.status in (200, 503), await answer.text()
        if answer.status == 200:
            return refused
    raise AssertionError(f"still 503 after {REDELIVERIES} deliveries")


async def run(cluster: Cluster, stream: list[list[dict[str, Any]]], faults: FaultyTransport | None) -> int:
    transport = faults or KubeTransport(api_client(str(cluster.served.kubeconfig)))
    client = await webhook(transport)
    refused = 0
    try:
        for alerts in stream:
            body = orjson.dumps({"version": "4", "status": "firing", "receiver": "r", "alerts": alerts})
            refused += await deliver_until_accepted(client, body)
    finally:
        await client.close()
    return refused


def check_records(records: dict[str, dict[str, Any]], stream: list[list[dict[str, Any]]]) -> None:
    """Nothing lost: a record per device, each with history, no key twice.

    Doubled history shows in the comparison with the clean run (a fixed clock makes entries alike).
    """
    for name, record in records.items():
        status = record["status"]
        keys = status.get("processedKeys", [])
        assert len(keys) == len(set(keys)), f"{name}: a key recorded twice"
        assert status.get("history"), f"{name}: no history entry"
    devices = {a["labels"]["device"] for alerts in stream for a in alerts}
    assert {record_name(NODE, d) for d in devices} == set(records), "a device's alert was lost"


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_faulted_deliveries_end_as_the_clean_run_does(
    clusters: tuple[Cluster, Cluster], seed: int
) -> None:
    clean, faulted = clusters
    stream = deliveries(seed)
    await run(clean, stream, None)
    faults = FaultyTransport(
        KubeTransport(api_client(str(faulted.served.kubeconfig))), seed=seed, rate=0.35, kinds=REQUEST_FAULTS
    )
    refused = await run(faulted, stream, faults)
    expected, got = clean.records(), faulted.records()
    check_records(got, stream)
    assert got == expected
    counts = faults.counts()
    print(
        f"\nseed {seed}: faults injected {dict(sorted(counts.items()))}; 503s answered {refused}; "
        f"duplicate actions 0; lost quarantines 0"
    )
    assert counts[Fault.LOST.value] + counts[Fault.CONFLICT_AFTER.value] > 0  # the hard case was exercised


@pytest.mark.parametrize(
    "script",
    [
        [Fault.LOST],  # the create landed, its response lost
        [None, Fault.LOST],  # the status write landed, its response lost
        [Fault.CONFLICT_AFTER],
        [None, Fault.CONFLICT_AFTER],
        [Fault.THROTTLED, Fault.TIMEOUT, Fault.SERVER_ERROR, Fault.UNAVAILABLE, Fault.CONFLICT],
    ],
    ids=["create-lost", "status-lost", "create-409-after", "status-409-after", "refusals"],
)
async def test_a_lost_answer_to_a_landed_write_is_recorded_once(
    clusters: tuple[Cluster, Cluster], script: list[Fault | None]
) -> None:
    clean, faulted = clusters
    stream = [[alert(0, 0)], [alert(0, 0)]]
    await run(clean, stream, None)
    writes = FaultyTransport(
        KubeTransport(api_client(str(faulted.served.kubeconfig))),
        script=script,
        match=lambda method, _path, _params: method != "GET",
    )
    await run(faulted, stream, writes)
    assert len(writes.injected) == len([f for f in script if f is not None])
    check_records(faulted.records(), stream)
    assert faulted.records() == clean.records()
