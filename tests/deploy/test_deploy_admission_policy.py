"""The admission policies: a DeviceQuarantine's status is the responder's alone, and of a pod's
status the responder writes only its `gpuhealth.io/serving` condition.

Aspects: every overlay ships the ValidatingAdmissionPolicy and its binding (Deny, failing
closed); it matches exactly the UPDATE of `devicequarantines/status` in gpuhealth.io (a PATCH
reaches admission as UPDATE; creating or editing the spec is not its business, RBAC's is); its
one validation compares `request.userInfo.username` with the user of the responder's own
ServiceAccount as the base manifests name it (account and namespace, and the Deployment runs
as it), evaluated over sample requests: the responder is admitted, an admin, the operator role's
user, another gpuhealth account and a lookalike name are refused, with a message naming who may
write and what to do instead. No CEL evaluator ships in our dependencies: the expression's form
is held to one comparison here and the real apiserver runs it in
tests/controlplane/test_controlplane_admission.py.

The pod-status policy, bound the same way in every overlay, matches exactly the UPDATE of
`pods/status` in the core group, and only for the responder's user (a match condition, the same
comparison); each of its validations refuses with Forbidden and a message naming the one thing
the responder writes. Its CEL (status and conditions compared with the old object) runs on the
real apiserver in tests/controlplane/test_controlplane_pod_status.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.deploy.manifests import NAMESPACE, OVERLAYS, build, find
from tests.deploy.rbac import user

POLICY = "gpuhealth-devicequarantine-status"
POD_STATUS_POLICY = "gpuhealth-pod-status"
_EQUALS = re.compile(r"^request\.userInfo\.username == '([^'\\]+)'$")
_MESSAGE = re.compile(r"^'((?:[^'\\])*)' \+ request\.userInfo\.username\s*\+ '((?:[^'\\])*)'$")


def _policy(overlay: str = "enforcing", name: str = POLICY) -> tuple[dict[str, Any], dict[str, Any]]:
    objects = build(overlay)
    return (
        find(objects, "ValidatingAdmissionPolicy", name),
        find(objects, "ValidatingAdmissionPolicyBinding", name),
    )


def _responder_user() -> str:
    """The responder's user as the base manifests make it: its ServiceAccount, which the
    Deployment runs as."""
    objects = build("enforcing")
    account = find(objects, "ServiceAccount", "gpuhealth-responder")
    deployment = find(objects, "Deployment", "gpuhealth-responder")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert account["metadata"]["namespace"] == deployment["metadata"]["namespace"] == NAMESPACE
    return user(account["metadata"]["namespace"], account["metadata"]["name"])


def admitted(policy: dict[str, Any], request: dict[str, Any]) -> tuple[bool, str]:
    """(admitted, message) for `request`, evaluating the policy's match rules and its one
    validation (held to the form `request.userInfo.username == '<user>'`)."""
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    resource = request["resource"]
    if request["subResource"]:
        resource += f"/{request['subResource']}"
    matched = any(
        request["group"] in r["apiGroups"]
        and request["operation"] in r["operations"]
        and resource in r["resources"]
        for r in rules
    )
    if not matched:
        return True, ""
    [validation] = policy["spec"]["validations"]
    expected = _EQUALS.match(validation["expression"].strip())
    assert expected is not None, f"unexpected expression form: {validation['expression']!r}"
    if request["userInfo"]["username"] == expected.group(1):
        return True, ""
    parts = _MESSAGE.match(" ".join(validation["messageExpression"].split()))
    assert parts is not None, f"unexpected message form: {validation['messageExpression']!r}"
    return False, parts.group(1) + request["userInfo"]["username"] + parts.group(2)


def _request(
    username: str, *, operation: str = "UPDATE", sub: str = "status", resource: str = "devicequarantines"
) -> dict[str, Any]:
    return {
        "operation": operation,
        "group": "gpuhealth.io",
        "resource": resource,
        "subResource": sub,
        "userInfo": {"username": username},
    }


@pytest.mark.parametrize("name", [POLICY, POD_STATUS_POLICY])
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_binds_the_policy_to_deny_failing_closed(overlay: str, name: str) -> None:
    policy, binding = _policy(overlay, name)
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["policyName"] == name
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # every object of the kind, in every namespace


def test_it_matches_only_status_updates_of_devicequarantines() -> None:
    policy, _ = _policy()
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule == {
        "apiGroups": ["gpuhealth.io"],
        "apiVersions": ["*"],
        "operations": ["UPDATE"],
        "resources": ["devicequarantines/status"],
    }


def test_only_the_responders_account_may_write_status() -> None:
    policy, _ = _policy()
    responder = _responder_user()
    assert responder == "system:serviceaccount:gpuhealth-system:gpuhealth-responder"
    assert admitted(policy, _request(responder)) == (True, "")
    for someone in (
        "kubernetes-admin",
        "alice",  # bound to gpuhealth-operator
        user(NAMESPACE, "gpuhealth-exporter"),
        user("other", "gpuhealth-responder"),  # the same name in another namespace
        responder + "-2",
        "system:admin",
    ):
        allowed, message = admitted(policy, _request(someone))
        assert not allowed, someone
        assert message.startswith("DeviceQuarantine status is written only by the gpuhealth responder")
        assert f"not by {someone}: ask for a release with `gpuhealth quarantine release`" in message


def test_spec_writes_and_other_resources_are_left_to_rbac() -> None:
    policy, _ = _policy()
    for request in (
        _request("alice", sub=""),  # a release request, an extension: the spec
        _request("alice", operation="CREATE", sub=""),
        _request("alice", operation="DELETE", sub=""),
        _request("alice", resource="pods"),
    ):
        assert admitted(policy, request) == (True, ""), request


def test_the_pod_status_policy_matches_the_responders_pod_status_writes_only() -> None:
    policy, _ = _policy(name=POD_STATUS_POLICY)
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule == {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["UPDATE"],
        "resources": ["pods/status"],
    }
    [condition] = policy["spec"]["matchConditions"]
    expected = _EQUALS.match(condition["expression"].strip())
    assert expected is not None, f"unexpected match condition: {condition['expression']!r}"
    assert expected.group(1) == _responder_user()
    validations = policy["spec"]["validations"]
    assert len(validations) == 4
    for validation in validations:
        assert validation["reason"] == "Forbidden"
        assert validation["message"].startswith(
            "the gpuhealth responder writes only its gpuhealth.io/serving pod condition"
        )
