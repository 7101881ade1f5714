"""kube-apiserver for the control plane: TLS on a loopback port, etcd behind it.

- Serving certificate for 127.0.0.1/localhost from the control plane's CA; client
  certificates signed by the same CA authenticate (`--client-ca-file`).
- Service accounts: tokens signed with the private key, verified with the public one, issued
  by `ISSUER` (the audience defaults to it); the TokenRequest API works.
- `--authorization-mode=Node,RBAC`: what a real cluster runs; nothing is always-allowed.
- An audit log (JSON lines) with a policy recording every request at Metadata level: user,
  verb, objectRef, responseStatus.code. The tests read it to show which calls were refused.
  Writes of `pods/status` are recorded at Request level, with their body (`requestObject`): a
  test shows from it which fields of a pod's status each identity wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuhealth.loopback_ports import free_port
from simulator.controlplane import probes
from simulator.controlplane.certificates import KeyPair, ServiceAccountKeys
from simulator.controlplane.process import Component
from simulator.controlplane.versions import ComponentVersion

ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],  # ResponseComplete carries the status code
    "rules": [
        {
            "level": "Request",
            "verbs": ["update", "patch"],
            "resources": [{"group": "", "resources": ["pods/status"]}],
        },
        {"level": "Metadata"},
    ],
}


@dataclass(frozen=True)
class ApiserverFiles:
    serving: KeyPair
    ca: Path
    service_account: ServiceAccountKeys


def argv(
    binary: Path,
    workdir: Path,
    *,
    port: int,
    etcd_url: str,
    files: ApiserverFiles,
    version: ComponentVersion,
) -> list[str]:
    policy = workdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
    args = [
        str(binary),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        # The `kubernetes` Service's endpoints may not be a loopback address; nothing reaches
        # the apiserver through that Service here (no pods run), so nothing maintains them.
        "--endpoint-reconciler-type=none",
        f"--secure-port={port}",
        f"--tls-cert-file={files.serving.cert}",
        f"--tls-private-key-file={files.serving.key}",
        f"--client-ca-file={files.ca}",
        f"--service-account-issuer={ISSUER}",
        f"--service-account-key-file={files.service_account.public}",
        f"--service-account-signing-key-file={files.service_account.private}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--authorization-mode=Node,RBAC",
        f"--audit-policy-file={policy}",
        f"--audit-log-path={workdir / 'audit.log'}",
        "--audit-log-format=json",
        "--audit-log-mode=blocking",  # each event is on disk before the response is sent
        "--allow-privileged=true",  # the exporter's privileged overlay must be admissible
        "--profiling=false",
        *version.gate_flags(),
    ]
    runtime = version.runtime_config()
    if runtime:
        args.append("--runtime-config=" + ",".join(runtime))
    return args


def start(
    binary: Path,
    workdir: Path,
    *,
    etcd_url: str,
    files: ApiserverFiles,
    admin: KeyPair,
    version: ComponentVersion,
    timeout: float,
) -> tuple[Component, str, float]:
    """Start kube-apiserver and wait for `/readyz` (all post-start hooks, RBAC bootstrap
    included); the component, its URL and the seconds it took."""
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    component = Component(
        "kube-apiserver",
        argv(binary, workdir, port=port, etcd_url=etcd_url, files=files, version=version),
        workdir / "kube-apiserver.log",
    )
    context = probes.tls_context(files.ca, admin)
    took = component.wait_ready(lambda: probes.ok(f"{url}/readyz", context), timeout=timeout)
    return component, url, took
