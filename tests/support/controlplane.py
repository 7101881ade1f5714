"""Clients of the real control plane for the tests in tests/controlplane/.

- `admin(plane)`: a KubeClient as `system:masters` (the test's own writes: what kubectl, a
  kubelet or a DRA driver would write).
- `service_account_token` asks the TokenRequest API for a service account's token, as the
  kubelet does for a pod's projected token; `as_service_account` is a KubeClient with it.
- `kubectl(plane, ...)` runs the venv's kubectl 1.37 against the admin kubeconfig.
- `audit_events(plane)`: the apiserver's audit log, one dict per request (ResponseComplete).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.resources import NAMESPACE, NODE, POD, Resource
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import wait_until
from responder.enforce.taint_rules import DRA
from responder.records import QUARANTINES, Quarantine, QuarantineSpec, from_object, record_name, to_object
from simulator.controlplane import ControlPlane
from tests.deploy.manifests import CRD_FILE, KUBECTL, build, operator_schemas

SERVICE_ACCOUNT = Resource("", "v1", "serviceaccounts", namespaced=True)
HOSTNAME = "kubernetes.io/hostname"
TOKEN_SECONDS = 3600


def client_for(kubeconfig: Path) -> KubeClient:
    return KubeClient(KubeTransport(api_client(str(kubeconfig))))


def admin(plane: ControlPlane) -> KubeClient:
    return client_for(plane.kubeconfig_path)


def service_account_token(client: KubeClient, namespace: str, name: str) -> str:
    """A bound token for the service account `namespace/name` from the TokenRequest API."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"expirationSeconds": TOKEN_SECONDS},
    }
    answer = client.create(SERVICE_ACCOUNT, request, namespace=namespace, subresource="token")
    token: str = answer["status"]["token"]
    return token


def as_service_account(plane: ControlPlane, client: KubeClient, namespace: str, name: str) -> KubeClient:
    token = service_account_token(client, namespace, name)
    kubeconfig = plane.kubeconfig_for_token(plane.workdir / f"kubeconfig-{namespace}-{name}", token)
    return client_for(kubeconfig)


def kubectl(plane: ControlPlane, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBECTL), f"--kubeconfig={plane.kubeconfig_path}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def audit_events(plane: ControlPlane) -> list[dict[str, Any]]:
    events = []
    for line in plane.audit_log_path.read_text().splitlines():
        if line.strip():
            events.append(json.loads(line))
    return events


def wait_for_object(
    client: KubeClient,
    resource: Resource,
    name: str,
    *,
    namespace: str | None = None,
    until: Callable[[dict[str, Any]], bool] = lambda obj: True,
    what: str = "",
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Poll until the object exists and `until(obj)`; the object."""

    def probe() -> dict[str, Any] | None:
        try:
            obj = client.get(resource, name, namespace=namespace)
        except NotFound:
            return None
        return obj if until(obj) else None

    return wait_until(what or f"{resource.plural}/{name}", probe, timeout=timeout)


# ----- what a kubelet and a DRA driver would write ------------------------------------------------

NODE_CAPACITY = {"cpu": "16", "memory": "64Gi", "pods": "110"}
DEVICE_CLASS = Resource("resource.k8s.io", "v1", "deviceclasses", namespaced=False)
RESOURCE_SLICE = Resource("resource.k8s.io", "v1", "resourceslices", namespaced=False)
RESOURCE_CLAIM_TEMPLATE = Resource("resource.k8s.io", "v1", "resourceclaimtemplates", namespaced=True)
POD_DISRUPTION_BUDGET = Resource("policy", "v1", "poddisruptionbudgets", namespaced=True)
DEPLOYMENT = Resource("apps", "v1", "deployments", namespaced=True)
IMAGE = "registry.invalid/gpuhealth-test/work:1"
"""Never pulled: no kubelet runs the pods, the test writes their status as one would."""


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_node(client: KubeClient, name: str) -> dict[str, Any]:
    """A Node as a kubelet registers it, with a Ready status and a fresh heartbeat (the node
    lifecycle controller would taint it only after its grace period, longer than a test)."""
    client.create(
        NODE, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {HOSTNAME: name}}}
    )
    stamp = now_rfc3339()
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "written by the test as the kubelet would",
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }
    status = {"conditions": [ready], "capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY}
    return client.patch(NODE, name, {"status": status}, subresource="status")


def publish_devices(client: KubeClient, node: str, driver: str, devices: int) -> tuple[str, list[str]]:
    """A DeviceClass for `driver` and one ResourceSlice of `devices` GPUs on `node`, as the DRA
    driver publishes them; the class name and the device names."""
    client.create(
        DEVICE_CLASS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
    )
    names = [f"gpu-{i}" for i in range(devices)]
    client.create(
        RESOURCE_SLICE,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": n, "attributes": {"index": {"int": i}}} for i, n in enumerate(names)],
            },
        },
    )
    return driver, names


def claim_spec(device_class: str) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": device_class, "allocationMode": "ExactCount"}}
            ]
        }
    }


def pod_with_claim(namespace: str, name: str, node: str, claim: dict[str, str]) -> dict[str, Any]:
    """A pod using one claim (`{"resourceClaimName": ...}` or `{"resourceClaimTemplateName": ...}`),
    kept to `node` by its hostname label."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": pod_spec(node, claim),
    }


def pod_spec(node: str, claim: dict[str, str]) -> dict[str, Any]:
    return {
        "nodeSelector": {HOSTNAME: node},
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        "resourceClaims": [{"name": "gpu", **claim}],
        "containers": [{"name": "work", "image": IMAGE, "resources": {"claims": [{"name": "gpu"}]}}],
    }


def namespace_ready(client: KubeClient, name: str) -> None:
    """Create a namespace and wait for its `default` ServiceAccount (the controller-manager's
    serviceaccount controller makes it; until then pods are refused)."""
    client.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for_object(client, SERVICE_ACCOUNT, "default", namespace=name, what=f"serviceaccount {name}/default")


def allocated_device(claim: dict[str, Any]) -> str | None:
    """The device name the scheduler allocated to a one-device claim, None while unallocated."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
    return str(results[0]["device"]) if results else None


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when it marked `pod` unschedulable, else None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message") or "unschedulable")
    return None


def run_as_kubelet(client: KubeClient, pod: dict[str, Any]) -> dict[str, Any]:
    """Write a bound pod's status as its kubelet would once its container runs: Running, Ready."""
    stamp = now_rfc3339()
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": stamp}
        for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled")
    ]
    container = {
        "name": "work",
        "image": IMAGE,
        "imageID": "",
        "ready": True,
        "started": True,
        "restartCount": 0,
        "state": {"running": {"startedAt": stamp}},
    }
    status = {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": "127.0.0.1",
        "podIP": "10.244.0.10",
        "startTime": stamp,
        "containerStatuses": [container],
    }
    meta = pod["metadata"]
    return client.patch(
        POD, meta["name"], {"status": status}, namespace=meta["namespace"], subresource="status"
    )


# ----- the manifests ------------------------------------------------------------------------------


def _structural(schema: Any) -> Any:
    """A schema as a CRD may hold it: a `$ref` (the nested routes of an AlertmanagerConfig) is
    an object the apiserver keeps as it is, which is what upstream's CRD declares there."""
    if isinstance(schema, list):
        return [_structural(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {k: _structural(v) for k, v in schema.items()}


def operator_crds() -> list[dict[str, Any]]:
    """CRDs for the Prometheus Operator kinds the overlays use, from the cut-down schemas the
    deploy tests validate with (tests/deploy/schemas): so that a real apiserver can judge those
    objects too. `metadata` is left to the apiserver (a CRD may not constrain it)."""
    crds = []
    for key, schema in operator_schemas().items():
        group_version, kind = key.rsplit("/", 1)
        group, version = group_version.split("/")
        plural = kind.lower() + "s"
        properties = {
            k: _structural(v) for k, v in (schema.get("properties") or {}).items() if k != "metadata"
        }
        crds.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.{group}"},
                "spec": {
                    "group": group,
                    "names": {
                        "kind": kind,
                        "plural": plural,
                        "singular": kind.lower(),
                        "listKind": f"{kind}List",
                    },
                    "scope": "Namespaced",
                    "versions": [
                        {
                            "name": version,
                            "served": True,
                            "storage": True,
                            "schema": {"openAPIV3Schema": {**schema, "properties": properties}},
                        }
                    ],
                },
            }
        )
    return crds


def apply(plane: ControlPlane, documents: str | list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """`kubectl apply --server-side --validate=strict -f -` of YAML text or objects."""
    text = documents if isinstance(documents, str) else yaml.safe_dump_all(documents, sort_keys=False)
    return kubectl(plane, "apply", "--server-side", "--validate=strict", "-f", "-", stdin=text)


def install(plane: ControlPlane, overlay: str = "enforcing") -> None:
    """The CRDs (ours and the operator kinds'), then `overlay`: what an operator installs."""
    for documents in (CRD_FILE.read_text(), operator_crds()):
        done = apply(plane, documents)
        assert done.returncode == 0, f"applying CRDs: {done.stderr}"
    done = kubectl(plane, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    assert done.returncode == 0, done.stderr
    done = apply(plane, build(overlay))
    assert done.returncode == 0, f"applying deploy/overlays/{overlay}: {done.stderr}"


def dra_quarantine(node: str, driver: str, device: str) -> Quarantine:
    """A quarantine of the DRA device `driver/<node's pool>/device` as the recorder makes one."""
    spec = QuarantineSpec(
        node=node,
        device=f"{driver}/{node}/{device}",
        path=DRA,
        reason="XID 79 (fell off the bus)",
        actor="alert/GPUDeviceUnhealthy",
        expires_at="2099-01-01T00:00:00Z",
        driver=driver,
        pool=node,
        device_name=device,
    )
    return Quarantine(name=record_name(node, spec.device), spec=spec)


def dra_record(client: KubeClient, node: str, driver: str, device: str) -> Quarantine:
    """`dra_quarantine` stored, as the responder writes it: its uid is what the
    DeviceTaintRule's owner reference names."""
    created = client.create(QUARANTINES, to_object(dra_quarantine(node, driver, device)))
    return from_object(created)
