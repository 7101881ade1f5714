"""The shipped rules unchanged under a multi-cluster ruler (docs/multi-cluster.md).

Two clusters, each with its own Prometheus (external label cluster=a or b) scraping an
exporter-like target that serves the same node and device names; a third, real Prometheus
federates both (`/federate`, `honor_labels`: the series keep their job and gain their cluster) and
evaluates the shipped rules, their durations shrunk to seconds. Aspects: cluster a's Unhealthy
device fires GPUDeviceUnhealthy with cluster="a" only, cluster b's same-named Healthy device stays
silent (asserted after a's alert fired and the rules were evaluated since), and the per-state
fleet counts are per cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from gpuhealth.testing.loopback import (
    LoopbackHttpServer,
    Prometheus,
    ScrapeJob,
    run_prometheus,
    wait_until,
)
from rules.render import parse_config, render, scaled, write_files

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

EXPORTER_JOB = "gpuhealth-exporter"

# The sped-up rules: 1m of the shipped thresholds is 2s here (evaluation every 2s).
SPEED = 30


def exposition(unhealthy: bool) -> bytes:
    """What an exporter of one node with one GPU serves: the same names in every cluster."""
    status = {"Healthy": 0 if unhealthy else 1, "Unhealthy": 1 if unhealthy else 0, "Unknown": 0}
    device = 'node="n1",device="GPU-1"'
    lines = [
        "# TYPE gpu_device_info gauge",
        f'gpu_device_info{{{device},uuid="GPU-1",resource="nvidia.com/gpu"}} 1',
        "# TYPE gpu_device_health gauge",
        *(f'gpu_device_health{{{device},status="{s}"}} {v}' for s, v in status.items()),
        "# TYPE gpu_device_status_age_seconds gauge",
        f"gpu_device_status_age_seconds{{{device}}} 1",
    ]
    return ("\n".join(lines) + "\n").encode()


class Exporters(BaseHTTPRequestHandler):
    """`/a/metrics` and `/b/metrics`: cluster a's device is Unhealthy, cluster b's Healthy."""

    def do_GET(self) -> None:
        cluster = self.path.split("/")[1]
        if cluster not in ("a", "b"):
            self.send_response(404)
            self.end_headers()
            return
        body = exposition(unhealthy=cluster == "a")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the scrapes are read through Prometheus."""


@pytest.fixture
def central(tmp_path: Path) -> Iterator[Prometheus]:
    rule_files = [
        p
        for p in write_files(render(scaled(parse_config({}), SPEED)), tmp_path / "rules")
        if p.parent.name == "prometheus"
    ]
    with ExitStack() as stack:
        exporters = stack.enter_context(LoopbackHttpServer(Exporters, "exporters"))
        target = urlsplit(exporters.url).netloc
        clusters = [
            stack.enter_context(
                run_prometheus(
                    tmp_path / cluster,
                    [ScrapeJob(EXPORTER_JOB, [target], metrics_path=f"/{cluster}/metrics")],
                    external_labels={"cluster": cluster},
                )
            )
            for cluster in ("a", "b")
        ]
        federate = ScrapeJob(
            "federate",
            [urlsplit(p.base_url).netloc for p in clusters],
            metrics_path="/federate",
            honor_labels=True,
            params={"match[]": [f'{{job="{EXPORTER_JOB}"}}']},
        )
        yield stack.enter_context(run_prometheus(tmp_path / "central", [federate], rule_files=rule_files))


def _firing(prometheus: Prometheus, alertname: str) -> list[dict[str, str]]:
    return [a["labels"] for a in prometheus.alerts(state=None) if a["labels"]["alertname"] == alertname]


def test_the_central_ruler_fires_for_the_failed_clusters_device_only(central: Prometheus) -> None:
    fired = wait_until(
        "GPUDeviceUnhealthy to fire on the central ruler",
        lambda: [a for a in central.alerts() if a["labels"]["alertname"] == "GPUDeviceUnhealthy"] or None,
        timeout=40,
    )
    assert [a["labels"]["cluster"] for a in fired] == ["a"]
    assert {k: fired[0]["labels"][k] for k in ("node", "device", "action")} == {
        "node": "n1",
        "device": "GPU-1",
        "action": "quarantine",
    }
    # The evidence that cluster b was judged: its device's series reached the central ruler
    # and every group has been evaluated since a's alert fired; still nothing for b.
    since = time.time()
    wait_until("every rule group to be evaluated again", lambda: central.evaluated_since(since), timeout=10)
    assert central.value('node_device:gpu_device_reported_unhealthy:bool{cluster="b"}') == 0
    assert [a["cluster"] for a in _firing(central, "GPUDeviceUnhealthy")] == ["a"]
    counts = {
        (s["metric"]["cluster"], s["metric"]["state"]): float(s["value"][1])
        for s in central.query("state:gpu_devices_effective:count")
    }
    assert counts == {
        ("a", "Unhealthy"): 1,
        ("a", "Unknown"): 0,
        ("a", "Healthy"): 0,
        ("b", "Unhealthy"): 0,
        ("b", "Unknown"): 0,
        ("b", "Healthy"): 1,
    }
