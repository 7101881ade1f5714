"""Alertmanager routing, checked with `amtool config routes test` on the rendered config.

Aspects covered: quarantine/restrict alerts reach the responder and people both (continue),
critical pages and the rest becomes a ticket, alerts with a namespace reach their tenant unless
their workload layer's `owner` is the platform, and every alert in the rule files routes as its
severity and action say.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rules.render import parse_config, render, write_files
from tests.rules.support import ALERTMANAGER_CONFIG, PROMETHEUS_DIR, run_tool


def receivers_for(amtool: str, config: Path, labels: dict[str, str]) -> list[str]:
    label_args = [f"{k}={v}" for k, v in labels.items()]
    result = run_tool([amtool, "config", "routes", "test", f"--config.file={config}", *label_args])
    assert result.returncode == 0, f"amtool config routes test failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout.strip().split(",")


CASES = [
    pytest.param(
        {"alertname": "GPUDeviceUnhealthy", "severity": "critical", "action": "quarantine", "node": "n1"},
        ["gpuhealth-responder", "oncall-page"],
        id="confirmed failure: responder and page",
    ),
    pytest.param(
        {"alertname": "GPUDeviceUnhealthyFlapping", "severity": "critical", "action": "quarantine"},
        ["gpuhealth-responder", "oncall-page"],
        id="Unhealthy flapping: responder and page, like any quarantine",
    ),
    pytest.param(
        {"alertname": "GPUDeviceUnknownExpired", "severity": "critical", "action": "restrict"},
        ["gpuhealth-responder", "oncall-page"],
        id="expired Unknown: responder and page",
    ),
    pytest.param(
        {"alertname": "GPUDeviceUnknownFlapping", "severity": "warning", "action": "restrict"},
        ["gpuhealth-responder", "oncall-ticket"],
        id="flapping: responder and ticket",
    ),
    pytest.param(
        {"alertname": "GPUDeviceUnknown", "severity": "warning", "action": "none"},
        ["oncall-ticket"],
        id="warning without action: ticket only",
    ),
    pytest.param(
        {"alertname": "GPUFleetUnknownStorm", "severity": "critical", "action": "none"},
        ["oncall-page"],
        id="storm pages, never reaches the responder",
    ),
    pytest.param(
        {"alertname": "SomeTenantAlert", "severity": "warning", "namespace": "team-x"},
        ["tenant-default", "oncall-ticket"],
        id="namespaced warning: tenant and ticket",
    ),
    pytest.param(
        {"alertname": "X", "severity": "critical", "action": "quarantine", "namespace": "team-x"},
        ["gpuhealth-responder", "tenant-default", "oncall-page"],
        id="namespaced critical quarantine: all three",
    ),
    pytest.param(
        {
            "alertname": "GPUWorkloadUnallocated",
            "severity": "warning",
            "action": "none",
            "owner": "platform",
            "namespace": "team-x",
            "pod": "p",
        },
        ["oncall-ticket"],
        id="a workload layer the platform owns (allocation): on-call, not the tenant",
    ),
    pytest.param(
        {
            "alertname": "GPUWorkloadNotReady",
            "severity": "warning",
            "action": "none",
            "owner": "tenant",
            "namespace": "team-x",
            "pod": "p",
        },
        ["tenant-default", "oncall-ticket"],
        id="a workload layer the tenant owns (readiness, SLO): the tenant",
    ),
    pytest.param(
        {"alertname": "Unlabelled"},
        ["oncall-ticket"],
        id="no labels: ticket",
    ),
]


@pytest.mark.parametrize(("labels", "expected"), CASES)
def test_routes(amtool: str, labels: dict[str, str], expected: list[str]) -> None:
    assert receivers_for(amtool, ALERTMANAGER_CONFIG, labels) == expected


def test_every_alert_routes_by_its_severity_and_action(amtool: str) -> None:
    checked = 0
    for path in sorted(PROMETHEUS_DIR.glob("*.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                labels = {"alertname": rule["alert"], **rule["labels"], "node": "n1", "device": "GPU-1"}
                expected = []
                if labels["action"] in ("quarantine", "restrict"):
                    expected.append("gpuhealth-responder")
                expected.append("oncall-page" if labels["severity"] == "critical" else "oncall-ticket")
                assert receivers_for(amtool, ALERTMANAGER_CONFIG, labels) == expected, rule["alert"]
                checked += 1
    assert checked >= 16


def test_configured_tenants_get_their_own_receiver(amtool: str, tmp_path: Path) -> None:
    settings = parse_config(
        {
            "alertmanager": {
                "tenants": [
                    {"namespace": "inference-prod", "url": "http://127.0.0.1:9096/tenant/inference-prod"},
                    {"namespace": "training", "url": "https://tenants.example/training"},
                ]
            }
        }
    )
    write_files(render(settings), tmp_path)
    config = tmp_path / "alertmanager" / "alertmanager.yaml"
    assert run_tool([amtool, "check-config", str(config)]).returncode == 0
    assert receivers_for(amtool, config, {"alertname": "A", "namespace": "inference-prod"}) == [
        "tenant-inference-prod",
        "oncall-ticket",
    ]
    critical = {"alertname": "A", "namespace": "training", "severity": "critical"}
    assert receivers_for(amtool, config, critical) == [
        "tenant-training",
        "oncall-page",
    ]
    assert receivers_for(amtool, config, {"alertname": "A", "namespace": "other"}) == [
        "tenant-default",
        "oncall-ticket",
    ]


def test_responder_receiver_is_authenticated_and_hears_resolutions() -> None:
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    (responder,) = [r for r in config["receivers"] if r["name"] == "gpuhealth-responder"]
    (webhook,) = responder["webhook_configs"]
    assert webhook["url"] == "http://127.0.0.1:8080/webhook"
    assert webhook["send_resolved"] is True
    assert webhook["http_config"]["authorization"]["credentials_file"].startswith("/")
    (route,) = [r for r in config["route"]["routes"] if r["receiver"] == "gpuhealth-responder"]
    assert route["continue"] is True
    assert route["group_wait"] == "0s"
    assert config["route"]["group_by"] == ["cluster", "alertname", "node", "device"]
