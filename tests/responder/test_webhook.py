"""The webhook contract with Alertmanager (responder.webhook.server), over HTTP with a fake recorder.

Aspects: fail closed without the token (401, constant-time compare, no open mode); bounded
body (413 by Content-Length and by what arrives); malformed JSON and payloads are 400 naming
the field; every alert recorded -> 200; one malformed alert -> 400 while the others are still
recorded; anything not recorded -> 503 with Retry-After (never 429, never 200); truncated
deliveries are counted; per-alert results and request outcomes in the metrics.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpuhealth.outcomes import Done, Outcome, Retry, Unchanged
from responder.webhook.alerts import Alert
from responder.webhook.server import WebhookMetrics, WebhookSettings, add_webhook

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

ALERT: dict[str, Any] = {
    "status": "firing",
    "labels": {"alertname": "GPUDeviceUnhealthy", "action": "quarantine", "node": "n1", "device": "GPU-1"},
    "annotations": {},
    "startsAt": "2026-11-30T10:00:00Z",
    "endsAt": "0001-01-01T00:00:00Z",
    "fingerprint": "abc",
}


def delivery(*alerts: dict[str, Any], truncated: int = 0) -> dict[str, Any]:
    return {
        "version": "4",
        "status": "firing",
        "receiver": "gpuhealth-responder",
        "groupKey": "k",
        "truncatedAlerts": truncated,
        "alerts": list(alerts) or [ALERT],
    }


class FakeRecorder:
    def __init__(self, outcome: Outcome | None = None) -> None:
        self.outcome = outcome or Done("recorded")
        self.seen: list[Alert] = []

    def __call__(self, alerts: Sequence[Alert]) -> list[Outcome]:
        self.seen.extend(alerts)
        return [self.outcome for _ in alerts]


async def client_for(
    recorder: FakeRecorder, registry: CollectorRegistry, **settings: Any
) -> TestClient[web.Request, web.Application]:
    app = web.Application()
    add_webhook(app, WebhookSettings(TOKEN, **settings), recorder, WebhookMetrics(registry))
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def requests(registry: CollectorRegistry, outcome: str) -> float:
    return (
        registry.get_sample_value("gpuhealth_responder_webhook_requests_total", {"outcome": outcome}) or 0.0
    )


async def test_without_the_token_nothing_is_recorded(registry: CollectorRegistry) -> None:
    recorder = FakeRecorder()
    client = await client_for(recorder, registry)
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            response = await client.post("/webhook", data=orjson.dumps(delivery()), headers=headers)
            assert response.status == 401
            assert response.headers["WWW-Authenticate"] == "Bearer"
        assert recorder.seen == [] and requests(registry, "unauthorized") == 3
    finally:
        await client.close()


def test_an_empty_token_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="never runs unauthenticated"):
        WebhookSettings("  ")


async def test_a_recorded_delivery_is_200(registry: CollectorRegistry) -> None:
    recorder = FakeRecorder()
    client = await client_for(recorder, registry)
    try:
        response = await client.post("/webhook", data=orjson.dumps(delivery()), headers=AUTH)
        assert response.status == 200
        assert (await response.json())["recorded"] == 1
        assert [str(a.device_key) for a in recorder.seen] == ["DeviceKey(node='n1', device='GPU-1')"]
        assert (
            registry.get_sample_value("gpuhealth_responder_webhook_alerts_total", {"result": "recorded"}) == 1
        )
        assert requests(registry, "accepted") == 1
    finally:
        await client.close()


async def test_duplicates_are_200(registry: CollectorRegistry) -> None:
    client = await client_for(FakeRecorder(Unchanged("already recorded")), registry)
    try:
        response = await client.post("/webhook", data=orjson.dumps(delivery()), headers=AUTH)
        assert response.status == 200 and (await response.json())["unchanged"] == 1
    finally:
        await client.close()


async def test_what_was_not_recorded_is_503_with_retry_after(registry: CollectorRegistry) -> None:
    client = await client_for(FakeRecorder(Retry("API unreachable", 7.5)), registry)
    try:
        response = await client.post("/webhook", data=orjson.dumps(delivery()), headers=AUTH)
        assert response.status == 503
        assert response.headers["Retry-After"] == "8"
        assert (await response.json())["retry"] == ["API unreachable"]
        assert requests(registry, "retry") == 1
    finally:
        await client.close()


async def test_oversized_bodies_are_413(registry: CollectorRegistry) -> None:
    recorder = FakeRecorder()
    client = await client_for(recorder, registry, max_body_bytes=2048)
    big = delivery(*[copy.deepcopy(ALERT) for _ in range(30)])
    try:
        response = await client.post("/webhook", data=orjson.dumps(big), headers=AUTH)
        assert response.status == 413
        chunked = await client.post("/webhook", data=_chunks(orjson.dumps(big)), headers=AUTH)
        assert chunked.status == 413  # no Content-Length: bounded by what arrives
        assert recorder.seen == [] and requests(registry, "too_large") == 2
    finally:
        await client.close()


async def _chunks(data: bytes) -> Any:
    for i in range(0, len(data), 512):
        yield data[i : i + 512]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "the body is not JSON"),
        (orjson.dumps({"version": "4", "alerts": "x"}), "alerts: expected a list"),
        (orjson.dumps([1, 2]), "the body must be a JSON object"),
    ],
)
async def test_malformed_deliveries_are_400_naming_the_field(
    registry: CollectorRegistry, body: bytes, message: str
) -> None:
    client = await client_for(FakeRecorder(), registry)
    try:
        response = await client.post("/webhook", data=body, headers=AUTH)
        assert response.status == 400
        assert message in (await response.json())["error"]
    finally:
        await client.close()


async def test_one_malformed_alert_is_400_and_the_others_are_recorded(registry: CollectorRegistry) -> None:
    recorder = FakeRecorder()
    client = await client_for(recorder, registry)
    bad = copy.deepcopy(ALERT)
    bad["labels"].pop("device")
    try:
        response = await client.post("/webhook", data=orjson.dumps(delivery(ALERT, bad)), headers=AUTH)
        assert response.status == 400
        answer = await response.json()
        assert answer["recorded"] == 1
        assert answer["rejected"] == ["alerts[1].labels.device: required when action is quarantine"]
        assert len(recorder.seen) == 1
    finally:
        await client.close()


async def test_truncated_deliveries_are_counted(registry: CollectorRegistry) -> None:
    client = await client_for(FakeRecorder(), registry)
    try:
        response = await client.post("/webhook", data=orjson.dumps(delivery(truncated=4)), headers=AUTH)
        assert response.status == 200
        assert registry.get_sample_value("gpuhealth_responder_webhook_truncated_alerts_total") == 4
    finally:
        await client.close()
