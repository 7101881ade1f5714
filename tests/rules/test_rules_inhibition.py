"""Inhibition rules, checked against a real Alertmanager 0.35 on loopback.

amtool cannot evaluate inhibitions, so these tests start `alertmanager` with the
rendered config, post alerts through its v2 API and read back which ones it marks as
inhibited. Aspects covered: a node outage silences that node's device alerts only; a
fleet Unknown storm silences restrict actions but not quarantines; critical beats warning
for the same device, but never across alerts that lack node and device labels; two clusters
with the same node and device names are grouped and inhibited apart (docs/multi-cluster.md).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from pathlib import Path

import pytest

from gpuhealth.testing.loopback import Alertmanager, http_json, inhibited, run_alertmanager, wait_until
from tests.rules.support import ALERTMANAGER_CONFIG

pytestmark = pytest.mark.integration

AlertKey = tuple[str, str, str]
"""(alertname, node, device) of an alert; "" for a label it lacks."""

BARRIER_NODE = "barrier"
BARRIER = (
    {"alertname": "GPUNodeUnreachable", "severity": "warning", "action": "none", "node": BARRIER_NODE},
    {"alertname": "GPUDeviceStatusStale", "severity": "warning", "action": "none",
     "node": BARRIER_NODE, "device": "GPU-barrier"},
)  # fmt: skip
"""A source and the target it inhibits (the node-outage rule), on a node of their own, posted
after the alerts under test. Without that rule every test here times out waiting for it."""


def key(labels: dict[str, str]) -> AlertKey:
    return (labels["alertname"], labels.get("node", ""), labels.get("device", ""))


def inhibition_of(
    alertmanager: Alertmanager,
    *label_sets: dict[str, str],
    key_of: Callable[[dict[str, str]], Hashable] = key,
) -> dict[Hashable, bool]:
    """Post `label_sets`, then return key_of(labels) (by default (alertname, node, device)) ->
    inhibited for each of them.

    Alertmanager's inhibitor learns about source alerts asynchronously, from the stream of
    alerts in the order they were posted. So the barrier pair is posted after the alerts
    under test, and the answer is read only once the barrier's target shows as inhibited:
    by then the inhibitor has seen every alert under test, and an inhibition missing from
    the answer (or one too many) is the configuration's, not a look taken too early.
    """
    alertmanager.fire(*label_sets)
    alertmanager.fire(*BARRIER)
    barrier_target = key(BARRIER[1])

    def settled() -> dict[AlertKey, bool] | None:
        alerts = alertmanager.alerts()
        barrier_seen = any(key(a["labels"]) == barrier_target and inhibited(a) for a in alerts)
        return alerts if barrier_seen else None

    alerts = wait_until("the inhibitor to see the barrier posted after the alerts", settled, timeout=10)
    return {key_of(a["labels"]): inhibited(a) for a in alerts if a["labels"].get("node") != BARRIER_NODE}


@pytest.fixture
def alertmanager(alertmanager_bin: str, tmp_path: Path) -> Iterator[Alertmanager]:
    with run_alertmanager(tmp_path / "alertmanager", ALERTMANAGER_CONFIG) as running:
        yield running


def _device_alert(name: str, severity: str, action: str, node: str, device: str) -> dict[str, str]:
    return {"alertname": name, "severity": severity, "action": action, "node": node, "device": device}


def test_a_node_outage_inhibits_that_nodes_device_alerts_only(alertmanager: Alertmanager) -> None:
    state = inhibition_of(
        alertmanager,
        {"alertname": "GPUNodeUnreachable", "severity": "warning", "action": "none", "node": "n1"},
        _device_alert("GPUDeviceUnknownExpired", "critical", "restrict", "n1", "GPU-1"),
        _device_alert("GPUDeviceStatusStale", "warning", "none", "n1", "GPU-2"),
        _device_alert("GPUDeviceUnhealthy", "critical", "quarantine", "n2", "GPU-3"),
        {"alertname": "GPUHealthExporterDown", "severity": "critical", "action": "none"},
    )
    expected = {
        ("GPUNodeUnreachable", "n1", ""): False,
        ("GPUDeviceUnknownExpired", "n1", "GPU-1"): True,
        ("GPUDeviceStatusStale", "n1", "GPU-2"): True,
        ("GPUDeviceUnhealthy", "n2", "GPU-3"): False,
        ("GPUHealthExporterDown", "", ""): False,
    }
    assert state == expected


def test_an_unknown_storm_inhibits_restrict_everywhere_but_quarantine_still_flows(
    alertmanager: Alertmanager,
) -> None:
    state = inhibition_of(
        alertmanager,
        {"alertname": "GPUFleetUnknownStorm", "severity": "critical", "action": "none"},
        _device_alert("GPUDeviceUnknownExpired", "critical", "restrict", "n1", "GPU-1"),
        _device_alert("GPUDeviceUnknownFlapping", "warning", "restrict", "n2", "GPU-2"),
        _device_alert("GPUDeviceFatalXid", "critical", "quarantine", "n3", "GPU-3"),
        _device_alert("GPUDeviceUnknown", "warning", "none", "n4", "GPU-4"),
    )
    expected = {
        ("GPUFleetUnknownStorm", "", ""): False,
        ("GPUDeviceUnknownExpired", "n1", "GPU-1"): True,
        ("GPUDeviceUnknownFlapping", "n2", "GPU-2"): True,
        ("GPUDeviceFatalXid", "n3", "GPU-3"): False,
        ("GPUDeviceUnknown", "n4", "GPU-4"): False,
    }
    assert state == expected


def test_critical_beats_warning_for_the_same_device_and_never_across_labelless_alerts(
    alertmanager: Alertmanager,
) -> None:
    state = inhibition_of(
        alertmanager,
        _device_alert("GPUDeviceUnhealthy", "critical", "quarantine", "n1", "GPU-1"),
        _device_alert("GPUDeviceUnknown", "warning", "none", "n1", "GPU-1"),
        _device_alert("GPUDeviceUnknown", "warning", "none", "n1", "GPU-2"),
        {"alertname": "GPUHealthBreakerTripped", "severity": "critical", "action": "none"},
        {"alertname": "GPUDeviceMigrationFailed", "severity": "warning", "action": "none"},
        {"alertname": "GPUDeviceMigrationUnrecoverable", "severity": "warning", "action": "none"},
        # A stuck flow is the responder's problem: the device's own critical alert (a person is
        # on the device) must not hide it.
        {"alertname": "GPUHealthQuarantinePhaseStuck", "severity": "warning", "action": "none",
         "node": "n1", "device": "GPU-1", "phase": "Deferred"},
    )  # fmt: skip
    expected = {
        ("GPUDeviceUnhealthy", "n1", "GPU-1"): False,
        ("GPUDeviceUnknown", "n1", "GPU-1"): True,
        ("GPUDeviceUnknown", "n1", "GPU-2"): False,
        ("GPUHealthBreakerTripped", "", ""): False,
        ("GPUDeviceMigrationFailed", "", ""): False,
        ("GPUDeviceMigrationUnrecoverable", "", ""): False,
        ("GPUHealthQuarantinePhaseStuck", "n1", "GPU-1"): False,
    }
    assert state == expected


def _in_cluster(cluster: str, labels: dict[str, str]) -> dict[str, str]:
    return {"cluster": cluster, **labels}


def _cluster_key(labels: dict[str, str]) -> tuple[str, ...]:
    return (labels.get("cluster", ""), *key(labels))


def test_a_node_outage_in_one_cluster_leaves_the_same_named_node_of_another_alone(
    alertmanager: Alertmanager,
) -> None:
    unhealthy = _device_alert("GPUDeviceUnhealthy", "critical", "quarantine", "n1", "GPU-1")
    restrict = _device_alert("GPUDeviceUnknownExpired", "critical", "restrict", "n2", "GPU-2")
    state = inhibition_of(
        alertmanager,
        _in_cluster(
            "a", {"alertname": "GPUNodeUnreachable", "severity": "warning", "action": "none", "node": "n1"}
        ),
        _in_cluster("a", {"alertname": "GPUFleetUnknownStorm", "severity": "critical", "action": "none"}),
        _in_cluster("a", unhealthy),
        _in_cluster("b", unhealthy),
        _in_cluster("a", restrict),
        _in_cluster("b", restrict),
        key_of=_cluster_key,
    )
    assert state == {
        ("a", "GPUNodeUnreachable", "n1", ""): False,
        ("a", "GPUFleetUnknownStorm", "", ""): False,
        ("a", "GPUDeviceUnhealthy", "n1", "GPU-1"): True,
        ("b", "GPUDeviceUnhealthy", "n1", "GPU-1"): False,
        # Cluster a's storm holds back cluster a's restrictions only.
        ("a", "GPUDeviceUnknownExpired", "n2", "GPU-2"): True,
        ("b", "GPUDeviceUnknownExpired", "n2", "GPU-2"): False,
    }


def test_two_clusters_same_named_alerts_are_notified_in_separate_groups(alertmanager: Alertmanager) -> None:
    unhealthy = _device_alert("GPUDeviceUnhealthy", "critical", "quarantine", "n1", "GPU-1")
    alertmanager.fire(_in_cluster("a", unhealthy), _in_cluster("b", unhealthy))

    def responder_groups() -> list[dict[str, str]] | None:
        groups = http_json(f"{alertmanager.base_url}/api/v2/alerts/groups")
        found = [g["labels"] for g in groups if g["receiver"]["name"] == "gpuhealth-responder"]
        return found if len(found) >= 2 else None

    groups = wait_until("both clusters' alerts to be grouped", responder_groups, timeout=10)
    assert sorted(groups, key=lambda g: g["cluster"]) == [
        {"cluster": "a", "alertname": "GPUDeviceUnhealthy", "node": "n1", "device": "GPU-1"},
        {"cluster": "b", "alertname": "GPUDeviceUnhealthy", "node": "n1", "device": "GPU-1"},
    ]
