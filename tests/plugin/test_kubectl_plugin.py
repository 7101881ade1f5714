"""`kubectl gpuhealth`: the real kubectl finds the plugin on PATH and runs it against the simulated
cluster, with a real exporter (cluster mode, its own process) reached through the apiserver's pod
proxy and DeviceQuarantine records from the shipped CRD.

Aspects: kubectl 1.37 (and the system's older kubectl where present) lists and runs
`kubectl-gpuhealth`; usage strings begin with `kubectl gpuhealth`; `devices` joins the exporter's
view with the records (QUARANTINE column; `-o wide` RECORD); the namespace is `-n`, then the
context's namespace, then `default` (devices held by that namespace's pods; `-A` every device,
idle ones too), while the breaker's ConfigMap is read in `-n` or the responder's namespace,
never the context's; `-l` picks devices by their pods'
labels, and records by theirs; `-o json|yaml` parse, `--no-headers` drops exactly the header
line; `--exporter-url` and `--directory` give the same devices as the pod proxy; `--pod NS/NAME`
on a pod with an Unhealthy device (device plugin) shows health, status age, message and the
quarantine phase, and on a DRA pod resolves its claim's devices; bad input exits 2 with one
error line, a missing pod or an exporter that does not answer exit 1 naming it; `quarantine
list|show|release` and `breaker status|reset` behave as the `gpuhealth` commands do.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.resources import NAMESPACE, POD
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import child_process, free_port, http_json, http_ok, log_tail, wait_until
from responder.reconcile.breaker import BreakerState
from responder.reconcile.breaker_store import AuditEntry, BreakerStore
from responder.records import QUARANTINES, Phase, to_object
from simulator.testing import ClusterHandle, running_cluster
from tests.responder.test_cli_quarantine import CRD_FILE, CRDS, record
from tests.support.certificates import self_signed
from tests.support.kubectl import Kubectl, kubectl_runner

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BIN = Path(sys.executable).parent
VENV_KUBECTL = BIN / "kubectl"
SYSTEM_KUBECTL = Path("/usr/bin/kubectl")
EXPORTERS = "gpuhealth-system"

SCENARIO: dict[str, Any] = {
    "name": "plugin",
    "fleet": [
        {"name": "gpu-dp", "count": 1, "gpusPerNode": 4, "path": "device-plugin"},
        {"name": "gpu-dra", "count": 1, "gpusPerNode": 4, "path": "dra"},
    ],
    "workloads": [
        {"name": "serve", "namespace": "inference", "replicas": 2, "gpusPerPod": 1, "path": "device-plugin"},
        {"name": "train", "namespace": "research", "replicas": 1, "gpusPerPod": 2, "path": "dra"},
    ],
    # A fatal XID on the GPU the first serve pod holds: the device plugin reports it Unhealthy.
    "timeline": [{"at": "1s", "fault": "xid", "device": {"node": "gpu-dp-0", "gpu": 0}, "xid": 79}],
}


@dataclass
class Env:
    cluster: ClusterHandle
    kubeconfig: Path
    exporter_url: str
    directory: Path
    unhealthy: dict[str, Any]
    """The exporter's document of the Unhealthy device."""
    holder: tuple[str, str]
    """(namespace, pod) holding it."""
    record: str


def _kubeconfig_with_contexts(source: Path, target: Path) -> None:
    """The cluster's kubeconfig plus a context whose namespace is `inference` (and one with
    `inference` that is current, to check resolution from the current context)."""
    config = yaml.safe_load(source.read_text())
    base = config["contexts"][0]
    config["contexts"].append(
        {"name": "in-inference", "context": {**base["context"], "namespace": "inference"}}
    )
    config["contexts"].append(
        {"name": "in-research", "context": {**base["context"], "namespace": "research"}}
    )
    target.write_text(yaml.safe_dump(config))


def _exporter_pod(
    port: int, name: str = "gpuhealth-exporter-x1", namespace: str = EXPORTERS
) -> dict[str, Any]:
    # No scheduler serves this name, so the pod stays unbound; its IP is loopback, where the
    # exporter process listens: the apiserver's pod proxy reaches it as it would a DaemonSet pod.
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "gpuhealth-exporter"},
        },
        "spec": {
            "schedulerName": "gpuhealth-test-unscheduled",
            "containers": [
                {"name": "exporter", "image": "gpuhealth", "ports": [{"name": "http", "containerPort": port}]}
            ],
        },
    }


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("plugin")
    with running_cluster(SCENARIO, speed=10) as cluster:
        kubeconfig = tmp / "kubeconfig"
        _kubeconfig_with_contexts(cluster.kubeconfig_path, kubeconfig)
        client = KubeClient(KubeTransport(api_client(str(cluster.kubeconfig_path))))
        port = free_port()
        directory = tmp / "directory.sqlite"
        argv = [
            *(sys.executable, "-m", "gpuhealth", "exporter", "--kubeconfig", str(cluster.kubeconfig_path)),
            *("--listen", f"127.0.0.1:{port}", "--directory", str(directory)),
        ]
        try:
            client.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
            client.create(
                NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": EXPORTERS}}
            )
            pod = client.create(POD, _exporter_pod(port), namespace=EXPORTERS)
            client.update(
                POD, {**pod, "status": {"phase": "Running", "podIP": "127.0.0.1"}}, subresource="status"
            )
            with child_process(argv, tmp / "exporter.log") as exporter:
                url = f"http://127.0.0.1:{port}"

                def unhealthy() -> dict[str, Any] | None:
                    if exporter.poll() is not None:
                        raise AssertionError(f"the exporter exited: {log_tail(tmp / 'exporter.log')}")
                    if not http_ok(f"{url}/readyz"):
                        return None
                    devices = http_json(f"{url}/api/v1/devices")["devices"]
                    return next((d for d in devices if d["health"] == "Unhealthy" and d["allocations"]), None)

                device = wait_until("the exporter to see the XID's Unhealthy device", unhealthy, timeout=60)
                stored = to_object(record(device["node"], device["device"], Phase.QUARANTINED))
                status = stored.pop("status")
                created = client.create(QUARANTINES, stored)
                client.update(QUARANTINES, {**created, "status": status}, subresource="status")
                holder = (device["allocations"][0]["namespace"], device["allocations"][0]["pod"])
                yield Env(cluster, kubeconfig, url, directory, device, holder, created["metadata"]["name"])
        finally:
            client.close()


@pytest.fixture
def kubectl(env: Env, tmp_path: Path) -> Kubectl:
    return kubectl_runner(VENV_KUBECTL, env.kubeconfig, tmp_path, path=BIN)


def gpuhealth(kubectl: Kubectl, *args: str) -> subprocess.CompletedProcess[str]:
    if args[0] == "devices":
        # The test's exporter listens on a free port, which its pod declares as `http`.
        args = (*args, "--exporter-port", "http")
    return kubectl("gpuhealth", *args, check=False)


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


# ----- discovery and usage -------------------------------------------------------------


@pytest.mark.parametrize("binary", [VENV_KUBECTL, SYSTEM_KUBECTL], ids=["kubectl-1.37", "kubectl-system"])
def test_kubectl_finds_and_runs_the_plugin(env: Env, tmp_path: Path, binary: Path) -> None:
    if not binary.is_file():
        pytest.skip(f"{binary} is not installed")
    run = kubectl_runner(binary, env.kubeconfig, tmp_path, path=BIN)
    listed = run("plugin", "list", check=False)
    assert str(BIN / "kubectl-gpuhealth") in listed.stdout
    helped = run("gpuhealth", "devices", "--help")
    assert helped.stdout.startswith("usage: kubectl gpuhealth devices ")
    devices = run("gpuhealth", "devices", "-A", "--exporter-port", "http")
    assert env.unhealthy["device"] in devices.stdout


# ----- devices -------------------------------------------------------------------------


def test_every_device_with_its_quarantine_state(env: Env, kubectl: Kubectl) -> None:
    done = gpuhealth(kubectl, "devices", "-A")
    assert done.returncode == 0, done.stderr
    rows = table(done.stdout)
    assert rows[0] == ["NODE", "DEVICE", "HEALTH", "AGE", "PODS", "QUARANTINE", "MESSAGE"]
    by_device = {r[1]: r for r in rows[1:]}
    # Every device the exporter tracks, idle ones too (DRA devices from their slices).
    exported = http_json(f"{env.exporter_url}/api/v1/devices")["devices"]
    assert set(by_device) == {d["device"] for d in exported}
    assert any(r[4] == "<none>" for r in by_device.values())
    line = by_device[env.unhealthy["device"]]
    assert line[2] == "Unhealthy" and line[5] == "Quarantined"
    assert line[4] == "/".join(env.holder)
    assert all(r[5] == "-" for d, r in by_device.items() if d != env.unhealthy["device"])
    wide = table(gpuhealth(kubectl, "devices", "-A", "-o", "wide").stdout)
    assert "RECORD" in wide[0] and env.record in {c for r in wide[1:] for c in r}


def test_namespace_is_the_flag_then_the_context_then_default(
    env: Env, kubectl: Kubectl, tmp_path: Path
) -> None:
    def pods(*args: str) -> set[str]:
        done = gpuhealth(kubectl, "devices", *args, "-o", "json")
        assert done.returncode == 0, done.stderr
        return {a["namespace"] for d in json.loads(done.stdout)["devices"] for a in d["allocations"]}

    assert pods("--context", "in-inference") == {"inference"}
    assert pods("--context", "in-inference", "-n", "research") == {"research"}  # the flag wins
    assert pods("--context", "in-inference", "--namespace", "research", "-A") == {"inference", "research"}
    assert pods() == set()  # the current context sets no namespace: default, where no pod holds a GPU
    # --kubeconfig beats $KUBECONFIG; its current context sets the namespace.
    research = yaml.safe_load(env.kubeconfig.read_text()) | {"current-context": "in-research"}
    (tmp_path / "research").write_text(yaml.safe_dump(research))
    assert pods("--kubeconfig", str(tmp_path / "research")) == {"research"}
    empty = gpuhealth(kubectl, "devices")
    assert (empty.returncode, empty.stdout, empty.stderr) == (
        0,
        "",
        "No devices found in default namespace.\n",
    )


def test_selector_json_yaml_and_no_headers(env: Env, kubectl: Kubectl) -> None:
    picked = json.loads(gpuhealth(kubectl, "devices", "-A", "-l", "app=serve", "-o", "json").stdout)[
        "devices"
    ]
    assert len(picked) == 2 and {a["pod"].split("-")[0] for d in picked for a in d["allocations"]} == {
        "serve"
    }
    quarantined = [d for d in picked if d["quarantine"] is not None]
    assert [(d["device"], d["quarantine"]["phase"]) for d in quarantined] == [
        (env.unhealthy["device"], "Quarantined")
    ]
    as_yaml = yaml.safe_load(gpuhealth(kubectl, "devices", "-n", "inference", "-o", "yaml").stdout)
    assert {d["device"] for d in as_yaml["devices"]} == {d["device"] for d in picked}
    with_headers = gpuhealth(kubectl, "devices", "-A").stdout.splitlines()
    without = gpuhealth(kubectl, "devices", "-A", "--no-headers").stdout.splitlines()
    assert [line.split() for line in without] == [line.split() for line in with_headers[1:]]


def test_exporter_url_and_directory_give_the_same_devices(env: Env, kubectl: Kubectl) -> None:
    def devices(*args: str) -> dict[str, str]:
        done = gpuhealth(kubectl, "devices", "-A", *args, "-o", "json")
        assert done.returncode == 0, done.stderr
        return {d["device"]: d["health"] for d in json.loads(done.stdout)["devices"]}

    proxied = devices()
    assert devices("--exporter-url", env.exporter_url) == proxied
    assert devices("--directory", str(env.directory)) == proxied


def test_pod_shows_its_devices_health_age_message_and_quarantine(env: Env, kubectl: Kubectl) -> None:
    namespace, name = env.holder
    done = gpuhealth(kubectl, "devices", "--pod", f"{namespace}/{name}")
    assert done.returncode == 0, done.stderr
    rows = table(done.stdout)
    assert rows[0] == ["CONTAINER", "RESOURCE", "DEVICE", "HEALTH", "AGE", "QUARANTINE", "MESSAGE"]
    assert rows[1][1:4] == ["nvidia.com/gpu", env.unhealthy["device"], "Unhealthy"]
    assert rows[1][4] != "?" and rows[1][5] == "Quarantined"
    bare = table(gpuhealth(kubectl, "devices", "--pod", f"{namespace}/{name}", "--no-headers").stdout)
    assert [r[:4] + r[5:] for r in bare] == [r[:4] + r[5:] for r in rows[1:]]  # AGE moves on
    wide = table(gpuhealth(kubectl, "devices", "--pod", f"{namespace}/{name}", "-o", "wide").stdout)
    assert wide[0][6:] == ["RESOURCE-ID", "VERSION", "RECORD", "MESSAGE"]
    assert wide[1][6] == env.unhealthy["device"] and wide[1][8] == env.record
    doc = json.loads(gpuhealth(kubectl, "devices", "--pod", name, "-n", namespace, "-o", "json").stdout)
    assert doc["kind"] == "PodDeviceList" and doc["pod"]["name"] == name
    (entry,) = doc["devices"]
    assert (entry["health"], entry["message"]) == ("Unhealthy", env.unhealthy["message"])
    assert entry["statusAgeSeconds"] is not None and entry["quarantine"]["name"] == env.record


def test_pod_resolves_dra_claims_to_the_exporters_devices(env: Env, kubectl: Kubectl) -> None:
    (train,) = env.cluster.list("pods", "research")
    doc = yaml.safe_load(
        gpuhealth(
            kubectl, "devices", "--pod", train["metadata"]["name"], "--context", "in-research", "-o", "yaml"
        ).stdout
    )
    assert len(doc["devices"]) == 2
    for entry in doc["devices"]:
        assert entry["resource"].startswith("claim:")
        assert entry["exporter"]["driver"] and entry["device"] == entry["exporter"]["device"]
        assert entry["quarantine"] is None


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["devices", "--pod", "a/b/c"], 2, "kubectl gpuhealth devices: error: --pod 'a/b/c': expected NAME"),
        (["devices", "-o", "xml"], 2, "argument -o/--output: invalid choice: 'xml'"),
        (["devices", "--context", "nowhere"], 2, "context 'nowhere' does not exist"),
        (["devices", "--pod", "x", "--directory", "d"], 2, "--pod and -l read pods from the cluster"),
        (["devices", "--exporter-url", "localhost:1"], 2, "expected an http:// or https:// URL"),
        (["devices", "--pod", "inference/ghost"], 1, 'pods "ghost" not found in namespace inference'),
        (["devices", "-A", "--directory", "/nonexistent/dir.sqlite"], 2, "/nonexistent/dir.sqlite"),
        (
            ["quarantine", "show", "nothing-here"],
            1,
            "no DeviceQuarantine 'nothing-here' (see `kubectl gpuhealth quarantine list`)",
        ),
        (["breaker", "reset", "--actor", " ", "--reason", "r"], 2, "--actor must not be empty"),
    ],
)
def test_bad_input_is_one_error_line_and_its_exit_code(
    kubectl: Kubectl, args: list[str], code: int, message: str
) -> None:
    done = gpuhealth(kubectl, *args)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_an_exporter_that_does_not_answer_is_named_and_fails_the_command(env: Env, kubectl: Kubectl) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    partial = gpuhealth(
        kubectl, "devices", "-A", "--exporter-url", env.exporter_url, "--exporter-url", closed
    )
    assert partial.returncode == 1
    assert f"warning: {closed}: GET {closed}/api/v1/devices" in partial.stderr
    assert env.unhealthy["device"] in partial.stdout  # what the other one gave is printed
    none = gpuhealth(kubectl, "devices", "-A", "--exporter-namespace", "kube-system")
    assert none.returncode == 1 and "no exporter pods in namespace 'kube-system'" in none.stderr


# ----- quarantine and breaker ----------------------------------------------------------


def test_quarantine_list_show_release(env: Env, kubectl: Kubectl) -> None:
    node = env.unhealthy["node"]
    listed = gpuhealth(kubectl, "quarantine", "list", "-A", "-l", f"gpuhealth.io/node={node}", "--no-headers")
    assert listed.returncode == 0, listed.stderr
    (row,) = table(listed.stdout)
    assert row[1:6] == [node, env.unhealthy["device"], "Quarantined", "Unhealthy", "quarantine"]
    assert env.record.startswith(row[0].rstrip("…"))
    other = gpuhealth(kubectl, "quarantine", "list", "-l", "gpuhealth.io/node=elsewhere")
    assert (other.returncode, other.stdout) == (0, "No quarantined devices matching the filters.\n")
    docs = json.loads(gpuhealth(kubectl, "quarantine", "list", "-o", "json").stdout)
    assert [q["metadata"]["name"] for q in docs["quarantines"]] == [env.record]
    shown = gpuhealth(kubectl, "quarantine", "show", node, env.unhealthy["device"])
    assert shown.returncode == 0 and "Phase:" in shown.stdout and "Quarantined" in shown.stdout
    refused = gpuhealth(
        kubectl, "quarantine", "release", env.record, "--actor", "ops", "--reason", "repaired"
    )
    assert refused.returncode == 1 and "GPUDeviceUnhealthy still firing" in refused.stderr


def test_breaker_namespace_is_the_flag_then_the_responders_never_the_context(
    env: Env, kubectl: Kubectl
) -> None:
    client = KubeClient(KubeTransport(api_client(str(env.cluster.kubeconfig_path))))
    try:
        BreakerStore(client, EXPORTERS).write(
            BreakerState(tripped=True, trigger="rate", tripped_at=1_800_000_000.0, detail="5 devices in 10m"),
            AuditEntry(
                time="2027-01-15T08:00:00Z", action="trip", actor="responder", reason="5 devices in 10m"
            ),
        )
    finally:
        client.close()
    # The context's namespace is a tenant's; the breaker is the install's (gpuhealth-system).
    tripped = gpuhealth(kubectl, "breaker", "status", "--context", "in-inference")
    assert tripped.returncode == 0 and tripped.stdout.startswith("TRIPPED (rate)")
    elsewhere = gpuhealth(kubectl, "breaker", "status", "-n", "research", "-o", "json")
    assert elsewhere.returncode == 1 and "no breaker found in namespace research" in elsewhere.stderr
    reset = gpuhealth(kubectl, "breaker", "reset", "--actor", "ops", "--reason", "storm over")
    assert reset.returncode == 0 and "Breaker reset by ops" in reset.stdout
    stored = env.cluster.get("configmaps", "gpuhealth-breaker", EXPORTERS)
    assert json.loads(stored["data"]["state"])["tripped"] is False


def test_exporters_behind_tls_are_read_through_the_proxy_over_https(
    env: Env, kubectl: Kubectl, tmp_path: Path
) -> None:
    """An exporter with `--web.config.file` serving TLS: `--exporter-scheme https` reads it through
    the apiserver's proxy (which does not verify the pod's certificate) with the same devices."""
    namespace, port = "gpuhealth-tls", free_port()
    cert, key = self_signed(tmp_path, "tls")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    client = KubeClient(KubeTransport(api_client(str(env.cluster.kubeconfig_path))))
    argv = [
        *(sys.executable, "-m", "gpuhealth", "exporter", "--kubeconfig", str(env.cluster.kubeconfig_path)),
        *("--listen", f"127.0.0.1:{port}", "--directory", str(tmp_path / "tls.sqlite")),
        *("--web.config.file", str(web)),
    ]
    try:
        client.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        pod = client.create(
            POD, _exporter_pod(port, "gpuhealth-exporter-tls", namespace), namespace=namespace
        )
        client.update(
            POD, {**pod, "status": {"phase": "Running", "podIP": "127.0.0.1"}}, subresource="status"
        )
        with child_process(argv, tmp_path / "exporter.log"):
            plain = gpuhealth(kubectl, "devices", "-A", "--exporter-namespace", namespace, "-o", "json")
            assert plain.returncode != 0  # plain HTTP to a TLS port: the exporter named, the command failed

            https = (
                "devices",
                "-A",
                "--exporter-namespace",
                namespace,
                "--exporter-scheme",
                "https",
                "-o",
                "json",
            )

            def over_https() -> set[str] | None:
                done = gpuhealth(kubectl, *https)
                if done.returncode != 0:
                    return None
                devices = {d["device"] for d in json.loads(done.stdout)["devices"]}
                return devices if env.unhealthy["device"] in devices else None

            wait_until("the TLS exporter's devices read over https", over_https, timeout=60)
    finally:
        client.close()
