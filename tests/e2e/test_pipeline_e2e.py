"""End to end: simulated cluster -> exporter -> real Prometheus (our rules) -> real Alertmanager -> webhooks.

Aspects covered, with every part real except the cluster (simulated) and the webhook
receivers (a recording HTTP server standing in for the responder and on-call):
- a healthy fleet raises no device or node alert, not even a pending one, once every rule
  group has evaluated it;
- a fatal XID on a device-plugin GPU makes the kubelet report it Unhealthy; the exporter's
  series drive `GPUDeviceUnhealthy`, which reaches the responder webhook with the bearer
  token from `credentials_file`, labels `action=quarantine`, `node`, `device` (the GPU UUID),
  and reaches on-call as a page; its resolution reaches the responder too;
- a DRA GPU whose driver stops reporting becomes Unknown: on-call gets the warning
  (`GPUDeviceUnknown`, action none, never sent to the responder), and only after the
  tolerance window (after the warning, no sooner than the window after the fault) the
  responder gets `GPUDeviceUnknownExpired` with `action=restrict` and the DRA identity
  (driver, pool, device_name) joined from `gpu_device_info`, and nothing else;
- a kubelet that stops raises `GPUNodeUnreachable`; its devices' stale-status and expired
  alerts are inhibited in Alertmanager and, while canary alerts posted later on the same
  routes are delivered, reach no receiver: a node outage never reads as every GPU broken.

The rules are rendered from `rules/config.yaml` with time thresholds shrunk to seconds (the
simulated cluster runs 10x faster); nothing else in them changes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.testing.loopback import (
    ScrapeJob,
    WebhookRecorder,
    child_process,
    free_port,
    http_ok,
    inhibited,
    log_tail,
    run_alertmanager,
    run_prometheus,
    wait_until,
)
from rules.render import DEFAULT_CONFIG, parse_config, render, write_files

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPEED = 10.0
TOKEN = "e2e-responder-token"

SCENARIO: dict[str, Any] = {
    "name": "pipeline-e2e",
    "description": "1 device-plugin node and 2 DRA nodes, 2 GPUs each; faults come from the test",
    "fleet": [
        {"name": "gpu-dp", "count": 1, "gpusPerNode": 2, "path": "device-plugin"},
        {"name": "gpu-dra", "count": 2, "gpusPerNode": 2, "path": "dra"},
    ],
    "workloads": [
        {"name": "serve", "namespace": "inference", "kind": "Deployment", "replicas": 2,
         "gpusPerPod": 1, "path": "device-plugin"},
        {"name": "train", "namespace": "research", "kind": "Job", "replicas": 2,
         "gpusPerPod": 2, "path": "dra"},
    ],
    "timeline": [],
}  # fmt: skip

EVALUATION_INTERVAL = 1.0
UNKNOWN_TOLERANCE = 8.0
RECEIVERS = ("/webhook", "/page", "/ticket", "/tenant")

# The shipped thresholds, shrunk from minutes to seconds; the render's own consistency
# checks (node alert before device staleness, storm before tolerance) still apply.
FAST_RULES: dict[str, Any] = {
    "evaluation_interval": f"{EVALUATION_INTERVAL:.0f}s",
    "device": {
        "heartbeat_limit": "8s",
        "unhealthy_for": "2s",
        "unknown_for": "2s",
        "unknown_tolerance": f"{UNKNOWN_TOLERANCE:.0f}s",
        # No backoff here: every Unknown of this test gets the whole window.
        "unknown_tolerance_floor": f"{UNKNOWN_TOLERANCE:.0f}s",
        "flapping_window": "60s",
        "event_window": "30s",
    },
    "node": {"lease_age_limit": "4s", "unreachable_for": "1s"},
    "fleet": {"unknown_storm_for": "3s", "unknown_storm_min_devices": 50},
}


@pytest.fixture
def sink() -> Iterator[WebhookRecorder]:
    with WebhookRecorder() as recording:
        yield recording


def render_rules(workdir: Path, token: str, responder_url: str, **receivers: str) -> tuple[list[Path], Path]:
    """The shipped rules with FAST_RULES' durations, and an Alertmanager config that sends at
    once to `responder_url` (bearer `token`, in `workdir/responder-token`) and to `receivers`
    (`oncall_page_url=`, ...): (Prometheus rule files, Alertmanager config)."""
    token_file = workdir / "responder-token"
    token_file.write_text(token)
    base = yaml.safe_load(DEFAULT_CONFIG.read_text())
    for section, values in FAST_RULES.items():
        base[section] = {**base[section], **values} if isinstance(values, dict) else values
    base["alertmanager"] = {
        **base["alertmanager"],
        "responder_url": responder_url,
        "responder_credentials_file": str(token_file),
        "responder_group_interval": "1s",
        **receivers,
        "group_wait": "0s",
        "group_interval": "1s",
    }
    written = write_files(render(parse_config(base)), workdir / "rules")
    rule_files = [p for p in written if p.parent.name == "prometheus"]
    (alertmanager_config,) = [p for p in written if p.parent.name == "alertmanager"]
    return rule_files, alertmanager_config


@pytest.mark.timeout(300)
def test_faults_flow_from_kubelet_to_the_responder_webhook(tmp_path: Path, sink: WebhookRecorder) -> None:
    from simulator.testing import running_cluster

    rule_files, alertmanager_config = render_rules(
        tmp_path,
        TOKEN,
        f"{sink.url}/webhook",
        oncall_page_url=f"{sink.url}/page",
        oncall_ticket_url=f"{sink.url}/ticket",
        tenant_default_url=f"{sink.url}/tenant",
    )
    exporter_port = free_port()
    with running_cluster(SCENARIO, speed=SPEED) as cluster:
        uuid = {
            (node, gpu): cluster.call(lambda c, node=node, gpu=gpu: c.fleet.gpu(node, gpu).uuid)  # type: ignore[misc]
            for node, gpu in [("gpu-dp-0", 0), ("gpu-dra-0", 1), ("gpu-dra-1", 0)]
        }
        exporter_argv = [
            sys.executable, "-m", "gpuhealth", "exporter", "--kubeconfig", str(cluster.kubeconfig_path),
            "--listen", f"127.0.0.1:{exporter_port}", "--directory", str(tmp_path / "directory.sqlite"),
        ]  # fmt: skip
        exporter_log = tmp_path / "exporter.log"
        with (
            child_process(exporter_argv, exporter_log),
            run_alertmanager(tmp_path / "alertmanager", alertmanager_config) as alertmanager,
            run_prometheus(
                tmp_path / "prometheus",
                [ScrapeJob("gpuhealth-exporter", [f"127.0.0.1:{exporter_port}"])],
                rule_files=rule_files,
                alertmanager_url=alertmanager.base_url,
            ) as prometheus,
        ):
            try:
                wait_until(
                    "the exporter to be ready", lambda: http_ok(f"http://127.0.0.1:{exporter_port}/readyz")
                )
                wait_until(
                    "Prometheus to record every device as not Unknown",
                    lambda: len(prometheus.query("node_device:gpu_device_effective_unknown:bool == 0")) == 6,
                )
                healthy_at = time.time()
                wait_until(
                    "every rule group to evaluate the healthy fleet",
                    lambda: prometheus.evaluated_since(healthy_at),
                )
                # Pending as well as firing: an alert that a healthy fleet would raise shows
                # as pending at the first evaluation, long before its `for:` ends.
                about_devices_or_nodes = [
                    a["labels"]
                    for a in prometheus.alerts(state=None)
                    if "node" in a["labels"] or "device" in a["labels"]
                ]
                assert about_devices_or_nodes == []
                assert prometheus.alerts("firing") == []

                # 1. A fatal XID: confirmed Unhealthy -> quarantine request to the responder.
                dp_device = uuid[("gpu-dp-0", 0)]
                cluster.inject({"fault": "xid", "device": {"node": "gpu-dp-0", "gpu": 0}, "xid": 79})
                delivered = wait_until(
                    "GPUDeviceUnhealthy at the responder",
                    lambda: sink.alerts("/webhook", alertname="GPUDeviceUnhealthy", device=dp_device),
                )
                delivery, alert = delivered[0]
                assert delivery.authorization == f"Bearer {TOKEN}"
                assert alert["status"] == "firing"
                assert alert["labels"]["action"] == "quarantine"
                assert alert["labels"]["severity"] == "critical"
                assert alert["labels"]["node"] == "gpu-dp-0"
                assert alert["annotations"]["runbook_url"].endswith("#gpudeviceunhealthy")
                wait_until(
                    "the page to on-call",
                    lambda: sink.alerts("/page", alertname="GPUDeviceUnhealthy", device=dp_device),
                )

                # 2. A DRA GPU goes silent: a warning first, a restriction only after the window.
                dra_device = uuid[("gpu-dra-0", 1)]
                unknown_from = time.monotonic()
                cluster.inject(
                    {"fault": "device-unknown", "device": {"node": "gpu-dra-0", "gpu": 1}, "duration": "10m"}
                )
                tickets = wait_until(
                    "GPUDeviceUnknown to reach on-call as a ticket",
                    lambda: sink.alerts("/ticket", alertname="GPUDeviceUnknown", device=dra_device),
                )
                delivered = wait_until(
                    "GPUDeviceUnknownExpired at the responder",
                    lambda: sink.alerts("/webhook", alertname="GPUDeviceUnknownExpired", device=dra_device),
                    timeout=40,
                )
                restricted_at = min(d.received_at for d, _ in delivered)
                # Nothing reaches the responder within the tolerance window: the restriction
                # comes after the warning, and no sooner than the window after the fault
                # (less one evaluation: Prometheus stamps evaluations with their scheduled time).
                assert min(d.received_at for d, _ in tickets) < restricted_at
                assert restricted_at - unknown_from >= UNKNOWN_TOLERANCE - EVALUATION_INTERVAL
                labels = delivered[0][1]["labels"]
                assert labels["action"] == "restrict"
                assert (labels["driver"], labels["pool"], labels["device_name"]) == (
                    "gpu.nvidia.com",
                    "gpu-dra-0",
                    "gpu-1",
                )
                assert {a["labels"]["alertname"] for _, a in sink.alerts("/webhook", device=dra_device)} == {
                    "GPUDeviceUnknownExpired"
                }, "an alert other than the expired window asked the responder to act"

                # 3. A kubelet stops: the node is unreachable, its devices' alerts are inhibited.
                silent = "gpu-dra-1"
                cluster.inject({"fault": "kubelet-stop", "node": silent, "duration": "10m"})
                wait_until(
                    "GPUNodeUnreachable in Alertmanager",
                    lambda: alertmanager.alerts(alertname="GPUNodeUnreachable", node=silent),
                    timeout=40,
                )
                silenced = {"GPUDeviceStatusStale", "GPUDeviceUnknownExpired"}

                def inhibited_device_alerts() -> list[dict[str, Any]] | None:
                    alerts = [
                        a for a in alertmanager.alerts(node=silent) if a["labels"]["alertname"] in silenced
                    ]
                    names = {a["labels"]["alertname"] for a in alerts}
                    return alerts if names == silenced and all(map(inhibited, alerts)) else None

                wait_until(
                    "the silent node's stale and expired devices in Alertmanager, inhibited",
                    inhibited_device_alerts,
                    timeout=40,
                )
                # Canaries posted now take the same routes (responder and page, ticket) with
                # nothing to inhibit them: once they are delivered, an alert about the silent
                # node that was not inhibited would have been delivered too.
                canaries = [
                    {"alertname": "GPUDeviceUnknownExpired", "severity": "critical", "action": "restrict",
                     "node": "canary", "device": "GPU-canary-0"},
                    {"alertname": "GPUDeviceStatusStale", "severity": "warning", "action": "none",
                     "node": "canary", "device": "GPU-canary-1"},
                ]  # fmt: skip
                alertmanager.fire(*canaries)
                for path in ("/webhook", "/page", "/ticket"):
                    wait_until(f"the canaries at {path}", lambda path=path: sink.alerts(path, node="canary"))
                about_silent_devices = [
                    (path, a["labels"]["alertname"])
                    for path in RECEIVERS
                    for _, a in sink.alerts(path, node=silent)
                    if a["labels"]["alertname"].startswith("GPUDevice")
                ]
                assert about_silent_devices == [], "a node outage read as broken GPUs"

                # 4. The XID'd GPU recovers: the resolution reaches the responder as well.
                cluster.inject({"fault": "recover", "device": {"node": "gpu-dp-0", "gpu": 0}})
                wait_until(
                    "the resolved GPUDeviceUnhealthy at the responder",
                    lambda: [
                        a
                        for _, a in sink.alerts("/webhook", alertname="GPUDeviceUnhealthy", device=dp_device)
                        if a["status"] == "resolved"
                    ],
                    timeout=40,
                )
            except BaseException:
                print("--- exporter log ---\n" + log_tail(exporter_log))
                print("--- prometheus log ---\n" + log_tail(prometheus.log_path))
                print("--- alertmanager log ---\n" + log_tail(alertmanager.log_path))
                raise
