"""The admission policy on the real apiserver (1.37): a DeviceQuarantine's status is the responder's.

Aspects: with the enforcing overlay installed, the responder's ServiceAccount updates a record's
status; the cluster admin cannot, by update or by merge patch (403 from the
ValidatingAdmissionPolicy, with its message naming who may write and what to ask for instead);
a person bound to the shipped gpuhealth-operator role writes a release request into the spec but
not the status (RBAC refuses it), and even granted status by some other role the policy still
refuses it. The record is unchanged by every refused write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.errors import ApiError, Forbidden
from gpuhealth.kube.resources import Resource
from gpuhealth.testing.loopback import wait_until
from responder.records import QUARANTINES, Phase, to_object
from simulator.controlplane import ControlPlane
from tests.deploy.manifests import NAMESPACE
from tests.support.controlplane import (
    SERVICE_ACCOUNT,
    admin,
    as_service_account,
    dra_quarantine,
    namespace_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

CLUSTER_ROLE = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", namespaced=False)
CLUSTER_ROLE_BINDING = Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", namespaced=False)
ONCALL_NS = "oncall"
POLICY_MESSAGE = "DeviceQuarantine status is written only by the gpuhealth responder"


def _bind(client: KubeClient, name: str, role: str, account: str) -> None:
    client.create(
        CLUSTER_ROLE_BINDING,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ONCALL_NS}],
        },
    )


@pytest.fixture
def clients(installed: ControlPlane) -> Iterator[tuple[KubeClient, KubeClient, KubeClient]]:
    """(admin, the responder's account, an on-call account bound to gpuhealth-operator)."""
    root = admin(installed)
    namespace_ready(root, ONCALL_NS)
    root.create(
        SERVICE_ACCOUNT,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "alice"}},
        namespace=ONCALL_NS,
    )
    _bind(root, "gpuhealth-operators-alice", "gpuhealth-operator", "alice")
    responder = as_service_account(installed, root, NAMESPACE, "gpuhealth-responder")
    operator = as_service_account(installed, root, ONCALL_NS, "alice")
    try:
        yield root, responder, operator
    finally:
        for c in (operator, responder, root):
            c.close()


def _refusal(write: Callable[[], object]) -> ApiError | None:
    try:
        write()
    except ApiError as exc:
        return exc
    return None


def _refused_by_policy(error: ApiError | None, who: str) -> None:
    assert error is not None, f"{who} wrote a record's status"
    assert error.status == 403, error
    assert POLICY_MESSAGE in error.message, error.message
    assert f"not by {who}: ask for a release with `gpuhealth quarantine release`" in error.message


def test_only_the_responders_account_writes_a_records_status(
    clients: tuple[KubeClient, KubeClient, KubeClient],
) -> None:
    root, responder, operator = clients
    record = dra_quarantine("admission-0", "gpu.nvidia.com", "gpu-1")
    obj = to_object(record)
    status = obj.pop("status")
    created = root.create(QUARANTINES, obj)  # creating is RBAC's business, not the policy's
    name = created["metadata"]["name"]

    # The responder (its role updates status; it never patches).
    quarantined = {**status, "phase": Phase.QUARANTINED.value, "enforced": f"DeviceTaintRule/{name}"}
    written = responder.update(QUARANTINES, {**created, "status": quarantined}, subresource="status")
    assert written["status"]["phase"] == "Quarantined"
    failed = {**written["status"], "failures": 1}
    patched = responder.update(QUARANTINES, {**written, "status": failed}, subresource="status")
    assert patched["status"]["failures"] == 1

    # The admin: refused by the policy, by update and by patch (a PATCH is an UPDATE to
    # admission). A policy takes effect once the apiserver has loaded it: wait for that on a
    # dry run (admitted like a real write, stored nowhere), then write for real.
    admin_user = root.create(
        Resource("authentication.k8s.io", "v1", "selfsubjectreviews", namespaced=False),
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )["status"]["userInfo"]["username"]
    cleared = {**patched["status"], "failures": 0, "phase": "Released"}

    def admin_update(dry_run: bool) -> object:
        current = root.get(QUARANTINES, name)
        return root.update(QUARANTINES, {**current, "status": cleared}, subresource="status", dry_run=dry_run)

    wait_until("the policy loaded", lambda: _refusal(lambda: admin_update(True)), timeout=30)
    _refused_by_policy(_refusal(lambda: admin_update(False)), admin_user)
    _refused_by_policy(
        _refusal(lambda: root.patch(QUARANTINES, name, {"status": {"failures": 0}}, subresource="status")),
        admin_user,
    )

    # The operator role: the spec (a release request) yes, the status no (RBAC refuses it).
    request = {"actor": "person/alice", "reason": "card reseated", "requestedAt": "2027-01-15T08:00:00Z"}
    current = operator.get(QUARANTINES, name)
    asked = operator.update(QUARANTINES, {**current, "spec": {**current["spec"], "releaseRequest": request}})
    assert asked["spec"]["releaseRequest"] == request
    with pytest.raises(Forbidden) as rbac_error:
        operator.update(QUARANTINES, {**asked, "status": cleared}, subresource="status")
    assert POLICY_MESSAGE not in rbac_error.value.message  # RBAC's answer, before admission

    # Granted status by some other role, the operator is still refused: by the policy.
    root.create(
        CLUSTER_ROLE,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "too-generous"},
            "rules": [
                {
                    "apiGroups": ["gpuhealth.io"],
                    "resources": ["devicequarantines/status"],
                    "verbs": ["update", "patch"],
                }
            ],
        },
    )
    _bind(root, "too-generous-alice", "too-generous", "alice")
    operator_user = f"system:serviceaccount:{ONCALL_NS}:alice"

    def operator_update() -> object:
        current = operator.get(QUARANTINES, name)
        return operator.update(QUARANTINES, {**current, "status": cleared}, subresource="status")

    # The authorizer sees a new binding within moments: wait for the policy's answer, not RBAC's.
    wait_until(
        "the generous binding seen by the authorizer",
        lambda: POLICY_MESSAGE in (getattr(_refusal(operator_update), "message", "") or ""),
        timeout=30,
    )
    _refused_by_policy(_refusal(operator_update), operator_user)

    final = root.get(QUARANTINES, name)
    assert final["status"]["phase"] == "Quarantined" and final["status"]["failures"] == 1
