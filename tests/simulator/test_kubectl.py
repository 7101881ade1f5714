"""kubectl against the simulated cluster: 1.37 (the dev extras) and the system's older one where present.

Aspects: `get pods -A` prints server-side columns (READY, STATUS, RESTARTS, AGE; NODE in wide);
`get nodes` shows Ready and, after `cordon`, SchedulingDisabled; a CRD's additionalPrinterColumns
are printed for its custom resources; `apply -f`, `create -f` and `replace -f` validate without
`--validate=false` (kubectl reads the OpenAPI v3 documents and leaves field validation to the
server) and a manifest with an unknown field is refused, creating nothing;
`create namespace|configmap|job|pdb` and `run` (protobuf bodies) store what kubectl sent;
`explain pod.spec` describes the 1.37 schema. Each kubectl runs with its own HOME (no shared
discovery cache).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuhealth.testing.loopback import wait_until
from simulator.testing import ClusterHandle, running_cluster
from tests.support.kubectl import kubectl_runner

pytestmark = pytest.mark.integration

VENV_KUBECTL = Path(sys.executable).parent / "kubectl"
SYSTEM_KUBECTL = Path("/usr/bin/kubectl")
_KUBECTLS = [
    pytest.param(VENV_KUBECTL, id="kubectl-1.37"),
    pytest.param(SYSTEM_KUBECTL, id="kubectl-system"),
]

CRD_MANIFEST = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gpuwidgets.test.gpuhealth.io
spec:
  group: test.gpuhealth.io
  scope: Namespaced
  names: {plural: gpuwidgets, singular: gpuwidget, kind: GpuWidget, shortNames: [gw]}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              node: {type: string}
              gpus: {type: integer}
    additionalPrinterColumns:
    - {name: Node, type: string, jsonPath: .spec.node}
    - {name: GPUs, type: integer, jsonPath: .spec.gpus}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterHandle]:
    with running_cluster("xid-and-unknown", speed=1) as handle:
        yield handle


@pytest.fixture(params=_KUBECTLS)
def kubectl(
    request: pytest.FixtureRequest, cluster: ClusterHandle, tmp_path: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    binary: Path = request.param
    if not binary.is_file():
        pytest.skip(f"{binary} is not installed")
    return kubectl_runner(binary, cluster.kubeconfig_path, tmp_path, timeout=60.0)


def _table(output: str) -> list[dict[str, str]]:
    """kubectl's printed table as rows keyed by header (columns split on runs of 2+ spaces)."""
    lines = [line for line in output.splitlines() if line.strip()]
    header = lines[0]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[max(0, i - 2) : i] == "  ")]
    names = [header[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
    return [
        {n: line[s:e].strip() for n, s, e in zip(names, starts, [*starts[1:], None], strict=True)}
        for line in lines[1:]
    ]


def test_kubectl_1_37_is_installed_by_the_dev_extras() -> None:
    version = subprocess.run(
        [str(VENV_KUBECTL), "version", "--client", "-o", "json"], capture_output=True, text=True, check=True
    )
    assert json.loads(version.stdout)["clientVersion"]["minor"] == "37"


def test_get_pods_prints_server_side_columns(
    kubectl: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    def running() -> list[dict[str, str]]:
        rows = _table(kubectl("get", "pods", "-A").stdout)
        return [r for r in rows if r["STATUS"] == "Running"]

    rows = wait_until("a Running pod", running, timeout=60.0)
    assert set(rows[0]) == {"NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"}
    assert rows[0]["READY"] == "1/1" and rows[0]["RESTARTS"].split()[0].isdigit()
    wide = _table(kubectl("get", "pods", "-A", "-o", "wide").stdout)
    assert {"IP", "NODE", "NOMINATED NODE", "READINESS GATES"} <= set(wide[0])
    assert any(r["NODE"].startswith("gpu-") for r in wide)
    everything = kubectl("get", "all", "-A").stdout  # the `all` category: pods and jobs here
    assert "pod/" in everything and "job.batch/" in everything


def test_get_nodes_and_cordon(kubectl: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    nodes = _table(kubectl("get", "nodes").stdout)
    assert list(nodes[0]) == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert all(n["STATUS"] == "Ready" for n in nodes)
    name = nodes[0]["NAME"]
    kubectl("cordon", name)
    try:
        shown = _table(kubectl("get", "node", name).stdout)
        assert shown[0]["STATUS"] == "Ready,SchedulingDisabled"
    finally:
        kubectl("uncordon", name)


def test_crd_printer_columns(kubectl: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    kubectl("apply", "-f", "-", stdin=CRD_MANIFEST)
    widget = {
        "apiVersion": "test.gpuhealth.io/v1",
        "kind": "GpuWidget",
        "metadata": {"name": "w1", "namespace": "default"},
        "spec": {"node": "gpu-dp-0", "gpus": 4},
    }
    wait_until(
        "the CRD to be served",
        lambda: kubectl("apply", "-f", "-", stdin=json.dumps(widget), check=False).returncode == 0,
        timeout=60.0,
    )
    rows = _table(kubectl("get", "gpuwidgets", "-n", "default").stdout)
    assert rows == [{"NAME": "w1", "NODE": "gpu-dp-0", "GPUS": "4", "AGE": rows[0]["AGE"]}]
    assert rows[0]["AGE"].endswith(("s", "m"))
    crds = _table(kubectl("get", "crd").stdout)
    assert {"NAME", "CREATED AT"} == set(crds[0]) and "gpuwidgets.test.gpuhealth.io" in {
        c["NAME"] for c in crds
    }


def test_apply_validates_and_refuses_unknown_fields(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], request: pytest.FixtureRequest
) -> None:
    name = f"cm-{request.node.callspec.id}"
    good = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": {"a": "1"},
    }
    assert "created" in kubectl("apply", "-f", "-", stdin=json.dumps(good)).stdout
    good["data"] = {"a": "2"}
    assert "configured" in kubectl("apply", "-f", "-", stdin=json.dumps(good)).stdout
    assert "replaced" in kubectl("replace", "-f", "-", stdin=json.dumps(good)).stdout
    bad = {**good, "metadata": {"name": f"{name}-bad", "namespace": "default"}, "bogus": 1}
    for verb in ("apply", "create"):
        refused = kubectl(verb, "-f", "-", stdin=json.dumps(bad), check=False)
        assert refused.returncode != 0 and "bogus" in refused.stderr, refused.stderr
        assert "validate=false" not in refused.stderr
    assert kubectl("get", "configmap", f"{name}-bad", "-n", "default", check=False).returncode != 0


def test_create_namespace_and_configmap(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    namespace = f"ns-{request.node.callspec.id}".replace(".", "-").lower()
    kubectl("create", "namespace", namespace)
    (tmp_path / "blob").write_bytes(b"\x00\x01\xff")
    kubectl(
        "create",
        "configmap",
        "settings",
        "-n",
        namespace,
        "--from-literal=mode=strict",
        f"--from-file=blob={tmp_path / 'blob'}",
    )
    stored = json.loads(kubectl("get", "configmap", "settings", "-n", namespace, "-o", "json").stdout)
    assert stored["data"] == {"mode": "strict"} and stored["binaryData"] == {"blob": "AAH/"}
    rows = _table(kubectl("get", "configmaps", "-n", namespace).stdout)
    assert [(r["NAME"], r["DATA"]) for r in rows] == [("settings", "2")]
    assert _table(kubectl("get", "namespace", namespace).stdout)[0]["STATUS"] == "Active"
    kubectl("create", "job", "once", "-n", namespace, "--image=busybox", "--", "sh", "-c", "echo hi")
    job = json.loads(kubectl("get", "job", "once", "-n", namespace, "-o", "json").stdout)
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["sh", "-c", "echo hi"]
    kubectl("create", "pdb", "budget", "-n", namespace, "--selector=app=solo", "--min-available=1")
    budget = _table(kubectl("get", "pdb", "budget", "-n", namespace).stdout)[0]
    assert (budget["MIN AVAILABLE"], budget["MAX UNAVAILABLE"]) == ("1", "N/A")
    kubectl("run", "solo", "-n", namespace, "--image=busybox", "--restart=Never", "--", "sleep", "1")
    pods = {r["NAME"]: r for r in _table(kubectl("get", "pods", "-n", namespace).stdout)}
    assert pods["solo"]["READY"].endswith("/1") and pods["solo"]["STATUS"]


def test_explain(kubectl: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    out = kubectl("explain", "pod.spec").stdout
    assert "KIND:" in out and "Pod" in out and "containers" in out
    assert "restartPolicy" in kubectl("explain", "jobs.spec.template.spec").stdout
