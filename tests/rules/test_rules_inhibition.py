"""Inhibition rules, checked against a real Alertmanager 0.25 on loopback.

amtool cannot evaluate inhibitions, so these tests start `prometheus-alertmanager` with the
rendered config, post alerts through its v2 API and read back which ones it marks as
inhibited. Aspects covered: a node outage silences that node's device alerts only; a
fleet Unknown storm silences restrict actions but not quarantines; critical beats warning
for the same device, but never across alerts that lack node and device labels.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.rules.support import ALERTMANAGER_CONFIG

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _request(url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


class Alertmanager:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def post(self, *label_sets: dict[str, str]) -> None:
        now = datetime.now(UTC)
        alerts = [
            {
                "labels": labels,
                "annotations": {"summary": "test"},
                "startsAt": now.isoformat(),
                "endsAt": (now + timedelta(hours=1)).isoformat(),
            }
            for labels in label_sets
        ]
        _request(f"{self.base_url}/api/v2/alerts", alerts)

    def inhibited(self, expected: dict[tuple[str, str, str], bool]) -> dict[tuple[str, str, str], bool]:
        """(alertname, node, device) -> inhibited, for every listed alert.

        The inhibitor learns about source alerts asynchronously, so this waits until every
        posted alert is listed and every alert expected to be inhibited is; the snapshot
        taken then also shows any alert inhibited that should not be.
        """
        deadline = time.monotonic() + 10
        while True:
            listed = _request(f"{self.base_url}/api/v2/alerts")
            state = {
                (a["labels"]["alertname"], a["labels"].get("node", ""), a["labels"].get("device", "")): bool(
                    a["status"]["inhibitedBy"]
                )
                for a in listed
            }
            ready = state.keys() >= expected.keys() and all(state[k] for k, v in expected.items() if v)
            if ready or time.monotonic() > deadline:
                return state
            time.sleep(0.05)


@pytest.fixture
def alertmanager(alertmanager_bin: str, tmp_path: Path) -> Iterator[Alertmanager]:
    port = _free_port()
    proc = subprocess.Popen(
        [
            alertmanager_bin,
            f"--config.file={ALERTMANAGER_CONFIG}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(f"{base_url}/-/ready", timeout=1).close()
                break
            except (urllib.error.URLError, ConnectionError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    _out, err = proc.communicate(timeout=5)
                    pytest.fail(f"alertmanager did not start:\n{err}")
                time.sleep(0.05)
        yield Alertmanager(base_url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        if proc.stderr is not None:
            proc.stderr.close()


def _device_alert(name: str, severity: str, action: str, node: str, device: str) -> dict[str, str]:
    return {"alertname": name, "severity": severity, "action": action, "node": node, "device": device}


def test_a_node_outage_inhibits_that_nodes_device_alerts_only(alertmanager: Alertmanager) -> None:
    alertmanager.post(
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
    assert alertmanager.inhibited(expected) == expected


def test_an_unknown_storm_inhibits_restrict_everywhere_but_quarantine_still_flows(
    alertmanager: Alertmanager,
) -> None:
    alertmanager.post(
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
    assert alertmanager.inhibited(expected) == expected


def test_critical_beats_warning_for_the_same_device_and_never_across_labelless_alerts(
    alertmanager: Alertmanager,
) -> None:
    alertmanager.post(
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
    assert alertmanager.inhibited(expected) == expected
