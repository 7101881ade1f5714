"""The real control plane's parts that need no upstream binary.

Aspects: the CA's serving certificate passes a real TLS handshake for 127.0.0.1 and localhost,
with a client certificate the server verifies, whose subject carries the user (CN) and groups
(O) the apiserver reads; the service-account key pair is an EC key pair; each version's gates
and runtime-config (1.36: DRADeviceTaintRules and v1beta2; 1.37: nothing), the user's gates
on top; a scheduler config file gets our kubeconfig and no leader election, a wrong document is
refused by name; a component that exits before it is ready, or never gets ready, raises with
its log tail; a restart starts the same argv again as a new process, appends to the same log
with a line between the runs and awaits the same probe, and one never made ready is refused; a
missing build names the command that builds it; TLS kubeconfigs load into the
official client.
"""

from __future__ import annotations

import socket
import ssl
import sys
import threading
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
from cryptography.x509.oid import NameOID

from gpuhealth.kube.config import api_client
from simulator.apiserver.kubeconfig import ClientTLS, kubeconfig_dict, write_kubeconfig
from simulator.controlplane import binaries, probes
from simulator.controlplane.certificates import CertificateAuthority, service_account_keys
from simulator.controlplane.process import Component, ControlPlaneError
from simulator.controlplane.scheduler import merged_config
from simulator.controlplane.versions import ComponentVersion


def _handshake(ca: CertificateAuthority, host: str) -> str:
    """Serve TLS with the CA's serving pair, requiring a client certificate; connect to `host`
    as the admin; the common name the server saw."""
    serving = ca.serving("srv", "kube-apiserver")
    admin = ca.client("admin", "kubernetes-admin", ("system:masters",))
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(serving.cert, serving.key)
    server_ctx.load_verify_locations(ca.pair.cert)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    seen: list[str] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def accept() -> None:
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    subject = dict(item[0] for item in tls.getpeercert()["subject"])
                    seen.append(subject["commonName"])
            except ssl.SSLError:
                conn.close()  # the client refused our certificate: what the test asserts

        thread = threading.Thread(target=accept)
        thread.start()
        client_ctx = probes.tls_context(ca.pair.cert, admin)
        with (
            socket.create_connection(listener.getsockname(), timeout=5) as raw,
            client_ctx.wrap_socket(raw, server_hostname=host),
        ):
            pass
        thread.join(5)
    return seen[0]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_the_serving_certificate_and_a_client_certificate_pass_a_tls_handshake(
    tmp_path: Path, host: str
) -> None:
    assert _handshake(CertificateAuthority(tmp_path), host) == "kubernetes-admin"


def test_a_serving_certificate_is_refused_for_another_name(tmp_path: Path) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(CertificateAuthority(tmp_path), "example.com")


def test_a_client_certificate_names_the_user_and_its_groups(tmp_path: Path) -> None:
    pair = CertificateAuthority(tmp_path).client("kcm", "system:kube-controller-manager", ("a", "b"))
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == [
        "system:kube-controller-manager"
    ]
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["a", "b"]
    assert oct(pair.key.stat().st_mode & 0o777) == "0o600"


def test_the_service_account_keys_are_a_matching_ec_pair(tmp_path: Path) -> None:
    keys = service_account_keys(tmp_path)
    private = load_pem_private_key(keys.private.read_bytes(), None)
    public = load_pem_public_key(keys.public.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and isinstance(public, ec.EllipticCurvePublicKey)
    assert private.public_key().public_numbers() == public.public_numbers()


def test_each_version_turns_on_what_gpuhealths_dra_path_needs() -> None:
    v136 = ComponentVersion("1.36")
    assert v136.gate_flags() == ["--feature-gates=DRADeviceTaintRules=true"]
    assert v136.runtime_config() == ("resource.k8s.io/v1beta2=true",)
    assert v136.taint_rule_version == "v1beta2"
    v137 = ComponentVersion("1.37")
    assert (v137.gate_flags(), v137.runtime_config(), v137.taint_rule_version) == ([], (), "v1")


def test_the_users_gates_come_on_top_and_win() -> None:
    version = ComponentVersion("1.36", {"DRADeviceTaintRules": False, "Other": True})
    assert version.gate_flags() == ["--feature-gates=DRADeviceTaintRules=false,Other=true"]


def test_an_unsupported_version_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unsupported Kubernetes version '1.35'.*1.36, 1.37"):
        ComponentVersion("1.35")


def test_a_scheduler_config_gets_our_kubeconfig_and_no_leader_election(tmp_path: Path) -> None:
    text = yaml.safe_dump(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "extenders": [{"urlPrefix": "http://127.0.0.1:1/x", "filterVerb": "filter"}],
            "leaderElection": {"leaderElect": True, "resourceName": "kept"},
        }
    )
    merged = merged_config(text, "f.yaml", tmp_path / "kc")
    assert merged["clientConnection"] == {"kubeconfig": str(tmp_path / "kc")}
    assert merged["leaderElection"] == {"leaderElect": False, "resourceName": "kept"}
    assert merged["extenders"] == [{"urlPrefix": "http://127.0.0.1:1/x", "filterVerb": "filter"}]


@pytest.mark.parametrize(
    "text,error",
    [
        ("a: [", "f.yaml: not YAML"),
        ("kind: Pod", "f.yaml: expected a KubeSchedulerConfiguration"),
        (
            "kind: KubeSchedulerConfiguration\napiVersion: v1",
            "apiVersion must be kubescheduler.config.k8s.io/v1",
        ),
    ],
)
def test_a_wrong_scheduler_config_is_refused_by_name(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ControlPlaneError, match=error):
        merged_config(text, "f.yaml", tmp_path / "kc")


def test_a_component_that_exits_before_it_is_ready_raises_with_its_log_tail(tmp_path: Path) -> None:
    script = "import sys; print('flag provided but not defined: -x', flush=True); sys.exit(3)"
    component = Component("etcd", [sys.executable, "-c", script], tmp_path / "etcd.log")
    with pytest.raises(ControlPlaneError) as caught:
        component.wait_ready(lambda: False, timeout=30)
    message = str(caught.value)
    assert message.startswith("etcd: exited with status 3 before it was ready")
    assert "flag provided but not defined: -x" in message


def test_a_component_never_ready_raises_at_its_deadline_and_stops(tmp_path: Path) -> None:
    component = Component(
        "kube-scheduler", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "s.log"
    )
    try:

        def refused() -> bool:
            raise OSError("connection refused")

        with pytest.raises(
            ControlPlaneError, match=r"not ready after 0 s \(last probe error: connection refused\)"
        ):
            component.wait_ready(refused, timeout=0.0)
    finally:
        component.stop()
    assert component.proc.returncode is not None and not component.running()


def test_a_restart_runs_the_same_argv_again_and_awaits_the_same_probe(tmp_path: Path) -> None:
    script = "import sys, time; print('serving', sys.argv[1], flush=True); time.sleep(60)"
    argv = [sys.executable, "-c", script, "port-6443"]
    component = Component("kube-apiserver", argv, tmp_path / "apiserver.log")
    probed: list[int] = []

    def ready() -> bool:
        probed.append(component.pid)
        return "serving" in (tmp_path / "apiserver.log").read_text().split("---")[-1]

    try:
        never_ready = Component("etcd", argv, tmp_path / "etcd.log")
        with pytest.raises(ControlPlaneError, match="etcd: never made ready"):
            never_ready.restart(timeout=5)
        never_ready.stop()
        component.wait_ready(ready, timeout=30)
        first = component.pid
        took = component.restart(timeout=30, grace=5)
        assert component.pid != first and component.running() and took >= 0
        assert component.proc.args == argv
        assert probed[-1] == component.pid  # the same probe, against the new process
        log = (tmp_path / "apiserver.log").read_text()
        assert log.count("serving port-6443") == 2
        assert "--- gpuhealth: kube-apiserver started again (start 2) ---" in log
    finally:
        component.stop()
    assert not component.running()


def test_a_missing_build_names_the_command_that_builds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUHEALTH_UPSTREAM_CACHE", str(tmp_path))
    with pytest.raises(
        ControlPlaneError,
        match=r"kube-apiserver v1\.36\.\d+ is not built: run `python3 tools/upstream/build.py "
        r"kubernetes-1\.36`",
    ):
        binaries.binary("kube-apiserver", "1.36")


def test_a_tls_kubeconfig_names_the_ca_and_the_client_pair_and_loads(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    pair = ca.client("admin", "kubernetes-admin")
    tls = ClientTLS(ca.pair.cert, pair.cert, pair.key)
    doc = kubeconfig_dict("https://127.0.0.1:6443", tls=tls, context="c")
    assert doc["clusters"][0]["cluster"] == {
        "server": "https://127.0.0.1:6443",
        "certificate-authority": str(ca.pair.cert),
    }
    assert doc["users"][0]["user"] == {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
    path = tmp_path / "kubeconfig"
    write_kubeconfig(path, "https://127.0.0.1:6443", token="t", tls=ClientTLS(ca.pair.cert))
    configuration = api_client(str(path)).configuration
    assert configuration.host == "https://127.0.0.1:6443"
    assert configuration.ssl_ca_cert == str(ca.pair.cert)
    assert configuration.api_key == {"BearerToken": "Bearer t"}
