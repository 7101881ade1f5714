"""The pod-status admission policy on the real apiserver (1.37 and 1.36): the responder writes only its
`gpuhealth.io/serving` condition.

Aspects: with the enforcing overlay installed (the ValidatingAdmissionPolicy
`gpuhealth-pod-status` and its binding among its objects, accepted by the apiserver with its CEL
compiled), a pod whose status the kubelet wrote (Running, Ready, one container with a Healthy
`allocatedResourcesStatus`) is written through `pods/status` as the responder's ServiceAccount
(a token from the TokenRequest API): the product's own write (`TenantPods.stop_requests`) adds
the condition False and, again under a new key, updates it, the other conditions unchanged.
Every other change by that account is refused with 403 and the policy's message, the pod left
as it was: another condition, a container status, `allocatedResourcesStatus`, the phase, the
serving condition set True or removed, a label. The same writes by another user (the kubelet's,
here the admin's) are admitted: the policy matches the responder alone.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from gpuhealth.kube.api import PatchType
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.errors import ApiError
from gpuhealth.kube.resources import POD
from gpuhealth.testing.loopback import wait_until
from responder.migrate.plan import SERVING, StopRequests
from responder.migrate.tenant_pods import TenantPods
from responder.records import Migration
from simulator.controlplane import ControlPlane
from tests.deploy.manifests import NAMESPACE
from tests.support.controlplane import IMAGE, admin, as_service_account, namespace_ready, run_as_kubelet

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

TENANT = "tenant-status"
GPU = "nvidia.com/gpu"
POLICY_MESSAGE = "the gpuhealth responder writes only its gpuhealth.io/serving pod condition"

OTHER_STATUS = "refused a change to the pod's status other than its conditions"
OTHER_CONDITION = "refused a change to another pod condition"

# Each a JSON patch of the kubelet-written pod (`_kubelet_pod`) that the responder may not write,
# and the words of the policy's validation that refuses it.
REFUSED: dict[str, tuple[list[dict[str, Any]], str]] = {
    "another condition": (
        [{"op": "replace", "path": "/status/conditions/3/status", "value": "False"}],
        OTHER_CONDITION,
    ),
    "a container status": (
        [{"op": "replace", "path": "/status/containerStatuses/0/ready", "value": False}],
        OTHER_STATUS,
    ),
    "allocatedResourcesStatus": (
        [
            {
                "op": "replace",
                "path": "/status/containerStatuses/0/allocatedResourcesStatus/0/resources/0/health",
                "value": "Unhealthy",
            }
        ],
        OTHER_STATUS,
    ),
    "the phase": ([{"op": "replace", "path": "/status/phase", "value": "Failed"}], OTHER_STATUS),
    "the serving condition True": (
        [{"op": "add", "path": "/status/conditions/-", "value": {"type": SERVING, "status": "True"}}],
        "and only to False: refused setting it otherwise or removing it",
    ),
    "a label": (
        [{"op": "add", "path": "/metadata/labels", "value": {"moved": "yes"}}],
        "refused a change to the pod's labels, annotations or finalizers through pods/status",
    ),
}


def _kubelet_pod(root: KubeClient, name: str) -> dict[str, Any]:
    """A pod bound to a node, its status as the kubelet writes it once the container runs, with
    the device plugin's GPU reported Healthy."""
    root.create(
        POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": TENANT},
            "spec": {
                "nodeName": "node-status",
                "automountServiceAccountToken": False,
                "readinessGates": [{"conditionType": SERVING}],
                "containers": [{"name": "work", "image": IMAGE, "resources": {"limits": {GPU: "1"}}}],
            },
        },
        namespace=TENANT,
    )
    running = run_as_kubelet(root, root.get(POD, name, namespace=TENANT))
    health = [{"name": GPU, "resources": [{"resourceID": "GPU-0a1b", "health": "Healthy"}]}]
    patch = [{"op": "add", "path": "/status/containerStatuses/0/allocatedResourcesStatus", "value": health}]
    written = root.patch(POD, name, patch, namespace=TENANT, patch_type=PatchType.JSON, subresource="status")
    assert written["status"]["conditions"][3]["type"] == "Ready", running["status"]["conditions"]
    assert written["status"]["containerStatuses"][0]["allocatedResourcesStatus"] == health
    return written


@pytest.fixture(scope="module", params=["installed", "installed_136"])
def clients(request: pytest.FixtureRequest) -> Iterator[tuple[KubeClient, KubeClient]]:
    """(admin, the responder's account), on 1.37 and on 1.36."""
    plane: ControlPlane = request.getfixturevalue(request.param)
    root = admin(plane)
    namespace_ready(root, TENANT)
    responder = as_service_account(plane, root, NAMESPACE, "gpuhealth-responder")
    try:
        yield root, responder
    finally:
        responder.close()
        root.close()


def _refusal(
    client: KubeClient, name: str, patch: list[dict[str, Any]], *, dry_run: bool = False
) -> ApiError | None:
    try:
        client.patch(
            POD,
            name,
            patch,
            namespace=TENANT,
            patch_type=PatchType.JSON,
            subresource="status",
            dry_run=dry_run,
        )
    except ApiError as exc:
        return exc
    return None


@pytest.fixture(scope="module")
def loaded(clients: tuple[KubeClient, KubeClient]) -> None:
    """The policy takes effect once the apiserver has loaded it: wait for a refusal on a dry run
    (admitted like a real write, stored nowhere)."""
    root, responder = clients
    _kubelet_pod(root, "probe")
    wait_until(
        "the pod-status policy loaded",
        lambda: _refusal(responder, "probe", REFUSED["the phase"][0], dry_run=True),
        timeout=30,
    )


def _stop(root: KubeClient, responder: KubeClient, name: str, key: str) -> bool:
    """The product's write, as the responder's account, of the pod as listed (its role lists
    pods; it has no `get`)."""
    pods = TenantPods(responder, ManualClock(1_800_000_000.0))
    pod = root.get(POD, name, namespace=TENANT)
    _, done = pods.stop_requests(
        StopRequests(TENANT, name, key), Migration(TENANT, "Job/work", "uid-work", key), pod, 0.0
    )
    return done


def _without_serving(pod: dict[str, Any]) -> dict[str, Any]:
    status = copy.deepcopy(pod["status"])
    status["conditions"] = [c for c in status["conditions"] if c["type"] != SERVING]
    return status


def test_the_responder_sets_its_serving_condition(
    clients: tuple[KubeClient, KubeClient], loaded: None
) -> None:
    root, responder = clients
    before = _kubelet_pod(root, "served")
    assert _stop(root, responder, "served", "key-1")  # added
    assert _stop(root, responder, "served", "key-2")  # updated: a new move's key in its message
    after = root.get(POD, "served", namespace=TENANT)
    [serving] = [c for c in after["status"]["conditions"] if c["type"] == SERVING]
    assert serving["status"] == "False" and serving["reason"] == "GPUQuarantined"
    assert "(key-2)" in serving["message"]
    assert _without_serving(after) == _without_serving(before)


@pytest.mark.parametrize("change", sorted(REFUSED))
def test_anything_else_the_responder_writes_is_refused(
    clients: tuple[KubeClient, KubeClient], loaded: None, change: str
) -> None:
    root, responder = clients
    name = "refused-" + change.lower().replace(" ", "-")
    before = _kubelet_pod(root, name)
    patch, words = REFUSED[change]
    error = _refusal(responder, name, patch)
    assert error is not None, f"the responder wrote {change}"
    assert error.status == 403, error
    assert "ValidatingAdmissionPolicy 'gpuhealth-pod-status'" in error.message, error.message
    assert POLICY_MESSAGE in error.message and words in error.message, error.message
    assert root.get(POD, name, namespace=TENANT)["status"] == before["status"]


def test_removing_the_serving_condition_is_refused(
    clients: tuple[KubeClient, KubeClient], loaded: None
) -> None:
    root, responder = clients
    _kubelet_pod(root, "kept")
    assert _stop(root, responder, "kept", "key-1")
    stopped = root.get(POD, "kept", namespace=TENANT)
    index = [c["type"] for c in stopped["status"]["conditions"]].index(SERVING)
    error = _refusal(responder, "kept", [{"op": "remove", "path": f"/status/conditions/{index}"}])
    assert error is not None and error.status == 403 and POLICY_MESSAGE in error.message, error
    assert root.get(POD, "kept", namespace=TENANT)["status"] == stopped["status"]


@pytest.mark.parametrize("change", sorted(REFUSED))
def test_other_users_are_not_matched(
    clients: tuple[KubeClient, KubeClient], loaded: None, change: str
) -> None:
    root, _ = clients
    name = "kubelet-" + change.lower().replace(" ", "-")
    _kubelet_pod(root, name)
    assert _refusal(root, name, REFUSED[change][0]) is None
