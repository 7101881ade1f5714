"""One responder per cluster (responder.webhook.intake `intake.cluster`; docs/multi-cluster.md).

Aspects: an alert whose cluster label names another cluster is refused (an `OtherCluster` skip,
never a write), an alert of this cluster or without the label is recorded, a responder with no
cluster of its own takes every alert, the label's name is configurable; the recorder refuses
before it reads, so an API outage never turns another cluster's alert into a 503; over HTTP the
delivery is answered 200, the refusal counted (`result="other_cluster"`) and its reason given,
while the delivery's own-cluster alert is recorded; the settings refuse malformed values.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpuhealth.clock import ManualClock
from gpuhealth.kube.errors import Unavailable
from responder.webhook.alerts import parse_alert
from responder.webhook.intake import IntakeSettings, OtherCluster, Write, decide
from responder.webhook.recorder import Recorder
from responder.webhook.server import WebhookMetrics, WebhookSettings, add_webhook
from tests.responder.test_intake import NOW, alert
from tests.responder.test_recorder import MemoryApi
from tests.responder.test_recorder_simulated import ALERT, NAME

OWN = IntakeSettings(cluster="a")
TOKEN = "s3cret-token"


def in_cluster(cluster: str | None) -> dict[str, Any]:
    """ALERT (a firing quarantine of one device) as the given cluster's Prometheus sends it."""
    labels = dict(ALERT["labels"]) | ({"cluster": cluster} if cluster is not None else {})
    return {**ALERT, "labels": labels, "fingerprint": f"fp-{cluster}"}


def test_an_alert_of_another_cluster_is_refused_and_says_why() -> None:
    decision = decide(None, alert(cluster="b"), now=NOW, settings=OWN)
    assert isinstance(decision, OtherCluster)
    assert "cluster 'b'" in decision.reason and "serves cluster 'a'" in decision.reason


@pytest.mark.parametrize(
    ("settings", "labels"),
    [
        pytest.param(OWN, {"cluster": "a"}, id="own cluster"),
        pytest.param(OWN, {}, id="no cluster label: a Prometheus of one cluster"),
        pytest.param(IntakeSettings(), {"cluster": "b"}, id="no cluster of its own: every alert"),
        pytest.param(
            IntakeSettings(cluster="a", cluster_label="k8s_cluster"),
            {"cluster": "b"},
            id="another label name",
        ),
    ],
)
def test_alerts_of_this_cluster_or_without_one_are_recorded(
    settings: IntakeSettings, labels: dict[str, str]
) -> None:
    assert isinstance(decide(None, alert(**labels), now=NOW, settings=settings), Write)


def test_the_configured_label_name_is_the_one_read() -> None:
    settings = IntakeSettings(cluster="a", cluster_label="k8s_cluster")
    assert isinstance(decide(None, alert(k8s_cluster="b"), now=NOW, settings=settings), OtherCluster)


def test_the_recorder_refuses_before_it_reads(caplog: pytest.LogCaptureFixture) -> None:
    api = MemoryApi()
    api.fail_with = Unavailable("apiserver down")
    with caplog.at_level(logging.WARNING, logger="responder.webhook.recorder"):
        outcome = Recorder(api, ManualClock(), OWN).record(parse_alert(in_cluster("b")))
    assert isinstance(outcome, OtherCluster)
    assert api.objects == {}
    assert "this responder serves cluster 'a'" in caplog.text


async def test_a_delivery_with_another_clusters_alert_is_200_and_counted() -> None:
    api = MemoryApi()
    registry = CollectorRegistry()
    app = web.Application()
    recorder = Recorder(api, ManualClock(), OWN)
    add_webhook(app, WebhookSettings(TOKEN), recorder.record_all, WebhookMetrics(registry))
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        body = {
            "version": "4",
            "status": "firing",
            "receiver": "gpuhealth-responder",
            "groupKey": "k",
            "truncatedAlerts": 0,
            "alerts": [in_cluster("b"), in_cluster("a")],
        }
        response = await client.post(
            "/webhook", data=orjson.dumps(body), headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert response.status == 200, "Alertmanager must not deliver it again"
        answer = await response.json()
        assert answer["recorded"] == 1 and answer["skipped"] == 0
        (reason,) = answer["other_cluster"]
        assert "cluster 'b'" in reason
    finally:
        await client.close()

    def alerts(result: str) -> float | None:
        return registry.get_sample_value("gpuhealth_responder_webhook_alerts_total", {"result": result})

    assert (alerts("other_cluster"), alerts("recorded"), alerts("skipped")) == (1, 1, 0)
    assert list(api.objects) == [NAME], "only cluster a's device has a record"


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"cluster_label": "k8s-cluster"}, "label name"),
        ({"cluster_label": "__cluster"}, "label name"),
        ({"cluster": " a"}, "cluster label's value"),
    ],
)
def test_malformed_cluster_settings_are_refused(kwargs: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        IntakeSettings(**kwargs)  # type: ignore[arg-type]
