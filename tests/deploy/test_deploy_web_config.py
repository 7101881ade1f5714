"""The web-config component (deploy/components/web-config): every exporter and responder pod gets
the web configuration Secret, the flag and HTTPS probes; the ServiceMonitors scrape over HTTPS
with basic auth; the no-operator fields name both shipped jobs. That a real Prometheus scrapes a
real exporter with those fields is tests/exporter/test_integration_web_config.py."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import DEPLOY, kustomize

COMPONENT = DEPLOY / "components" / "web-config"
FLAG = "--web.config.file=/etc/gpuhealth/web/web.yml"


def built(*components: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(dir=DEPLOY / "overlays") as folder:
        listed = "".join(f"  - ../../components/{c}\n" for c in (*components, "web-config"))
        (Path(folder) / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources:\n  - ../../base\ncomponents:\n{listed}"
        )
        return kustomize(Path(folder))


def gpuhealth_workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o
        for o in objects
        if o["kind"] in ("DaemonSet", "Deployment")
        and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") in ("exporter", "responder")
    ]


@pytest.mark.parametrize(
    "components", [("prometheus-operator",), ("prometheus-operator", "cluster-exporter"), ("no-operator",)]
)
def test_every_exporter_and_responder_pod_serves_the_web_configuration(components: tuple[str, ...]) -> None:
    objects = built(*components)
    workloads = gpuhealth_workloads(objects)
    kinds = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in workloads}
    assert kinds == {"exporter", "responder"}
    for workload in workloads:
        spec = workload["spec"]["template"]["spec"]
        container = spec["containers"][0]
        name = workload["metadata"]["name"]
        assert FLAG in container["args"], name
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["web-config"]["mountPath"] == "/etc/gpuhealth/web" and mounts["web-config"]["readOnly"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["web-config"]["secret"]["secretName"] == "gpuhealth-web-config"
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"]["scheme"] == "HTTPS", (name, probe)
            assert container[probe]["httpGet"]["path"] in ("/healthz", "/readyz")  # open without a password
    monitors = [
        o for o in objects if o["kind"] == "ServiceMonitor" and o["metadata"]["name"].startswith("gpuhealth")
    ]
    assert len(monitors) == (2 if "prometheus-operator" in components else 0)
    for monitor in monitors:
        endpoint = monitor["spec"]["endpoints"][0]
        service = monitor["metadata"]["name"]
        assert endpoint["scheme"] == "https"
        assert endpoint["tlsConfig"]["serverName"] == f"{service}.gpuhealth-system.svc"
        assert endpoint["basicAuth"]["password"] == {
            "name": "gpuhealth-scrape-credentials",
            "key": "password",
        }


def test_the_no_operator_fields_cover_both_shipped_jobs() -> None:
    jobs = yaml.safe_load((DEPLOY / "components" / "no-operator" / "prometheus-scrape.yaml").read_text())
    fields = yaml.safe_load((COMPONENT / "prometheus-scrape-tls.yaml").read_text())
    assert set(fields) == {job["job_name"] for job in jobs["scrape_configs"]}
    for name, extra in fields.items():
        assert extra["scheme"] == "https"
        assert extra["tls_config"]["server_name"] == f"{name}.gpuhealth-system.svc"
        assert set(extra["basic_auth"]) == {"username", "password_file"}
