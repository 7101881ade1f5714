"""The Helm chart on the real control plane (1.37): install, upgrade and uninstall, as docs/operations.md
("Install with Helm") says, in seconds on the session's running apiserver.

Aspects:
- `helm template` of the chart applies with `kubectl apply --server-side --dry-run=server
  --validate=strict` (unknown or misplaced fields are errors) with only the PodSecurity warnings the
  namespace is labelled for;
- the documented order-independent steps: the namespace and the token Secret by `kubectl create
  ... --dry-run=client -o yaml | kubectl apply -f -`, before or after the install, as often as
  wanted;
- `helm install` creates every object of the release (the CRD from `crds/` when it is missing);
  `helm upgrade` changes the responder's mode and configuration (a new ConfigMap, the old one
  gone); `helm uninstall` removes every object it made and leaves the CRD (Helm never deletes
  `crds/`), the token Secret and the namespace (the records live there).
- docs/operations.md's namespace-and-token step runs as written, twice;
- `kubectl get devicequarantines` shows a live record's expiry, not `<invalid>`;
- on 1.36 (the chart's oldest kubeVersion) the chart passes the same server-side dry run.

The session's plane may hold the kustomize install already (the `installed` fixture): the chart
makes the same objects, so the release takes them over (`--take-ownership --force-conflicts`, the
documented move from kustomize to Helm), and the kustomize install is applied again afterwards.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.testing import upstream
from responder.records import to_object
from simulator.controlplane import ControlPlane
from tests.deploy.manifests import CRD_FILE, KUBECTL, NAMESPACE, ROOT, load_all
from tests.support.controlplane import apply, dra_quarantine, install, kubectl, operator_crds

pytestmark = [pytest.mark.integration, pytest.mark.controlplane]

CHART = ROOT / "charts" / "gpuhealth"
RELEASE = "gpuhealth"


def _helm(plane: ControlPlane, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = upstream.binary("helm")
    env = dict(
        os.environ,
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_DATA_HOME=str(home / "data"),
    )
    return subprocess.run(
        [binary, f"--kubeconfig={plane.kubeconfig_path}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def _piped(plane: ControlPlane, *create: str) -> None:
    """`kubectl create ... --dry-run=client -o yaml | kubectl apply -f -`: the documented form."""
    made = kubectl(plane, "create", *create, "--dry-run=client", "-o", "yaml")
    assert made.returncode == 0, made.stderr
    done = kubectl(plane, "apply", "-f", "-", stdin=made.stdout)
    assert done.returncode == 0, done.stderr


def _present(plane: ControlPlane, objects: list[dict[str, Any]]) -> set[str]:
    """kind/name of those of `objects` the apiserver holds."""
    done = kubectl(
        plane, "get", "-f", "-", "-o", "json", "--ignore-not-found", stdin=yaml.safe_dump_all(objects)
    )
    assert done.returncode == 0, done.stderr
    if not done.stdout.strip():
        return set()
    items = json.loads(done.stdout).get("items") or []
    return {f"{o['kind']}/{o['metadata']['name']}" for o in items}


def _key(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def test_install_upgrade_uninstall_on_the_real_apiserver(plane: ControlPlane, tmp_path: Path) -> None:
    kustomized = bool(_present(plane, [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {
        "name": "gpuhealth-responder", "namespace": NAMESPACE}}]))  # fmt: skip
    done = apply(plane, operator_crds())  # the Prometheus Operator's kinds, as a cluster with it has
    assert done.returncode == 0, done.stderr

    # Order-independent first steps: the namespace and the token, before anything else.
    _piped(plane, "namespace", NAMESPACE)
    token = ["secret", "generic", "gpuhealth-responder-token", "-n", NAMESPACE, "--from-literal=token=t0"]
    _piped(plane, *token)

    rendered = _helm(plane, tmp_path, "template", RELEASE, str(CHART), "-n", NAMESPACE, "--include-crds")
    assert rendered.returncode == 0, rendered.stderr
    objects = load_all(rendered.stdout)
    dry = kubectl(
        plane,
        "apply",
        "--server-side",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        "-",
        stdin=rendered.stdout,
    )
    assert dry.returncode == 0, dry.stderr
    warnings = [line for line in dry.stderr.splitlines() if line.startswith("Warning:")]
    assert all('violate PodSecurity "restricted:latest"' in w for w in warnings), dry.stderr

    adopt = ["--take-ownership", "--force-conflicts"] if kustomized else []
    installed = _helm(
        plane,
        tmp_path,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--set",
        "responder.mode=enforcing",
        *adopt,
    )
    assert installed.returncode == 0, installed.stderr
    manifest = _helm(plane, tmp_path, "get", "manifest", RELEASE, "-n", NAMESPACE)
    assert manifest.returncode == 0, manifest.stderr
    released = load_all(manifest.stdout)
    assert {_key(o) for o in released} == {
        _key(o) for o in objects if o["kind"] != "CustomResourceDefinition"
    }
    assert _present(plane, released) == {_key(o) for o in released}
    assert _present(plane, [o for o in objects if o["kind"] == "CustomResourceDefinition"])
    _piped(plane, *token)  # again, after the install: still fine

    def responder() -> dict[str, Any]:
        got = kubectl(plane, "get", "deployment", "gpuhealth-responder", "-n", NAMESPACE, "-o", "json")
        assert got.returncode == 0, got.stderr
        deployment: dict[str, Any] = json.loads(got.stdout)
        return deployment

    assert "--dry-run" not in responder()["spec"]["template"]["spec"]["containers"][0]["args"]
    [before] = [
        o["metadata"]["name"]
        for o in released
        if o["metadata"]["name"].startswith("gpuhealth-responder-config-")
    ]
    upgraded = _helm(
        plane, tmp_path, "upgrade", RELEASE, str(CHART), "-n", NAMESPACE,
        "--set", "responder.mode=dry-run", "--set", "responder.config.breaker.rate_floor=9",
        *(["--force-conflicts"] if kustomized else []),  # kubectl still co-owns what it applied
    )  # fmt: skip
    assert upgraded.returncode == 0, upgraded.stderr
    pod = responder()["spec"]["template"]["spec"]
    assert "--dry-run" in pod["containers"][0]["args"]
    [config] = [v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v]
    assert config != before
    maps = kubectl(plane, "get", "configmaps", "-n", NAMESPACE, "-o", "name")
    assert f"configmap/{config}" in maps.stdout and f"configmap/{before}" not in maps.stdout

    removed = _helm(plane, tmp_path, "uninstall", RELEASE, "-n", NAMESPACE)
    assert removed.returncode == 0, removed.stderr
    assert not _present(plane, released)
    kept = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "gpuhealth-responder-token", "namespace": NAMESPACE},
        },
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        *[o for o in objects if o["kind"] == "CustomResourceDefinition"],
    ]
    assert _present(plane, kept) == {_key(o) for o in kept}
    if kustomized:
        install(plane)  # what the session's other tests were given
    # Neither the chart nor the manifests ship the Secret: the token is the one created first.
    secret = kubectl(plane, "get", "secret", "gpuhealth-responder-token", "-n", NAMESPACE, "-o", "json")
    assert base64.b64decode(json.loads(secret.stdout)["data"]["token"]) == b"t0"


def test_kubectl_get_shows_a_live_records_expiry(plane: ControlPlane) -> None:
    """`kubectl get devicequarantines` on the real apiserver: EXPIRES is the expiry as written
    (a `date` column showed `<invalid>` for every future time, which a live record's is)."""
    done = apply(plane, CRD_FILE.read_text())
    assert done.returncode == 0, done.stderr
    ready = kubectl(
        plane, "wait", "--for=condition=Established", "--timeout=60s", "crd/devicequarantines.gpuhealth.io"
    )
    assert ready.returncode == 0, ready.stderr
    record = to_object(dra_quarantine("printer-node", "gpu.nvidia.com", "gpu-7"))
    done = apply(plane, [record])
    assert done.returncode == 0, done.stderr
    try:
        listed = kubectl(plane, "get", "devicequarantines", record["metadata"]["name"])
        assert listed.returncode == 0, listed.stderr
        header, row = listed.stdout.splitlines()
        assert header.split()[-1] == "EXPIRES" and row.split()[-1] == record["spec"]["expiresAt"], (
            listed.stdout
        )
        assert "<invalid>" not in listed.stdout
    finally:
        kubectl(plane, "delete", "devicequarantines", record["metadata"]["name"], "--ignore-not-found")


def test_the_guides_namespace_and_token_step_runs_in_any_order(plane: ControlPlane) -> None:
    """docs/operations.md's step 1 as written (the namespaces, the Secret in each), run by bash
    against the real apiserver twice: it creates, then keeps; nothing it makes collides with an
    install, which ships no Secret (tests/deploy/test_deploy_manifests.py)."""
    guide = (ROOT / "docs" / "operations.md").read_text()
    [step] = [
        b.split("```")[0] for b in guide.split("```sh\n")[1:] if b.startswith("# 1. The namespaces and")
    ]
    script = (
        f'kubectl() {{ "{KUBECTL}" --kubeconfig="{plane.kubeconfig_path}" "$@"; }}\nset -e\n'
        + step.replace('"$(openssl rand -hex 32)"', "guide-token").split("# 2.")[0]
    )
    for _ in range(2):
        done = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
    for namespace in (NAMESPACE, "monitoring"):
        secret = kubectl(plane, "get", "secret", "gpuhealth-responder-token", "-n", namespace, "-o", "json")
        assert secret.returncode == 0, secret.stderr
        assert base64.b64decode(json.loads(secret.stdout)["data"]["token"]) == b"guide-token"


def test_the_chart_is_accepted_by_a_136_apiserver(plane_136: ControlPlane, tmp_path: Path) -> None:
    """The oldest Kubernetes the chart names (kubeVersion >=1.36): every object of the enforcing
    install with the stack options on passes a server-side dry run with strict validation."""
    done = apply(plane_136, operator_crds())
    assert done.returncode == 0, done.stderr
    ready = kubectl(plane_136, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    assert ready.returncode == 0, ready.stderr
    _piped(plane_136, "namespace", NAMESPACE)
    rendered = _helm(
        plane_136, tmp_path, "template", RELEASE, str(CHART), "-n", NAMESPACE, "--include-crds",
        "--kube-version", "1.36.5", "--set", "responder.mode=enforcing", "--set", "gpuReset.enabled=true",
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    dry = kubectl(
        plane_136, "apply", "--server-side", "--dry-run=server", "--validate=strict", "-f", "-",
        stdin=rendered.stdout,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
