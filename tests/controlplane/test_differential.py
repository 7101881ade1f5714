"""The simulated apiserver measured against the real one: one list of requests, two answers.

Aspects covered: the requests gpuhealth's services make (pods, nodes, leases, ConfigMaps,
Events, DeviceQuarantines, DeviceTaintRules, evictions), the flows kubectl drives (dry-run,
strict field validation, patches of each kind, server-side apply) and bad inputs (invalid
objects, unknown fields, stale versions, failed preconditions, missing objects and
namespaces, bad selectors) are sent in order to a real kube-apiserver 1.37 and to the
simulated cluster; the status code, a Status's reason and details, and the fields each step
names must agree. Every divergence is either fixed or listed in `KNOWN` with its reason, and
`docs/simulator.md` ("Measured against the real apiserver") lists the same: the test fails when
a listed divergence is gone as much as when a new one appears, so the list stays true.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.kube.config import api_client
from simulator.controlplane import ControlPlane
from simulator.testing import running_cluster
from tests.support.differential import APPLY, JSON_PATCH, MERGE, STRATEGIC, Plane, Step, differences, run

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
_SHIPPED_CRD = yaml.safe_load((REPO / "deploy/crds/devicequarantines.gpuhealth.io.yaml").read_text())
# The shipped CRD's schema under a group of this test's own, so the shared control plane's other
# tests (which install the real one) and this one never meet.
GROUP = "diff.gpuhealth.io"
CRD = {
    **_SHIPPED_CRD,
    "metadata": {"name": f"devicequarantines.{GROUP}"},
    "spec": {**_SHIPPED_CRD["spec"], "group": GROUP},
}
QUARANTINES = f"/apis/{GROUP}/v1alpha1/devicequarantines"
QUARANTINE = {
    "apiVersion": f"{GROUP}/v1alpha1",
    "kind": "DeviceQuarantine",
    "metadata": {"name": "{ns}-gpu-1"},
    "spec": {
        "node": "diff-node",
        "device": "GPU-1",
        "path": "device-plugin",
        "action": "quarantine",
        "reason": "FatalXid",
        "actor": "alert/GPUDeviceFatalXid",
        "expiresAt": "2026-12-02T10:00:00Z",
    },
}
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
NS = "/api/v1/namespaces/{ns}"

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "worker", "labels": {"app": "diff", "tier": "gpu"}},
    "spec": {"containers": [{"name": "main", "image": "registry.example/train:1.0"}]},
}
POD_FIELDS = (
    "kind",
    "metadata.name",
    "metadata.labels",
    "spec.restartPolicy",
    "spec.dnsPolicy",
    "spec.schedulerName",
    "spec.terminationGracePeriodSeconds",
    "spec.tolerations",
    "spec.containers.0.imagePullPolicy",
    "spec.containers.0.terminationMessagePath",
    "spec.containers.0.terminationMessagePolicy",
    "status.phase",
    "status.qosClass",
)


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    return {**POD, "metadata": {**POD["metadata"], "name": name}, "spec": {**POD["spec"], **spec}}


STEPS: tuple[Step, ...] = (
    # --- namespaces
    Step(
        "namespace-create",
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "{ns}"}},
        fields=("metadata.name", "metadata.labels", "spec.finalizers", "status.phase"),
    ),
    Step(
        "default-service-account",
        "GET",
        f"{NS}/serviceaccounts/default",
        until=200,
        fields=("metadata.name",),
    ),
    Step(
        "namespace-again",
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "{ns}"}},
        message=True,
    ),
    Step(
        "pod-in-missing-namespace",
        "POST",
        "/api/v1/namespaces/no-such-namespace/pods",
        _pod("orphan"),
        message=True,
    ),
    # --- pods: create, defaults, dry run, validation
    Step(
        "pod-dry-run",
        "POST",
        f"{NS}/pods",
        _pod("dry"),
        params=(("dryRun", "All"),),
        fields=("metadata.name", "metadata.resourceVersion", "spec.restartPolicy"),
    ),
    Step("pod-dry-run-left-nothing", "GET", f"{NS}/pods/dry", message=True),
    Step("pod-create", "POST", f"{NS}/pods", _pod("worker"), fields=POD_FIELDS),
    Step("pod-get", "GET", f"{NS}/pods/worker", fields=("metadata.name", "spec.containers.#")),
    # --- RuntimeClass admission: the device-plugin checks name the NVIDIA runtime's class
    Step(
        "pod-missing-runtime-class",
        "POST",
        f"{NS}/pods",
        _pod("no-runtime", runtimeClassName="no-such-class"),
        message=True,
    ),
    Step(
        "runtime-class-create",
        "POST",
        "/apis/node.k8s.io/v1/runtimeclasses",
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "{ns}-rc"},
            "handler": "runc",
        },
        fields=("metadata.name", "handler"),
    ),
    Step(
        "pod-with-runtime-class",
        "POST",
        f"{NS}/pods",
        _pod("with-runtime", runtimeClassName="{ns}-rc"),
        fields=("metadata.name", "spec.runtimeClassName"),
    ),
    Step("pod-missing", "GET", f"{NS}/pods/nope", message=True),
    Step("pod-no-containers", "POST", f"{NS}/pods", _pod("empty", containers=[])),
    Step(
        "pod-bad-restart-policy",
        "POST",
        f"{NS}/pods",
        _pod("bad", restartPolicy="Sometimes"),
    ),
    Step(
        "pod-unknown-field-strict",
        "POST",
        f"{NS}/pods",
        _pod("strict", bogus=1),
        params=(("fieldValidation", "Strict"),),
        message=True,
    ),
    Step(
        "pod-bad-field-validation",
        "POST",
        f"{NS}/pods",
        _pod("loose"),
        params=(("fieldValidation", "Loose"),),
    ),
    Step(
        "pod-bad-quantity",
        "POST",
        f"{NS}/pods",
        _pod(
            "quantity",
            containers=[{"name": "main", "image": "x:1", "resources": {"requests": {"cpu": "abc"}}}],
        ),
    ),
    # --- updates and patches
    Step(
        "pod-update-stale",
        "PUT",
        f"{NS}/pods/worker",
        {**_pod("worker"), "metadata": {**POD["metadata"], "resourceVersion": "1"}},
        message=True,
    ),
    Step(
        "pod-merge-patch-labels",
        "PATCH",
        f"{NS}/pods/worker",
        {"metadata": {"labels": {"gpuhealth.io/moved": "true"}}},
        content_type=MERGE,
        fields=("metadata.labels",),
    ),
    Step(
        "pod-json-patch-failed-test",
        "PATCH",
        f"{NS}/pods/worker",
        '[{"op": "test", "path": "/metadata/labels/app", "value": "other"}]',
        content_type=JSON_PATCH,
        message=True,
    ),
    Step(
        "pod-json-patch-missing-path",
        "PATCH",
        f"{NS}/pods/worker",
        '[{"op": "remove", "path": "/metadata/labels/none"}]',
        content_type=JSON_PATCH,
        message=True,
    ),
    Step("pod-json-patch-not-a-list", "PATCH", f"{NS}/pods/worker", '{"op": "add"}', content_type=JSON_PATCH),
    Step(
        "pod-strategic-patch-annotation",
        "PATCH",
        f"{NS}/pods/worker",
        {"metadata": {"annotations": {"gpuhealth.io/checkpoint-requested": "key-1"}}},
        content_type=STRATEGIC,
        fields=("metadata.annotations",),
    ),
    Step(
        "pod-spec-change-forbidden",
        "PATCH",
        f"{NS}/pods/worker",
        {"spec": {"restartPolicy": "Never"}},
        content_type=MERGE,
    ),
    Step(
        "pod-server-side-apply",
        "PATCH",
        f"{NS}/pods/applied",
        yaml.safe_dump(_pod("applied")),
        params=(("fieldManager", "diff"),),
        content_type=APPLY,
        fields=("metadata.name",),
    ),
    # --- lists
    Step("pod-list-selector", "GET", f"{NS}/pods", params=(("labelSelector", "app=diff"),), fields=("kind",)),
    Step("pod-list-bad-selector", "GET", f"{NS}/pods", params=(("labelSelector", "app in (x"),)),
    Step("pod-list-limit", "GET", f"{NS}/pods", params=(("limit", "1"),), fields=("items.#",)),
    # --- eviction (the migrator's call)
    Step(
        "pdb-create",
        "POST",
        "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "diff"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "diff"}}},
        },
        fields=("spec.minAvailable",),
    ),
    Step(
        "eviction-of-missing-pod",
        "POST",
        f"{NS}/pods/nope/eviction",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "nope"}},
        message=True,
    ),
    Step(
        "eviction-dry-run",
        "POST",
        f"{NS}/pods/worker/eviction",
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "worker"},
            "deleteOptions": {"dryRun": ["All"]},
        },
    ),
    # --- deletes with preconditions
    Step(
        "pod-delete-wrong-uid",
        "DELETE",
        f"{NS}/pods/worker",
        {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "not-the-uid"}},
        message=True,
    ),
    Step(
        "pod-delete",
        "DELETE",
        f"{NS}/pods/worker",
        {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "{uid:pod-create}"}},
        fields=("kind", "metadata.name"),
    ),
    # --- the responder's own objects
    Step(
        "lease-create",
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "gpuhealth-responder"},
            "spec": {"holderIdentity": "responder-0", "leaseDurationSeconds": 15},
        },
        fields=("spec.holderIdentity", "spec.leaseDurationSeconds"),
    ),
    Step(
        "lease-delete-wrong-uid",
        "DELETE",
        "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/gpuhealth-responder",
        {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "not-the-uid"}},
        message=True,
    ),
    Step(
        "lease-delete-wrong-version",
        "DELETE",
        "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/gpuhealth-responder",
        {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"resourceVersion": "1"}},
        message=True,
    ),
    Step(
        "lease-bad-duration",
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "bad"},
            "spec": {"holderIdentity": "x", "leaseDurationSeconds": 0},
        },
    ),
    Step(
        "configmap-create",
        "POST",
        f"{NS}/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "breaker"},
            "data": {"state": "closed"},
        },
        fields=("data",),
    ),
    Step(
        "configmap-bad-key",
        "POST",
        f"{NS}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bad"}, "data": {"no/slash": "x"}},
    ),
    Step(
        "event-create",
        "POST",
        "/apis/events.k8s.io/v1/namespaces/{ns}/events",
        {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "diff.1"},
            "eventTime": "2026-12-01T10:00:00.000000Z",
            "reportingController": "gpuhealth.io/responder",
            "reportingInstance": "responder-0",
            "action": "Quarantine",
            "reason": "DeviceQuarantined",
            "type": "Warning",
            "regarding": {"kind": "Pod", "namespace": "{ns}", "name": "worker"},
            "note": "GPU quarantined",
        },
        fields=("reason", "type", "regarding.name"),
    ),
    Step(
        "node-missing-patch",
        "PATCH",
        "/api/v1/nodes/no-such-node",
        {"metadata": {"annotations": {"gpuhealth.io/quarantined-devices": "GPU-1"}}},
        content_type=MERGE,
        message=True,
    ),
    Step("unknown-resource", "GET", "/api/v1/namespaces/{ns}/gpus", message=True),
    Step("unknown-group", "GET", "/apis/gpu.example.com/v1/things"),
    Step("unknown-core-version", "GET", "/api/v2/pods"),
    Step("unknown-group-version", "GET", "/apis/coordination.k8s.io/v9/leases"),
    # --- DeviceTaintRule (DRA quarantine)
    Step(
        "device-taint-rule-create",
        "POST",
        "/apis/resource.k8s.io/v1/devicetaintrules",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": "gpuhealth-{ns}"},
            "spec": {
                "deviceSelector": {"driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"},
                "taint": {"key": "gpuhealth.io/quarantine", "value": "FatalXid", "effect": "NoSchedule"},
            },
        },
        fields=("spec.deviceSelector", "spec.taint.key", "spec.taint.effect"),
    ),
    Step(
        "device-taint-rule-bad-effect",
        "POST",
        "/apis/resource.k8s.io/v1/devicetaintrules",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": "bad-{ns}"},
            "spec": {
                "deviceSelector": {"driver": "gpu.example.com"},
                "taint": {"key": "gpuhealth.io/quarantine", "effect": "Sometimes"},
            },
        },
    ),
    Step(
        "device-taint-rule-delete",
        "DELETE",
        "/apis/resource.k8s.io/v1/devicetaintrules/gpuhealth-{ns}",
        fields=("kind",),
    ),
    # --- the CRD and a DeviceQuarantine (the responder's record)
    Step(
        "crd-create",
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        CRD,
        fields=("spec.names", "spec.scope"),
    ),
    # Served once the CRD is established: what a client that created it waits for.
    Step(
        "quarantine-create",
        "POST",
        QUARANTINES,
        QUARANTINE,
        until=201,
        fields=("spec", "metadata.generation"),
    ),
    Step(
        "quarantine-bad-enum",
        "POST",
        QUARANTINES,
        {**QUARANTINE, "metadata": {"name": "{ns}-bad"}, "spec": {**QUARANTINE["spec"], "path": "nvlink"}},
        message=True,
    ),
    Step(
        "quarantine-missing-required",
        "POST",
        QUARANTINES,
        {**QUARANTINE, "metadata": {"name": "{ns}-bare"}, "spec": {"node": "diff-node"}},
    ),
    Step(
        "quarantine-unknown-field-strict",
        "POST",
        QUARANTINES,
        {**QUARANTINE, "metadata": {"name": "{ns}-strict"}, "spec": {**QUARANTINE["spec"], "colour": "red"}},
        params=(("fieldValidation", "Strict"),),
        message=True,
    ),
    Step(
        "quarantine-status-patch",
        "PATCH",
        QUARANTINES + "/{ns}-gpu-1/status",
        {"status": {"phase": "Quarantined"}},
        content_type=MERGE,
        fields=("status.phase", "metadata.generation", "spec.reason"),
    ),
    Step(
        "quarantine-spec-through-status-ignored",
        "PATCH",
        QUARANTINES + "/{ns}-gpu-1/status",
        {"spec": {"reason": "Changed"}},
        content_type=MERGE,
        fields=("spec.reason",),
    ),
    Step(
        "quarantine-table",
        "GET",
        QUARANTINES,
        accept=TABLE,
        fields=("kind", *(f"columnDefinitions.{i}.name" for i in range(6)), "rows.#"),
    ),
    Step(
        "pod-table",
        "GET",
        f"{NS}/pods",
        accept=TABLE,
        fields=("kind", *(f"columnDefinitions.{i}.name" for i in range(9))),
    ),
    # --- a node, as a kubelet registers one
    Step(
        "node-create",
        "POST",
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "{ns}-node", "labels": {"kubernetes.io/hostname": "{ns}-node"}},
            "status": {
                "capacity": {"nvidia.com/gpu": "8", "cpu": "64"},
                "allocatable": {"nvidia.com/gpu": "8"},
            },
        },
        fields=("metadata.labels", "status.capacity", "status.allocatable", "spec.taints"),
    ),
    Step(
        "node-annotate",
        "PATCH",
        "/api/v1/nodes/{ns}-node",
        {"metadata": {"annotations": {"gpuhealth.io/quarantined-devices": "GPU-1"}}},
        content_type=MERGE,
        # Ours only: kube-controller-manager's TTL controller adds `node.alpha.kubernetes.io/ttl`
        # to a new Node in its own time, before or after this step.
        fields=("metadata.annotations[gpuhealth.io/quarantined-devices]",),
    ),
    Step("node-delete", "DELETE", "/api/v1/nodes/{ns}-node", fields=("kind",)),
    Step("configmap-delete", "DELETE", f"{NS}/configmaps/breaker", fields=("kind", "details.kind")),
    Step(
        "lease-delete",
        "DELETE",
        "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/gpuhealth-responder",
        fields=("kind", "details.kind", "details.group"),
    ),
    Step(
        "quarantine-delete",
        "DELETE",
        QUARANTINES + "/{ns}-gpu-1",
        fields=("kind", "details.kind", "details.group"),
    ),
    Step(
        "crd-delete",
        "DELETE",
        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/devicequarantines.{GROUP}",
    ),
    Step(
        "namespace-delete",
        "DELETE",
        "/api/v1/namespaces/{ns}",
        fields=("kind", "status.phase", "spec.finalizers"),
    ),
)

KNOWN: dict[str, str] = {
    "pod-server-side-apply": "the simulated apiserver refuses server-side apply (415); `kubectl apply "
    "--server-side` is proven on the real control plane (test_controlplane_manifests.py)",
    "node-create": "kube-apiserver's TaintNodesByCondition admission adds "
    "node.kubernetes.io/not-ready:NoSchedule to a new Node (the node lifecycle controller lifts it "
    "once Ready); the simulated apiserver adds no taint",
}
"""Divergences kept on purpose: step name -> why (the same list is in docs/simulator.md)."""


@pytest.fixture(scope="module")
def answers(plane: ControlPlane) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    with running_cluster("quiet") as sim:
        real_plane = Plane("real", api_client(str(plane.kubeconfig_path)), "diff-ns")
        sim_plane = Plane("simulated", api_client(str(sim.kubeconfig_path)), "diff-ns")
        yield run(real_plane, STEPS), run(sim_plane, STEPS)


def test_every_step_answers_alike_or_is_a_listed_divergence(
    answers: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    real, simulated = answers
    diverged = differences(real, simulated)
    report = "\n".join(f"  {name}: {line}" for name, line in sorted(diverged.items()))
    new = sorted(set(diverged) - set(KNOWN))
    gone = sorted(set(KNOWN) - set(diverged))
    assert not new, f"new divergences from the real apiserver (fix them or list them):\n{report}"
    assert not gone, f"listed divergences that no longer diverge (remove them from KNOWN and the doc): {gone}"
