"""Inhibition rules, checked against a real Alertmanager 0.35 on loopback.

amtool cannot evaluate inhibitions, so these tests start `alertmanager` with the
rendered config, post alerts through its v2 API and read back which ones it marks as
inhibited. Aspects covered: a node outage silences that node's device alerts only; a
fleet Unknown storm silences restrict actions but not quarantines; critical beats warning
for the same device, but never across alerts that lack node and device labels.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhealth.testing.loopback import Alertmanager, inhibited, run_alertmanager, wait_until
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


def inhibition_of(alertmanager: Alertmanager, *label_sets: dict[str, str]) -> dict[AlertKey, bool]:
    """Post `label_sets`, then return (alertname, node, device) -> inhibited for each of them.

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
        state = {key(a["labels"]): inhibited(a) for a in alertmanager.alerts()}
        return state if state.get(barrier_target) else None

    state = wait_until("the inhibitor to see the barrier posted after the alerts", settled, timeout=10)
    return {k: v for k, v in state.items() if k[1] != BARRIER_NODE}


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
