"""A real Prometheus scrapes a real exporter behind `--web.config.file` (TLS, basic auth) with the
fields the web-config component ships for the no-operator scrape job, the certificate checked
against the Service name it names; a job with a wrong password gets nothing and the refusal is
counted (docs/web-config.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from gpuhealth.testing.loopback import ScrapeJob, run_prometheus, wait_until
from tests.support.certificates import self_signed
from tests.support.exporters import cluster_exporter

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ROOT / "deploy" / "components" / "web-config" / "prometheus-scrape-tls.yaml"
SCENARIO: dict[str, Any] = {
    "name": "exporter-web-config",
    "description": "1 DRA node with 2 GPUs, a Job holds 1",
    "fleet": [{"name": "gpu-dra", "count": 1, "gpusPerNode": 2, "path": "dra"}],
    "workloads": [
        {
            "name": "train",
            "namespace": "research",
            "kind": "Job",
            "replicas": 1,
            "gpusPerPod": 1,
            "path": "dra",
        }
    ],
    "timeline": [],
}
NODE = "gpu-dra-0"
JOB = "gpuhealth-exporter"


def scrape_fields(cert: Path, password_file: Path) -> dict[str, Any]:
    """The shipped fields of the exporter's job, with this test's files where a pod mounts them."""
    fields: dict[str, Any] = yaml.safe_load(FIELDS.read_text())[JOB]
    fields["tls_config"] = {**fields["tls_config"], "ca_file": str(cert)}
    fields["basic_auth"] = {**fields["basic_auth"], "password_file": str(password_file)}
    return fields


def test_prometheus_scrapes_over_https_with_the_shipped_fields_and_a_wrong_password_gets_nothing(
    tmp_path: Path,
) -> None:
    shipped = yaml.safe_load(FIELDS.read_text())[JOB]
    cert, key = self_signed(tmp_path, "tls", dns=(shipped["tls_config"]["server_name"],))
    username = shipped["basic_auth"]["username"]
    hashed = bcrypt.hashpw(b"scrape-me", bcrypt.gensalt(rounds=6)).decode()
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
        f"basic_auth_users:\n  {username}: {hashed}\n"
    )
    right, wrong = tmp_path / "password", tmp_path / "wrong-password"
    right.write_text("scrape-me\n")
    wrong.write_text("guessed\n")
    with cluster_exporter(SCENARIO, NODE, 2, tmp_path, args=("--web.config.file", str(web))) as (
        _,
        port,
        uuids,
    ):
        target = [f"127.0.0.1:{port}"]
        jobs = [
            ScrapeJob(JOB, target, honor_labels=True, fields=scrape_fields(cert, right)),
            ScrapeJob("wrong-password", target, fields=scrape_fields(cert, wrong)),
        ]
        with run_prometheus(tmp_path / "prometheus", jobs) as prometheus:

            def scraped() -> bool:
                up = {r["metric"]["job"]: r["value"][1] for r in prometheus.query("up")}
                devices = prometheus.query(f'count(gpu_device_health{{job="{JOB}"}} == 1)')
                return (
                    up == {JOB: "1", "wrong-password": "0"}
                    and bool(devices)
                    and devices[0]["value"][1] == "2"
                )

            wait_until(
                "the exporter's devices scraped over HTTPS, the wrong password refused", scraped, timeout=60
            )

            refusals = f'gpuhealth_exporter_http_requests_refused_total{{job="{JOB}", reason="unauthorized"}}'

            def refused() -> list[dict[str, Any]]:
                return prometheus.query(f"{refusals} > 0")

            wait_until("the refusals counted on the exporter's own metrics", refused, timeout=30)
            devices = {r["metric"]["device"] for r in prometheus.query(f'gpu_device_info{{job="{JOB}"}}')}
            assert devices == set(uuids)
