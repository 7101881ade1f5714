"""The operator's commands on the real control plane: `gpuhealth quarantine|breaker` and `kubectl gpuhealth`.

Aspects: with the CRD and the enforcing overlay installed on 1.37, a record as the responder
writes it is listed and shown by `gpuhealth quarantine list|show` and by `kubectl gpuhealth
quarantine list` (kubectl 1.37 finding the plugin on its PATH), and `gpuhealth breaker status`
reads the breaker, each run as an on-call identity bound to the shipped `gpuhealth-viewer`
ClusterRole (a ServiceAccount's TokenRequest token) under the real RBAC authorizer; the same
identity's write (`quarantine extend`) is refused with the apiserver's 403, named by the command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.resources import Resource
from responder.records import QUARANTINES, Quarantine
from simulator.controlplane import ControlPlane
from tests.controlplane.conftest import require_builds
from tests.deploy.manifests import KUBECTL
from tests.support.controlplane import (
    SERVICE_ACCOUNT,
    admin,
    dra_record,
    namespace_ready,
    service_account_token,
)

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", namespaced=False)
ONCALL_NAMESPACE = "commands-oncall"
ONCALL = "pager"
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def viewer(installed: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig for an on-call identity bound to gpuhealth-viewer, and nothing else."""
    require_builds("1.37")
    client = admin(installed)
    try:
        namespace_ready(client, ONCALL_NAMESPACE)
        client.create(
            SERVICE_ACCOUNT,
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ONCALL}},
            namespace=ONCALL_NAMESPACE,
        )
        client.create(
            BINDINGS,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "gpuhealth-viewers-commands"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "gpuhealth-viewer",
                },
                "subjects": [{"kind": "ServiceAccount", "name": ONCALL, "namespace": ONCALL_NAMESPACE}],
            },
        )
        token = service_account_token(client, ONCALL_NAMESPACE, ONCALL)
    finally:
        client.close()
    path = tmp_path_factory.mktemp("oncall") / "kubeconfig"
    return installed.kubeconfig_for_token(path, token)


@pytest.fixture(scope="module")
def record(installed: ControlPlane) -> Quarantine:
    client: KubeClient = admin(installed)
    try:
        return dra_record(client, "cmd-node-0", "gpu.nvidia.com", "gpu-5")
    finally:
        client.close()


def run(*argv: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(kubeconfig),
    }
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, env=env, check=False)


def test_the_on_call_role_lists_and_shows_a_record_with_gpuhealth_quarantine(
    viewer: Path, record: Quarantine
) -> None:
    listed = run(
        str(VENV_BIN / "gpuhealth"),
        "quarantine",
        "list",
        "--kubeconfig",
        str(viewer),
        "-o",
        "wide",
        kubeconfig=viewer,
    )
    assert listed.returncode == 0, listed.stderr
    (line,) = [row for row in listed.stdout.splitlines() if record.name in row]
    assert "cmd-node-0" in line and "gpu.nvidia.com/cmd-node-0/gpu-5" in line
    shown = run(
        str(VENV_BIN / "gpuhealth"),
        "quarantine",
        "show",
        record.name,
        "--kubeconfig",
        str(viewer),
        "-o",
        "json",
        kubeconfig=viewer,
    )
    assert shown.returncode == 0, shown.stderr
    assert record.name in shown.stdout and '"reason"' in shown.stdout


def test_kubectl_finds_the_plugin_and_lists_the_record_as_the_on_call_role(
    viewer: Path, record: Quarantine
) -> None:
    listed = run(str(KUBECTL), "gpuhealth", "quarantine", "list", kubeconfig=viewer)
    assert listed.returncode == 0, listed.stderr
    rows = [row.split() for row in listed.stdout.splitlines()]
    assert any("cmd-node-0" in row and "gpu-5" in " ".join(row) for row in rows), listed.stdout


def test_the_on_call_role_reads_the_breaker(viewer: Path, installed: ControlPlane) -> None:
    status = run(
        str(VENV_BIN / "gpuhealth"), "breaker", "status", "--kubeconfig", str(viewer), kubeconfig=viewer
    )
    # No responder has written the breaker here: the install's empty ConfigMap reads closed.
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("closed"), status.stdout
    assert "forbidden" not in (status.stdout + status.stderr).lower()


def test_a_write_outside_the_on_call_role_is_refused_by_the_real_authorizer(
    viewer: Path, record: Quarantine, installed: ControlPlane
) -> None:
    extend = run(
        str(VENV_BIN / "gpuhealth"), "quarantine", "extend", record.name, "--by", "1h",
        "--actor", "pager", "--reason", "test", "--kubeconfig", str(viewer),
        kubeconfig=viewer,
    )  # fmt: skip
    assert extend.returncode != 0
    assert "forbidden" in extend.stderr.lower(), extend.stderr
    client = admin(installed)
    try:
        stored = client.get(QUARANTINES, record.name)
    finally:
        client.close()
    assert stored["spec"]["expiresAt"] == record.spec.expires_at  # nothing written
