"""Recording alerts in DeviceQuarantine objects on the simulated cluster (responder.webhook.recorder).

Aspects: a delivery becomes a record that validates against the shipped CRD, through the
real webhook of two replicas receiving the same deliveries at once (exactly one record, one
history entry, its key once); redeliveries change nothing (same resourceVersion); a resolved
marks the source; an unreachable API is 503 with nothing claimed done; an unreadable record
is never overwritten.
"""

from __future__ import annotations

import asyncio
import copy
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
from gpuhealth.outcomes import Done, Retry
from responder.records import QUARANTINES, Phase, from_object, record_name
from responder.webhook.alerts import parse_alert
from responder.webhook.recorder import Recorder
from responder.webhook.server import WebhookMetrics, WebhookSettings, add_webhook
from tests.simulator.conftest import ServedCluster

pytestmark = pytest.mark.integration

CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
TOKEN = "t0ken"

ALERT: dict[str, Any] = {
    "status": "firing",
    "labels": {
        "alertname": "GPUDeviceUnhealthy",
        "action": "quarantine",
        "node": "gpu-node-1",
        "device": "gpu.nvidia.com/gpu-node-1/gpu-3",
        "driver": "gpu.nvidia.com",
        "pool": "gpu-node-1",
        "device_name": "gpu-3",
        "severity": "critical",
    },
    "annotations": {"summary": "x"},
    "startsAt": "2026-11-30T10:00:00Z",
    "endsAt": "0001-01-01T00:00:00Z",
    "fingerprint": "f00d",
}
NAME = record_name("gpu-node-1", "gpu.nvidia.com/gpu-node-1/gpu-3")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ServedCluster, KubeClient]]:
    served = ServedCluster(tmp_path / "kubeconfig")
    client = KubeClient(KubeTransport(api_client(str(served.kubeconfig))))
    client.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
    try:
        yield served, client
    finally:
        client.close()
        served.stop()


def delivery(*alerts: dict[str, Any]) -> bytes:
    return orjson.dumps({"version": "4", "status": "firing", "receiver": "r", "alerts": list(alerts)})


async def replica(kubeconfig: Path, clock: ManualClock) -> TestClient[web.Request, web.Application]:
    """One responder replica's webhook, with its own API client."""
    recorder = Recorder(KubeClient(KubeTransport(api_client(str(kubeconfig)))), clock)
    app = web.Application()
    add_webhook(app, WebhookSettings(TOKEN), recorder.record_all, WebhookMetrics(CollectorRegistry()))
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_two_replicas_racing_on_the_same_deliveries_record_once(
    cluster: tuple[ServedCluster, KubeClient],
) -> None:
    served, client = cluster
    clock = ManualClock(1_796_032_900.0)
    replicas = [await replica(served.kubeconfig, clock) for _ in range(2)]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        answers = await asyncio.gather(
            *(r.post("/webhook", data=delivery(ALERT), headers=headers) for r in replicas for _ in range(3))
        )
        assert [a.status for a in answers] == [200] * 6
        bodies = [await a.json() for a in answers]
        assert sum(b["recorded"] for b in bodies) == 1  # exactly one replica's write took
        stored = client.get(QUARANTINES, NAME)
        record = from_object(stored)
        assert record.status.phase == Phase.PENDING
        assert len(record.status.history) == 1 and len(record.status.processed_keys) == 1
        assert (record.spec.path, record.spec.device_name) == ("", "gpu-3")  # the reconciler sets the path

        again = await replicas[1].post("/webhook", data=delivery(ALERT), headers=headers)
        assert again.status == 200 and (await again.json())["unchanged"] == 1
        assert (
            client.get(QUARANTINES, NAME)["metadata"]["resourceVersion"]
            == stored["metadata"]["resourceVersion"]
        )

        resolved = copy.deepcopy(ALERT) | {"status": "resolved"}
        answer = await replicas[0].post("/webhook", data=delivery(resolved), headers=headers)
        assert answer.status == 200 and (await answer.json())["recorded"] == 1
        after = from_object(client.get(QUARANTINES, NAME))
        assert not after.spec.source_alerts[0].firing and after.status.phase == Phase.PENDING
    finally:
        for r in replicas:
            await r.close()


def test_an_unreachable_api_is_a_retry_with_nothing_claimed(tmp_path: Path) -> None:
    served = ServedCluster(tmp_path / "kubeconfig")
    kube = KubeClient(KubeTransport(api_client(str(served.kubeconfig))), connect_timeout_seconds=1)
    served.stop()
    try:
        outcome = Recorder(kube, ManualClock()).record(parse_alert(ALERT))
        assert isinstance(outcome, Retry) and "Unavailable" in outcome.reason
    finally:
        kube.close()


def test_an_unreadable_record_is_never_overwritten(cluster: tuple[ServedCluster, KubeClient]) -> None:
    _, client = cluster
    recorder = Recorder(client, ManualClock())
    assert isinstance(recorder.record(parse_alert(ALERT)), Done)
    current = client.get(QUARANTINES, NAME)
    # Valid for the CRD (history phases are free text there), unreadable for the responder.
    hand_edited = {"phase": "Pending", "history": [{"time": "yesterday", "phase": "Whatever"}]}
    broken = client.update(QUARANTINES, {**current, "status": hand_edited}, subresource="status")
    again = copy.deepcopy(ALERT) | {"startsAt": "2026-11-30T11:00:00Z", "fingerprint": "beef"}
    outcome = recorder.record(parse_alert(again))
    assert isinstance(outcome, Retry) and "unreadable record" in outcome.reason
    assert (
        client.get(QUARANTINES, NAME)["metadata"]["resourceVersion"] == broken["metadata"]["resourceVersion"]
    )
    # Not even a duplicate can be judged while the record cannot be read.
    assert isinstance(recorder.record(parse_alert(ALERT)), Retry)
