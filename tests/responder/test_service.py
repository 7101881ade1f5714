"""`gpuhealth responder` as a user runs it, against the simulated cluster.

Aspects: it serves HTTPS (`--tls-cert-file`, `--tls-key-file`) on the address asked and says
so; /healthz at once, /readyz once the API answered; a webhook delivery is recorded as a
DeviceQuarantine; the replica takes the leader Lease (its metric says so) while Prometheus is
unreachable (the reconciler skips its passes, the webhook goes on); SIGTERM stops it with exit
0 and releases the Lease; a missing or empty token file is a usage error (exit 2). The
reconciler's own flows are in test_reconciler*; TLS rotation in test_service_tls.
"""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.resources import LEASE, NAMESPACE, Resource
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import free_port, wait_until
from responder.records import QUARANTINES, from_object, record_name
from simulator.testing import running_cluster
from tests.support.certificates import self_signed

pytestmark = pytest.mark.integration

CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
SCENARIO = {"name": "one", "fleet": [{"name": "dra", "count": 1, "gpusPerNode": 2, "path": "dra"}]}
TOKEN = "service-test-token"


def delivery(device: str) -> bytes:
    alert = {
        "status": "firing",
        "labels": {
            "alertname": "GPUDeviceUnhealthy",
            "action": "quarantine",
            "node": "dra-0",
            "device": device,
            "driver": "gpu.nvidia.com",
            "pool": "dra-0",
            "device_name": "gpu-1",
        },
        "annotations": {},
        "startsAt": "2026-11-30T10:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": "feed",
    }
    return json.dumps({"version": "4", "status": "firing", "receiver": "r", "alerts": [alert]}).encode()


def https_ok(url: str, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def post(url: str, body: bytes, context: ssl.SSLContext) -> int:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return int(response.status)


def installed(kubeconfig: Path) -> KubeClient:
    """A client of the cluster, with the CRD and gpuhealth's namespace created as an install does."""
    kube = KubeClient(KubeTransport(api_client(str(kubeconfig))))
    kube.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
    kube.create(
        NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuhealth-system"}}
    )
    return kube


def test_the_responder_serves_records_and_leads(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    cert, key = self_signed(tmp_path, "responder")
    tls = ssl.create_default_context(cafile=str(cert))
    with running_cluster(SCENARIO, speed=10) as cluster:
        kube = installed(cluster.kubeconfig_path)
        port = free_port()
        argv = [
            sys.executable, "-m", "gpuhealth", "responder",
            "--kubeconfig", str(cluster.kubeconfig_path),
            "--listen", f"127.0.0.1:{port}",
            "--token-file", str(token_file),
            "--prometheus-url", "http://127.0.0.1:9",  # nothing there: passes are skipped, webhooks go on
            "--identity", "replica-a",
            "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        ]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        base = f"https://127.0.0.1:{port}"
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith(
                f"gpuhealth responder: serving on 127.0.0.1:{port} as replica-a over HTTPS"
            )
            assert https_ok(f"{base}/healthz", tls)
            wait_until("readyz", lambda: https_ok(f"{base}/readyz", tls), timeout=30)
            device = "gpu.nvidia.com/dra-0/gpu-1"
            assert post(f"{base}/webhook", delivery(device), tls) == 200
            record = from_object(kube.get(QUARANTINES, record_name("dra-0", device)))
            assert record.spec.device == device

            def lease() -> dict[str, Any]:
                return kube.get(LEASE, "gpuhealth-responder", namespace="gpuhealth-system")

            wait_until(
                "the leader Lease", lambda: lease()["spec"].get("holderIdentity") == "replica-a", timeout=30
            )

            def scraped() -> str | None:
                with urllib.request.urlopen(f"{base}/metrics", timeout=5, context=tls) as response:
                    text = response.read().decode()
                return text if "gpuhealth_responder_leader 1.0" in text else None

            text = wait_until("the leader metric", scraped, timeout=30)
            assert 'gpuhealth_responder_webhook_requests_total{outcome="accepted"} 1.0' in text
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
        assert code == 0, proc.stderr.read() if proc.stderr else ""
        assert not lease()["spec"].get("holderIdentity")  # released on shutdown
        kube.close()


def test_a_missing_or_empty_token_file_is_a_usage_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for token_file in (tmp_path / "missing", empty):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpuhealth",
                "responder",
                "--token-file",
                str(token_file),
                "--prometheus-url",
                "http://p",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert done.stderr.startswith("gpuhealth responder: error: --token-file")


def test_every_endpoint_asks_its_caller_who_it_is_under_a_web_configuration(tmp_path: Path) -> None:
    """`--web.config.file` with verified client certificates (`VerifyClientCertIfGiven`, one
    allowed SAN) and a password: the probes answer anyone; the extender (kube-scheduler can show
    only a certificate) and the webhook (its bearer token) want the certificate; /metrics wants
    the certificate and the password. Each refusal is counted by reason."""
    import base64

    import bcrypt

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    cert, key = self_signed(tmp_path, "responder")
    client_cert, client_key = self_signed(tmp_path, "scheduler", dns=("kube-scheduler",))
    hashed = bcrypt.hashpw(b"scrape", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
        f"  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {client_cert}\n"
        "  client_allowed_sans: [kube-scheduler]\n"
        f"basic_auth_users:\n  prometheus: {hashed}\n"
    )
    anonymous = ssl.create_default_context(cafile=str(cert))
    known = ssl.create_default_context(cafile=str(cert))
    known.load_cert_chain(str(client_cert), str(client_key))
    password = {"Authorization": "Basic " + base64.b64encode(b"prometheus:scrape").decode()}

    def status(url: str, context: ssl.SSLContext, *, body: bytes | None = None, **headers: str) -> int:
        request = urllib.request.Request(url, data=body, method="POST" if body else "GET", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    with running_cluster(SCENARIO, speed=10) as cluster:
        kube = installed(cluster.kubeconfig_path)
        port = free_port()
        argv = [
            sys.executable, "-m", "gpuhealth", "responder",
            "--kubeconfig", str(cluster.kubeconfig_path), "--listen", f"127.0.0.1:{port}",
            "--token-file", str(token_file), "--prometheus-url", "http://127.0.0.1:9",
            "--identity", "replica-a", "--web.config.file", str(web),
        ]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        base = f"https://127.0.0.1:{port}"
        try:
            assert proc.stdout is not None
            assert "over HTTPS" in proc.stdout.readline()
            wait_until("readyz", lambda: https_ok(f"{base}/readyz", anonymous), timeout=30)
            args = json.dumps(
                {"Pod": {"metadata": {"name": "p"}, "spec": {}}, "NodeNames": ["dra-0"]}
            ).encode()
            json_type = {"Content-Type": "application/json"}
            assert status(f"{base}/scheduler/filter", anonymous, body=args, **json_type) == 403
            assert status(f"{base}/scheduler/filter", known, body=args, **json_type) == 200
            bearer = {"Authorization": f"Bearer {TOKEN}", **json_type}
            device = "gpu.nvidia.com/dra-0/gpu-1"
            assert status(f"{base}/webhook", anonymous, body=delivery(device), **bearer) == 403
            assert status(f"{base}/webhook", known, body=delivery(device), **bearer) == 200
            assert status(f"{base}/metrics", known) == 401
            assert status(f"{base}/metrics", anonymous, **password) == 403
            assert status(f"{base}/metrics", known, **password) == 200
            with urllib.request.urlopen(
                urllib.request.Request(f"{base}/metrics", headers=password), timeout=10, context=known
            ) as response:
                text = response.read().decode()
            assert 'gpuhealth_http_requests_refused_total{reason="client_certificate"} 3.0' in text
            assert 'gpuhealth_http_requests_refused_total{reason="unauthorized"} 1.0' in text
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            kube.close()
