"""Alertmanager webhook deliveries (responder.webhook.alerts).

Aspects: a real payload version 4 parses into alerts with their own labels; firing or
resolved comes from `status`, never `endsAt`; the zero time is no time; unknown fields are
ignored; a malformed envelope is a PayloadError naming the field; a malformed alert is
rejected alone while the others still parse; idempotency and device keys; junk never
raises anything but PayloadError.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.outcomes import PermanentError
from responder.webhook.alerts import (
    FIRING,
    QUARANTINE,
    RESOLVED,
    DeviceKey,
    PayloadError,
    parse_delivery,
)

# The shape Alertmanager posts (fields as its webhook notifier writes them; payload version 4).
PAYLOAD: dict[str, Any] = {
    "receiver": "gpuhealth-responder",
    "status": "firing",
    "alerts": [
        {
            "status": "firing",
            "labels": {
                "alertname": "GPUDeviceUnhealthy",
                "action": "quarantine",
                "node": "gpu-node-1",
                "device": "GPU-4a1c",
                "severity": "critical",
            },
            "annotations": {"summary": "GPU GPU-4a1c on gpu-node-1 is Unhealthy."},
            "startsAt": "2026-11-30T10:00:00.123456789Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus/graph?g0.expr=...",
            "fingerprint": "c2a5b0f7e1d3a9b4",
        }
    ],
    "groupLabels": {"alertname": "GPUDeviceUnhealthy", "node": "gpu-node-1", "device": "GPU-4a1c"},
    "commonLabels": {"alertname": "SomethingElse", "node": "not-this-one"},
    "commonAnnotations": {},
    "externalURL": "http://alertmanager:9093",
    "version": "4",
    "groupKey": '{}/{action=~"quarantine|restrict"}:{alertname="GPUDeviceUnhealthy"}',
    "truncatedAlerts": 0,
    "aFieldOfAFutureRelease": {"ignored": True},
}


def payload(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(PAYLOAD)
    body.update(changes)
    return body


def test_a_delivery_parses_with_each_alerts_own_labels() -> None:
    delivery = parse_delivery(payload())
    (alert,) = delivery.alerts
    assert alert.status == FIRING
    assert alert.action == QUARANTINE
    assert alert.device_key == DeviceKey("gpu-node-1", "GPU-4a1c")  # not commonLabels' node
    assert alert.name == "GPUDeviceUnhealthy"
    assert alert.starts_at == pytest.approx(1796032800.123456)
    assert alert.ends_at is None  # Alertmanager's zero time
    assert delivery.truncated_alerts == 0 and delivery.rejected == ()


def test_resolved_comes_from_status_not_from_ends_at() -> None:
    body = payload()
    body["alerts"][0]["status"] = "resolved"
    body["alerts"][0]["endsAt"] = "2099-01-01T00:00:00Z"  # a resolved alert with a future endsAt
    (alert,) = parse_delivery(body).alerts
    assert alert.status == RESOLVED


def test_idempotency_key_is_the_same_for_redeliveries_and_differs_for_resolved() -> None:
    firing = parse_delivery(payload()).alerts[0]
    again = parse_delivery(payload(receiver="peer")).alerts[0]
    body = payload()
    body["alerts"][0]["status"] = "resolved"
    resolved = parse_delivery(body).alerts[0]
    assert firing.idempotency_key == again.idempotency_key
    assert resolved.idempotency_key != firing.idempotency_key


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "the body must be a JSON object, not a list"),
        (payload(version="3"), "version: expected '4'"),
        (payload(alerts=None), "alerts: expected a list, got null"),
        (payload(truncatedAlerts=-1), "truncatedAlerts: expected a whole number >= 0"),
        (payload(status="pending"), "status: expected 'firing' or 'resolved'"),
        (payload(receiver=3), "receiver: expected a string, got int"),
    ],
)
def test_a_malformed_envelope_names_its_field(body: Any, message: str) -> None:
    with pytest.raises(PayloadError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_delivery(body)
    assert issubclass(PayloadError, PermanentError)  # the webhook answers 400, never retried


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"labels": None}, "alerts[1].labels: expected an object of strings, got null"),
        ({"labels": {"action": "quarantine", "node": "n"}}, "alerts[1].labels.device: required when action"),
        ({"labels": {"action": "reboot-everything"}}, "alerts[1].labels.action: expected one of"),
        ({"labels": {"node": 7}}, "alerts[1].labels.node: expected a string, got int"),
        ({"startsAt": "yesterday"}, "alerts[1].startsAt: 'yesterday' is not an RFC 3339 time"),
        ({"startsAt": "2026-11-30T10:00:00"}, "has no time zone"),
        ({"fingerprint": ""}, "alerts[1].fingerprint: expected a non-empty string"),
        ({"status": None}, "alerts[1].status: expected 'firing' or 'resolved'"),
    ],
)
def test_a_malformed_alert_is_rejected_alone(change: dict[str, Any], message: str) -> None:
    body = payload()
    bad = copy.deepcopy(body["alerts"][0]) | change
    body["alerts"].append(bad)
    delivery = parse_delivery(body)
    assert len(delivery.alerts) == 1  # the good alert still parses
    (rejected,) = delivery.rejected
    assert message in rejected


def test_alerts_for_people_need_no_device() -> None:
    body = payload()
    body["alerts"][0]["labels"] = {"alertname": "GPUHealthResponderDown", "severity": "critical"}
    (alert,) = parse_delivery(body).alerts
    assert alert.action == "none" and alert.device_key is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@given(json_values)
def test_junk_bodies_raise_only_payload_error(body: Any) -> None:
    with contextlib.suppress(PayloadError):
        parse_delivery(body)


@given(st.sampled_from(["status", "labels", "annotations", "startsAt", "endsAt", "fingerprint"]), json_values)
def test_junk_in_any_alert_field_is_rejected_or_parsed_never_crashes(field: str, value: Any) -> None:
    body = payload()
    body["alerts"][0][field] = value
    delivery = parse_delivery(body)
    assert len(delivery.alerts) + len(delivery.rejected) == 1
