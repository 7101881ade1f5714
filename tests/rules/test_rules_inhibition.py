"""Inhibition rules, checked against a real Alertmanager 0.25 on loopback.

amtool cannot evaluate inhibitions, so these tests start `prometheus-alertmanager` with the
rendered config, post alerts through its v2 API and read back which ones it marks as
inhibited. Aspects covered: a node outage silences that node's device alerts only; a
fleet Unknown storm silences restrict actions but not quarantines; critical beats warning
for the same device, but never across alerts that lack node and device labels.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuhealth.testing.loopback import Alertmanager, run_alertmanager
from tests.rules.support import ALERTMANAGER_CONFIG

pytestmark = pytest.mark.integration


def post(alertmanager: Alertmanager, *label_sets: dict[str, str]) -> None:
    now = datetime.now(UTC)
    alertmanager.post(
        [
            {
                "labels": labels,
                "annotations": {"summary": "test"},
                "startsAt": now.isoformat(),
                "endsAt": (now + timedelta(hours=1)).isoformat(),
            }
            for labels in label_sets
        ]
    )


def inhibited(
    alertmanager: Alertmanager, expected: dict[tuple[str, str, str], bool]
) -> dict[tuple[str, str, str], bool]:
    """(alertname, node, device) -> inhibited, for every listed alert.

    The inhibitor learns about source alerts asynchronously, so this waits until every
    posted alert is listed and every alert expected to be inhibited is; the snapshot
    taken then also shows any alert inhibited that should not be.
    """
    deadline = time.monotonic() + 10
    while True:
        state = {
            (a["labels"]["alertname"], a["labels"].get("node", ""), a["labels"].get("device", "")): bool(
                a["status"]["inhibitedBy"]
            )
            for a in alertmanager.alerts()
        }
        ready = state.keys() >= expected.keys() and all(state[k] for k, v in expected.items() if v)
        if ready or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


@pytest.fixture
def alertmanager(alertmanager_bin: str, tmp_path: Path) -> Iterator[Alertmanager]:
    with run_alertmanager(tmp_path / "alertmanager", ALERTMANAGER_CONFIG) as running:
        yield running


def _device_alert(name: str, severity: str, action: str, node: str, device: str) -> dict[str, str]:
    return {"alertname": name, "severity": severity, "action": action, "node": node, "device": device}


def test_a_node_outage_inhibits_that_nodes_device_alerts_only(alertmanager: Alertmanager) -> None:
    post(
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
    assert inhibited(alertmanager, expected) == expected


def test_an_unknown_storm_inhibits_restrict_everywhere_but_quarantine_still_flows(
    alertmanager: Alertmanager,
) -> None:
    post(
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
    assert inhibited(alertmanager, expected) == expected


def test_critical_beats_warning_for_the_same_device_and_never_across_labelless_alerts(
    alertmanager: Alertmanager,
) -> None:
    post(
        alertmanager,
        _device_alert("GPUDeviceUnhealthy", "critical", "quarantine", "n1", "GPU-1"),
        _device_alert("GPUDeviceUnknown", "warning", "none", "n1", "GPU-1"),
        _device_alert("GPUDeviceUnknown", "warning", "none", "n1", "GPU-2"),
        {"alertname": "GPUHealthBreakerTripped", "severity": "critical", "action": "none"},
        {"alertname": "GPUDeviceMigrationFailed", "severity": "warning", "action": "none"},
    )
    expected = {
        ("GPUDeviceUnhealthy", "n1", "GPU-1"): False,
        ("GPUDeviceUnknown", "n1", "GPU-1"): True,
        ("GPUDeviceUnknown", "n1", "GPU-2"): False,
        ("GPUHealthBreakerTripped", "", ""): False,
        ("GPUDeviceMigrationFailed", "", ""): False,
    }
    assert inhibited(alertmanager, expected) == expected
