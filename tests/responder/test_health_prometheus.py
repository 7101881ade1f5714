"""Device health read from a real Prometheus evaluating the shipped device rules.

Aspects: `PrometheusHealth` over `rules/prometheus/gpu-device.yaml` sees every device the
exporter reports, Unhealthy, Unknown (reported Unknown, or a stale report) and Healthy as the
rules decide them, through one query per rule.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from gpuhealth.testing.loopback import ScrapeJob, run_prometheus, wait_until
from responder.reconcile.health import HealthSnapshot, HealthUnavailable, PrometheusHealth, cluster_selector
from responder.reconcile.policy import Health

pytestmark = pytest.mark.integration

RULES = Path(__file__).parents[2] / "rules" / "prometheus" / "gpu-device.yaml"
DEVICES = {
    "GPU-ok": ("Healthy", 1),
    "GPU-bad": ("Unhealthy", 1),
    "GPU-unk": ("Unknown", 1),
    "GPU-old": ("Healthy", 900),
}
"""device -> (the status reported, seconds since the report was confirmed)."""


def exposition() -> bytes:
    lines = []
    for device, (status, age) in DEVICES.items():
        for each in ("Healthy", "Unhealthy", "Unknown"):
            value = 1 if each == status else 0
            lines.append(f'gpu_device_health{{node="n1",device="{device}",status="{each}"}} {value}')
        lines.append(f'gpu_device_status_age_seconds{{node="n1",device="{device}"}} {age}')
    return ("\n".join(lines) + "\n").encode()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = exposition()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_health_as_the_rules_decide_it(tmp_path: Path, exporter: int) -> None:
    job = ScrapeJob("gpuhealth-exporter", [f"127.0.0.1:{exporter}"])
    # The shipped expressions, evaluated every second instead of every minute.
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
    fast = tmp_path / "gpu-device.yaml"
    fast.write_text(yaml.safe_dump(rules))
    with run_prometheus(tmp_path / "prometheus", [job], rule_files=[fast]) as prometheus:
        source = PrometheusHealth(prometheus.base_url)

        expected = {
            "GPU-ok": Health.HEALTHY,
            "GPU-bad": Health.UNHEALTHY,
            "GPU-unk": Health.UNKNOWN,
            "GPU-old": Health.UNKNOWN,  # a stale Healthy is no evidence
        }

        def decided() -> HealthSnapshot | None:
            # Both rules of one evaluation must be in: until then a device may read Unknown.
            try:
                snapshot = source.snapshot(0.0)
            except HealthUnavailable:
                return None  # not one evaluation yet
            states = {device: snapshot.of("n1", device).health for device in DEVICES}
            return snapshot if snapshot.eligible == len(DEVICES) and states == expected else None

        snapshot = wait_until("every device as the rules decide it", decided, timeout=60)
        assert snapshot.of("n1", "GPU-ok").healthy_since == 0.0
        # A responder of a named cluster reads a single-cluster Prometheus (no cluster label on
        # its own series) the same; a central one's other clusters it never sees.
        named = PrometheusHealth(prometheus.base_url, selector=cluster_selector("cluster", "eu-west.1"))
        assert {d: named.snapshot(1.0).of("n1", d).health for d in DEVICES} == expected
        other = PrometheusHealth(prometheus.base_url, selector='{cluster=~"none-such"}')
        with pytest.raises(HealthUnavailable):
            other.snapshot(1.0)
        assert snapshot.of("n2", "GPU-ok").health == Health.UNKNOWN  # no series: Unknown


@pytest.mark.parametrize(
    ("cluster", "selector"),
    [("", ""), ("a", '{cluster=~"a|"}'), ("eu-west.1", '{cluster=~"eu\\\\-west\\\\.1|"}')],
)
def test_a_named_cluster_selects_its_series_and_those_without_the_label(cluster: str, selector: str) -> None:
    assert cluster_selector("cluster", cluster) == selector
