"""The RBAC model and the audit attributes the RBAC test stands on.

Aspects: the simulated apiserver's audit derives (verb, group, resource, subresource,
namespace, name) from a request as the apiserver does (watch vs list vs get, deletecollection,
subresources, a Namespace object itself, discovery left out); a RoleBinding grants only in its
namespace, a ClusterRoleBinding everywhere, to the bound account only; a grant no call uses is
reported, a call no grant allows is reported; a missing role and a wildcard are refused; the
shipped `gpuhealth-operator` role, bound to a person, grants the calls of `quarantine release`
and `extend` (get, update of the spec) and never a write of a record's status.
"""

from __future__ import annotations

from typing import Any

import pytest

from simulator.apiserver.audit import request_attributes
from tests.deploy.manifests import build, find
from tests.deploy.rbac import ALL_NAMESPACES, Call, grants, unauthorized, unused, user


@pytest.mark.parametrize(
    "method,path,query,expected",
    [
        ("GET", "/api/v1/pods", {}, ("list", "", "pods", "", "", "")),
        ("GET", "/api/v1/pods", {"watch": "true"}, ("watch", "", "pods", "", "", "")),
        ("GET", "/api/v1/namespaces/a/pods/p", {}, ("get", "", "pods", "", "a", "p")),
        ("POST", "/api/v1/namespaces/a/pods/p/eviction", {}, ("create", "", "pods", "eviction", "a", "p")),
        (
            "PUT",
            "/apis/gpuhealth.io/v1alpha1/devicequarantines/d/status",
            {},
            ("update", "gpuhealth.io", "devicequarantines", "status", "", "d"),
        ),
        ("PATCH", "/api/v1/nodes/n", {}, ("patch", "", "nodes", "", "", "n")),
        (
            "DELETE",
            "/apis/batch/v1/namespaces/a/jobs",
            {},
            ("deletecollection", "batch", "jobs", "", "a", ""),
        ),
        ("GET", "/api/v1/namespaces/a", {}, ("get", "", "namespaces", "", "", "a")),
        ("PUT", "/api/v1/namespaces/a/finalize", {}, ("update", "", "namespaces", "finalize", "", "a")),
        ("GET", "/apis/resource.k8s.io/v1", {}, None),
        ("GET", "/apis/resource.k8s.io", {}, None),
        ("GET", "/api", {}, None),
        ("GET", "/version", {}, None),
    ],
)
def test_audit_attributes_match_the_apiservers(
    method: str, path: str, query: dict[str, str], expected: Any
) -> None:
    assert request_attributes(method, path, query) == expected


SA = user("ns", "svc")


def _objects(
    rules: list[dict[str, Any]], *, cluster: bool, binding_ns: str = "ns", subject: str = "svc"
) -> list[dict[str, Any]]:
    role_kind = "ClusterRole" if cluster else "Role"
    role: dict[str, Any] = {"kind": role_kind, "metadata": {"name": "r"}, "rules": rules}
    binding: dict[str, Any] = {
        "kind": "ClusterRoleBinding" if cluster else "RoleBinding",
        "metadata": {"name": "b"},
        "roleRef": {"kind": role_kind, "name": "r", "apiGroup": "rbac.authorization.k8s.io"},
        "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": "ns"}],
    }
    if not cluster:
        role["metadata"]["namespace"] = binding["metadata"]["namespace"] = binding_ns
    return [role, binding]


RULE = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "update"]}


def test_a_role_binding_grants_in_its_namespace_only() -> None:
    held = grants(_objects([RULE], cluster=False, binding_ns="home"), SA)
    assert {g.scope for g in held} == {"home"}
    inside, outside = Call("get", "", "configmaps", "home"), Call("get", "", "configmaps", "elsewhere")
    assert unauthorized([inside, outside], held) == [outside]
    assert [str(g.verb) for g in unused([inside], held)] == ["update"]


def test_a_cluster_role_binding_grants_everywhere_to_the_bound_account_only() -> None:
    held = grants(_objects([RULE], cluster=True), SA)
    assert {g.scope for g in held} == {ALL_NAMESPACES}
    assert (
        unauthorized([Call("update", "", "configmaps", "x"), Call("get", "", "configmaps", "")], held) == []
    )
    assert unauthorized([Call("list", "", "configmaps", "x")], held) == [Call("list", "", "configmaps", "x")]
    assert grants(_objects([RULE], cluster=True, subject="other"), SA) == []


def test_subresources_are_their_own_resource() -> None:
    held = grants(
        _objects([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}], cluster=True), SA
    )
    eviction = Call.from_audit(
        {"verb": "create", "group": "", "resource": "pods", "subresource": "eviction", "namespace": "a"}
    )
    assert unauthorized([eviction], held) == [eviction]


def test_a_missing_role_and_a_wildcard_are_refused() -> None:
    objects = _objects([RULE], cluster=True)
    with pytest.raises(AssertionError, match="missing"):
        grants(objects[1:], SA)
    with pytest.raises(AssertionError, match="wildcard"):
        grants(_objects([{"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]}], cluster=True), SA)


def _operator_grants(person: str) -> list[Any]:
    """The shipped gpuhealth-operator role bound to `person`, as an admin binds it. Its ConfigMap
    rules name the breaker's ConfigMap (resourceNames, not modelled here) and are left out: what
    this model judges is the records."""
    role = find(build("enforcing"), "ClusterRole", "gpuhealth-operator")
    role = {**role, "rules": [r for r in role["rules"] if not r.get("resourceNames")]}
    binding = {
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpuhealth-operators"},
        "roleRef": {
            "kind": "ClusterRole",
            "name": "gpuhealth-operator",
            "apiGroup": "rbac.authorization.k8s.io",
        },
        "subjects": [{"kind": "User", "name": person, "apiGroup": "rbac.authorization.k8s.io"}],
    }
    return grants([role, binding], person)


def test_the_operator_role_writes_the_spec_and_never_the_status() -> None:
    held = _operator_grants("alice")
    spec = [Call(verb, "gpuhealth.io", "devicequarantines", "") for verb in ("get", "list", "update")]
    assert unauthorized(spec, held) == []
    status = [
        Call(verb, "gpuhealth.io", "devicequarantines/status", "") for verb in ("update", "patch", "get")
    ]
    assert unauthorized(status, held) == sorted(status)
    assert unauthorized([Call("patch", "gpuhealth.io", "devicequarantines", "")], held) != []
    # Unbound, the role grants nobody anything.
    role = find(build("enforcing"), "ClusterRole", "gpuhealth-operator")
    assert grants([role], "alice") == []
