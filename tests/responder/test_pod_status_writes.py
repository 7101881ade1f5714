"""What gpuhealth writes in a pod's status: its own `gpuhealth.io/serving` condition, and nothing
else (no container status, no `allocatedResourcesStatus`: the kubelet's record of device health,
which gpuhealth reads).

Aspects, together the proof for every gpuhealth identity:
- the code: every request the product (the wheel's packages) makes on a status subresource is
  found by walking the source; the DeviceQuarantine's own status aside, there is exactly one, in
  `TenantPods.stop_requests` (a write on the pod itself cannot reach its status: the apiserver
  keeps the old status on a pod update);
- that one write is a merge patch of `status.conditions` alone, conditional on the listed
  resourceVersion, that leaves every other condition as it was listed and sets the serving
  condition False: containerStatuses, their `allocatedResourcesStatus` and the phase are absent
  from it, so the apiserver keeps them;
- the manifests: of every Role and ClusterRole under `deploy/` (the base, the overlays and every
  component), only the responder's ClusterRole grants `pods/status`, with the one verb `patch`,
  bound to the responder's ServiceAccount alone, and none grants a wildcard; for that account the
  ValidatingAdmissionPolicy `gpuhealth-pod-status` refuses anything more, which the real
  apiserver proves (tests/controlplane/test_controlplane_pod_status.py).
The flows' own write log: the simulated cluster's audit log records who called what, never a
body; the real apiserver's keeps the body of every `pods/status` write, and
tests/controlplane/test_controlplane_eviction.py reads it after the real migrator moved a job as
the responder. The checks here hold for every path, not only those a flow walks.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any, cast

from gpuhealth.clock import ManualClock
from gpuhealth.kube.api import Api
from gpuhealth.kube.resources import POD, Resource
from responder.migrate.plan import SERVING, StopRequests
from responder.migrate.tenant_pods import TenantPods
from responder.records import Migration
from tests.deploy.manifests import DEPLOY, NAMESPACE, build, load_all
from tests.deploy.rbac import user

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("gpuhealth", "gpuhealth_cli", "exporter", "responder", "rules", "kubectl_gpuhealth", "backtest")
"""The wheel's packages (pyproject.toml): what runs as a gpuhealth identity."""
OTHER_SUBRESOURCES = frozenset({"eviction", "token"})
RESPONDER = user(NAMESPACE, "gpuhealth-responder")


class _StatusWrites(ast.NodeVisitor):
    """The calls of one module that pass `subresource=` something other than a literal
    non-status subresource (the client's own pass-through, `subresource=subresource`, aside), by
    the innermost function around them, with the resource argument's source."""

    def __init__(self, where: str) -> None:
        self.where = [where]
        self.found: dict[str, str] = {}

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.where.append(node.name)
        self.generic_visit(node)
        self.where.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        for keyword in node.keywords:
            value = keyword.value
            if keyword.arg != "subresource":
                continue
            if isinstance(value, ast.Constant) and value.value in OTHER_SUBRESOURCES | {None}:
                continue
            if isinstance(value, ast.Name) and value.id == "subresource":
                continue
            where = f"{self.where[0]}:{self.where[-1]}"
            assert where not in self.found, f"{where}: two status writes"
            self.found[where] = ast.unparse(node.args[0]) if node.args else "?"
        self.generic_visit(node)


def _status_writes() -> dict[str, str]:
    found: dict[str, str] = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            visitor = _StatusWrites(str(path.relative_to(ROOT)))
            visitor.visit(ast.parse(path.read_text(), str(path)))
            found.update(visitor.found)
    return found


def test_the_only_pod_status_write_is_the_serving_condition() -> None:
    writes = _status_writes()
    assert writes == {
        "responder/webhook/recorder.py:_write": "QUARANTINES",
        "responder/reconcile/reconciler.py:_write": "QUARANTINES",
        "responder/migrate/tenant_pods.py:stop_requests": "POD",
    }


class _Recorder:
    """The one call `stop_requests` makes, kept."""

    def __init__(self) -> None:
        self.calls: list[tuple[Resource, str, dict[str, Any], dict[str, Any]]] = []

    def patch(self, resource: Resource, name: str, patch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        self.calls.append((resource, name, copy.deepcopy(patch), kwargs))
        return {}


def _kubelet_status() -> dict[str, Any]:
    stamp = "2027-01-15T07:00:00Z"
    return {
        "phase": "Running",
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": stamp},
            {"type": SERVING, "status": "True", "lastTransitionTime": stamp},  # the workload's
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": stamp},
        ],
        "containerStatuses": [
            {
                "name": "work",
                "ready": True,
                "allocatedResourcesStatus": [
                    {"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-4a1c", "health": "Healthy"}]}
                ],
            }
        ],
    }


def test_the_write_carries_the_serving_condition_and_leaves_the_rest_as_listed() -> None:
    recorder = _Recorder()
    pods = TenantPods(cast(Api, recorder), ManualClock(1_800_000_000.0))
    pod = {
        "metadata": {"name": "work-0", "namespace": "ml", "resourceVersion": "41"},
        "status": _kubelet_status(),
    }
    entry = Migration("ml", "Job/work", "uid-work", "key-1")
    _, done = pods.stop_requests(StopRequests("ml", "work-0", "key-1"), entry, copy.deepcopy(pod), 0.0)
    assert done
    [(resource, name, patch, options)] = recorder.calls
    assert (resource, name) == (POD, "work-0")
    assert options == {"namespace": "ml", "subresource": "status"}  # no patch_type: a merge patch
    assert patch.keys() == {"metadata", "status"}
    assert patch["metadata"] == {"resourceVersion": "41"}
    assert patch["status"].keys() == {"conditions"}  # the kubelet's fields are kept by the apiserver
    *others, serving = patch["status"]["conditions"]
    assert others == [c for c in pod["status"]["conditions"] if c["type"] != SERVING]
    assert serving["type"] == SERVING and serving["status"] == "False"
    assert serving["reason"] == "GPUQuarantined" and "(key-1)" in serving["message"]


def _roles() -> list[tuple[str, dict[str, Any]]]:
    """(file, role) for every Role and ClusterRole in a YAML file under deploy/."""
    found = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for obj in load_all(path.read_text()):
            if isinstance(obj, dict) and obj.get("kind") in ("Role", "ClusterRole"):
                found.append((str(path.relative_to(ROOT)), obj))
    return found


def test_only_the_responder_is_granted_pod_status_and_only_to_patch() -> None:
    roles = _roles()
    assert len(roles) > 4, "the walk found the manifests' roles"
    granted = []
    for where, role in roles:
        for rule in role.get("rules") or ():
            resources = rule.get("resources") or ()
            assert "*" not in resources and "pods/*" not in resources, f"{where}: a wildcard resource"
            if "pods/status" in resources:
                granted.append((role["kind"], role["metadata"]["name"], tuple(rule["verbs"])))
    assert granted == [("ClusterRole", "gpuhealth-responder", ("patch",))]
    bound = {
        user(s["namespace"], s["name"]) if s["kind"] == "ServiceAccount" else s["name"]
        for o in build("enforcing")
        if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and o["roleRef"]["name"] == "gpuhealth-responder"
        for s in o["subjects"]
    }
    assert bound == {RESPONDER}
