"""`POST /scheduler/filter` on a running `gpuhealth responder`, against a simulated cluster whose
scheduler calls it (`gpuhealth sim --scheduler-config FILE`).

Aspects (the responder started with the shipped `--config` example): ExtenderArgs with Node
objects (the annotation read from the objects sent) and with NodeNames (answered from the
Node/Pod cache, once the watch has seen the annotation); a body that is not ExtenderArgs
answers 400 with `Error` set; and through the simulated scheduler's own extender client, a GPU
pod goes to the node where it fits without the quarantined device, and a second one that would
fit only with it stays Pending, the extender's reason in its FailedScheduling message; the load
on a device grows in steps through the responder's own enforcement (`NodeAnnotation`): while
quarantined no pod gets it, on the ramp a pod labelled `gpuhealth.io/canary-ok: "true"` is
placed on it while an ordinary one stays Pending (also once the opted-in pod is gone and the
device is free), and at the release the ordinary pod lands there.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.resources import NAMESPACE, NODE, POD, Resource
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import free_port, http_ok, wait_until
from responder.enforce.node_annotation import NODE_ANNOTATION, NodeAnnotation
from responder.ladder import CANARY_OPT_IN, CANARY_TAINT, QUARANTINE_TAINT
from responder.reconcile.policy import Enforce
from responder.records import Quarantine
from responder.webhook.intake import IntakeSettings, Write, decide
from simulator.fleet.objects import gpu_uuid
from tests.responder.test_intake import alert

pytestmark = pytest.mark.integration

SCENARIO = {
    "name": "extender",
    "fleet": [{"name": "dp", "count": 2, "gpusPerNode": 2, "path": "device-plugin"}],
}


def post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


EVENT = Resource("", "v1", "events", namespaced=True)


def gpu_pod(name: str, gpus: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "tenants", "labels": labels or {}},
        "spec": {
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ]
        },
    }


@pytest.fixture
def cluster_and_responder(tmp_path: Path) -> Iterator[tuple[KubeClient, str]]:
    port = free_port()
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(SCENARIO))
    (tmp_path / "scheduler.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "extenders": [
                    {
                        "urlPrefix": f"http://127.0.0.1:{port}/scheduler",
                        "filterVerb": "filter",
                        "nodeCacheCapable": True,
                        "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}],
                        "httpTimeout": "5s",
                    }
                ],
            }
        )
    )
    kubeconfig = tmp_path / "kubeconfig"
    (tmp_path / "token").write_text("extender-test-token\n")
    sim = subprocess.Popen(
        [
            sys.executable, "-m", "gpuhealth", "sim",
            "--scenario", str(tmp_path / "scenario.yaml"),
            "--scheduler-config", str(tmp_path / "scheduler.yaml"),
            "--kubeconfig-out", str(kubeconfig),
            "--speed", "10",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    responder: subprocess.Popen[str] | None = None
    kube: KubeClient | None = None
    try:
        assert sim.stdout is not None
        wait_until("the simulated cluster", lambda: "kubeconfig:" in sim.stdout.readline(), timeout=120)
        kube = KubeClient(KubeTransport(api_client(str(kubeconfig))))
        for namespace in ("gpuhealth-system", "tenants"):
            kube.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        responder = subprocess.Popen(
            [
                sys.executable, "-m", "gpuhealth", "responder",
                "--kubeconfig", str(kubeconfig),
                "--listen", f"127.0.0.1:{port}",
                "--token-file", str(tmp_path / "token"),
                "--prometheus-url", "http://127.0.0.1:9",
                "--identity", "replica-a",
                "--config", str(Path(__file__).parents[2] / "deploy" / "responder-config.yaml"),
            ],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        wait_until("the responder", lambda: http_ok(f"{base}/healthz"), timeout=60)
        yield kube, base
    finally:
        for proc in (responder, sim):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
        if kube is not None:
            kube.close()


def annotate(kube: KubeClient, name: str, devices: list[str]) -> dict[str, Any]:
    def attempt() -> dict[str, Any] | None:
        node = kube.get(NODE, name)
        node["metadata"].setdefault("annotations", {})[NODE_ANNOTATION] = json.dumps(devices)
        try:
            return kube.update(NODE, node)
        except Exception:  # a kubelet status write in between: read again
            return None

    return wait_until("the node annotation", attempt, timeout=30)


def test_the_extender_counts_quarantined_devices_out(cluster_and_responder: tuple[KubeClient, str]) -> None:
    kube, base = cluster_and_responder
    annotated = annotate(kube, "dp-0", ["GPU-dp-0-1"])
    assert annotated["status"]["allocatable"]["nvidia.com/gpu"] == "2"  # the kubelet still counts it
    url = f"{base}/scheduler/filter"

    # Node objects: read from what the scheduler sent.
    nodes = {"apiVersion": "v1", "kind": "NodeList", "items": [annotated, kube.get(NODE, "dp-1")]}
    status, result = post(url, {"Pod": gpu_pod("p", 2), "Nodes": nodes, "NodeNames": None})
    assert status == 200 and result["Error"] == ""
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["dp-1"]
    assert result["FailedNodes"] == {
        "dp-0": "gpuhealth: 1 quarantined nvidia.com/gpu counted out; 1 free for a request of 2"
    }
    status, result = post(url, {"Pod": gpu_pod("p", 1), "Nodes": nodes, "NodeNames": None})
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["dp-0", "dp-1"]

    # Names only: the cache answers once its watch has seen the annotation; unknown nodes pass.
    def names_answer() -> dict[str, Any] | None:
        _, answer = post(url, {"Pod": gpu_pod("p", 2), "Nodes": None, "NodeNames": ["dp-0", "dp-1", "x"]})
        return answer if answer["NodeNames"] == ["dp-1", "x"] else None

    answer = wait_until("the cache to see the annotation", names_answer, timeout=30)
    assert answer["Nodes"] is None and set(answer["FailedNodes"]) == {"dp-0"}

    status, result = post(url, {"NodeNames": ["dp-0"]})
    assert status == 400 and result["Error"] == "gpuhealth: not ExtenderArgs: Pod: expected a Pod object"

    # The simulated kube-scheduler, calling the extender: the first pod fits only on dp-1.
    kube.create(POD, gpu_pod("first", 2), namespace="tenants")
    bound = wait_until(
        "the first pod bound",
        lambda: kube.get(POD, "first", namespace="tenants")["spec"].get("nodeName"),
        timeout=60,
    )
    assert bound == "dp-1"

    # The second would fit on dp-0 only with the quarantined device: it stays Pending, and why.
    kube.create(POD, gpu_pod("second", 2), namespace="tenants")

    def unschedulable() -> str | None:
        pod = kube.get(POD, "second", namespace="tenants")
        assert not pod["spec"].get("nodeName"), "placed on a node where it fits only with the quarantined GPU"
        for condition in pod.get("status", {}).get("conditions") or ():
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return str(condition.get("message"))
        return None

    message = wait_until("the second pod unschedulable", unschedulable, timeout=60)
    assert "gpuhealth: 1 quarantined nvidia.com/gpu counted out" in message, message


def bound_to(kube: KubeClient, name: str) -> str:
    return wait_until(
        f"pod {name} bound",
        lambda: kube.get(POD, name, namespace="tenants")["spec"].get("nodeName"),
        timeout=60,
    )


def failed_scheduling(kube: KubeClient, name: str) -> tuple[int, str]:
    """(attempts counted, last message) of the pod's FailedScheduling Events."""
    count, message = 0, ""
    for event in kube.list(EVENT, namespace="tenants").items:
        involved = event.get("involvedObject") or {}
        if involved.get("name") == name and event.get("reason") == "FailedScheduling":
            count += int(event.get("count") or 1)
            message = str(event.get("message") or "")
    return count, message


def test_the_load_on_a_device_grows_in_steps_quarantined_ramp_released(
    cluster_and_responder: tuple[KubeClient, str],
) -> None:
    kube, _ = cluster_and_responder
    decision = decide(
        None, alert(node="dp-0", device=gpu_uuid("dp-0", 1)), now=1_800_000_000.0, settings=IntakeSettings()
    )
    assert isinstance(decision, Write)
    record = Quarantine(name=decision.record.name, uid="u", spec=decision.record.spec)
    enforcement = NodeAnnotation(kube)

    # Quarantined: dp-0's GPU 1 is counted out; dp-1 and dp-0's GPU 0 fill up, an ordinary pod waits.
    enforcement.enforce(record, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))
    kube.create(POD, gpu_pod("elsewhere", 2), namespace="tenants")
    assert bound_to(kube, "elsewhere") == "dp-1"
    kube.create(POD, gpu_pod("neighbour", 1), namespace="tenants")
    assert bound_to(kube, "neighbour") == "dp-0"
    kube.create(POD, gpu_pod("ordinary", 1), namespace="tenants")
    wait_until("the ordinary pod refused", lambda: failed_scheduling(kube, "ordinary")[0] > 0, timeout=60)

    # The ramp: the opted-in pod gets the device; the ordinary one is still refused, and why.
    enforcement.enforce(record, Enforce(CANARY_TAINT, "Unhealthy", "NoSchedule"))
    kube.create(POD, gpu_pod("opted-in", 1, {CANARY_OPT_IN: "true"}), namespace="tenants")
    assert bound_to(kube, "opted-in") == "dp-0"
    assert not kube.get(POD, "ordinary", namespace="tenants")["spec"].get("nodeName")

    # The opted-in pod done, the device is free and still ramping: the ordinary pod is refused again.
    kube.delete(POD, "opted-in", namespace="tenants", grace_period_seconds=0)

    def gone() -> bool:
        try:
            kube.get(POD, "opted-in", namespace="tenants")
        except NotFound:
            return True
        return False

    wait_until("the opted-in pod gone", gone, timeout=60)
    before, _ = failed_scheduling(kube, "ordinary")
    retried = wait_until(
        "the ordinary pod tried again",
        lambda: (
            failed_scheduling(kube, "ordinary") if failed_scheduling(kube, "ordinary")[0] > before else None
        ),
        timeout=60,
    )
    assert "on the ramp: only pods labelled gpuhealth.io/canary-ok=true" in retried[1], retried
    assert not kube.get(POD, "ordinary", namespace="tenants")["spec"].get("nodeName")

    # Released: full load, the ordinary pod lands on dp-0.
    enforcement.lift(record)
    assert bound_to(kube, "ordinary") == "dp-0"
