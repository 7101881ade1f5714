"""Conformance of the simulated apiserver's object lifecycle, through the official client.

Aspects: one cluster-wide increasing resourceVersion; server-set uid, creationTimestamp and
generation; 409 AlreadyExists on create; 409 Conflict on a stale update (and success on a current
one); generateName; the status subresource and what the main resource ignores; finalizers and
deletionTimestamp; what DELETE returns; namespaces must exist for API clients.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

if TYPE_CHECKING:
    from tests.simulator.conftest import ServedCluster

pytestmark = pytest.mark.integration


def _lease(name: str, holder: str = "a") -> client.V1Lease:
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=15),
    )


def test_resource_version_increases_across_resources_and_server_sets_identity(
    cluster: ServedCluster, api: client.ApiClient, make_pod: Callable[..., dict[str, Any]]
) -> None:
    core = client.CoreV1Api(api)
    coord = client.CoordinationV1Api(api)
    pod = core.create_namespaced_pod("default", make_pod("a"))
    lease = coord.create_namespaced_lease("kube-node-lease", _lease("node-1"))
    cm = core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c"))
    )
    rvs = [
        int(pod.metadata.resource_version),
        int(lease.metadata.resource_version),
        int(cm.metadata.resource_version),
    ]
    assert rvs == sorted(rvs) and len(set(rvs)) == 3
    assert pod.metadata.uid and pod.metadata.uid != lease.metadata.uid
    assert pod.metadata.creation_timestamp.timestamp() == cluster.clock.now()
    assert pod.metadata.generation == 1
    assert pod.status.phase == "Pending"  # the create strategy resets pod status


def test_create_of_an_existing_name_is_409_already_exists(
    api: client.ApiClient, make_pod: Callable[..., dict[str, Any]]
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", make_pod("dup"))
    core.create_namespaced_pod("kube-system", make_pod("dup"))  # same name, other namespace: fine
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("default", make_pod("dup"))
    assert exc.value.status == 409
    body = json.loads(exc.value.body)
    assert body["kind"] == "Status" and body["reason"] == "AlreadyExists"
    assert body["details"] == {"name": "dup", "kind": "pods"}


def test_update_with_current_resource_version_succeeds_and_stale_one_conflicts(api: client.ApiClient) -> None:
    coord = client.CoordinationV1Api(api)
    created = coord.create_namespaced_lease("default", _lease("leader"))
    first = coord.read_namespaced_lease("leader", "default")
    second = coord.read_namespaced_lease("leader", "default")
    first.spec.holder_identity = "b"
    updated = coord.replace_namespaced_lease("leader", "default", first)
    assert updated.spec.holder_identity == "b"
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    second.spec.holder_identity = "c"
    with pytest.raises(ApiException) as exc:
        coord.replace_namespaced_lease("leader", "default", second)
    assert exc.value.status == 409
    assert '"reason":"Conflict"' in exc.value.body.replace(" ", "")
    assert coord.read_namespaced_lease("leader", "default").spec.holder_identity == "b"


def test_generation_bumps_on_spec_change_only(api: client.ApiClient) -> None:
    batch = client.BatchV1Api(api)
    job = client.V1Job(
        metadata=client.V1ObjectMeta(name="j", labels={"a": "1"}),
        spec=client.V1JobSpec(
            parallelism=1,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never", containers=[client.V1Container(name="m", image="busybox")]
                )
            ),
        ),
    )
    created = batch.create_namespaced_job("default", job)
    assert created.metadata.generation == 1
    labelled = batch.patch_namespaced_job("j", "default", {"metadata": {"labels": {"a": "2"}}})
    assert labelled.metadata.generation == 1
    scaled = batch.patch_namespaced_job("j", "default", {"spec": {"parallelism": 2}})
    assert scaled.metadata.generation == 2


def test_generate_name_gives_unique_names(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    names = {
        core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(generate_name="probe-"))
        ).metadata.name
        for _ in range(5)
    }
    assert len(names) == 5
    assert all(n.startswith("probe-") and len(n) == len("probe-") + 5 for n in names)


def test_status_subresource_changes_only_status_and_main_resource_ignores_status(
    api: client.ApiClient, make_pod: Callable[..., dict[str, Any]]
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", make_pod("s", labels={"v": "1"}))
    status_patch = {"status": {"phase": "Running"}, "metadata": {"labels": {"v": "2"}}}
    after_status = core.patch_namespaced_pod_status("s", "default", status_patch)
    assert after_status.status.phase == "Running"
    assert after_status.metadata.labels == {"v": "1"}  # /status ignores metadata changes
    after_main = core.patch_namespaced_pod(
        "s", "default", {"status": {"phase": "Failed"}, "metadata": {"labels": {"v": "3"}}}
    )
    assert after_main.status.phase == "Running"  # the main resource ignores status changes
    assert after_main.metadata.labels == {"v": "3"}
    pod = core.read_namespaced_pod_status("s", "default")
    pod.status.phase = "Succeeded"
    replaced = core.replace_namespaced_pod_status("s", "default", pod)
    assert replaced.status.phase == "Succeeded"


def test_finalizers_keep_a_deleted_object_until_they_are_emptied(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    meta = client.V1ObjectMeta(name="held", finalizers=["gpuhealth.io/evidence"])
    core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=meta, data={"k": "v"}))
    deleted = core.delete_namespaced_config_map("held", "default")
    held = core.read_namespaced_config_map("held", "default")
    assert held.metadata.deletion_timestamp is not None
    assert deleted["metadata"]["deletionTimestamp"]  # pending deletion: DELETE returns the object
    # New finalizers cannot be added while deleting.
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_config_map(
            "held", "default", {"metadata": {"finalizers": ["gpuhealth.io/evidence", "x/y"]}}
        )
    assert exc.value.status == 422
    core.patch_namespaced_config_map("held", "default", [{"op": "remove", "path": "/metadata/finalizers"}])
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("held", "default")
    assert exc.value.status == 404


def test_delete_without_finalizers_removes_at_once_and_returns_like_the_real_api(
    api: client.ApiClient, make_pod: Callable[..., dict[str, Any]]
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", make_pod("gone"))
    deleted_pod = core.delete_namespaced_pod("gone", "default")
    assert deleted_pod.metadata.name == "gone"  # pods: DELETE returns the object
    coord = client.CoordinationV1Api(api)
    coord.create_namespaced_lease("default", _lease("l"))
    status = coord.delete_namespaced_lease("l", "default")  # the client returns this body as a dict
    assert status["kind"] == "Status" and status["status"] == "Success"  # leases: a Success Status
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod("gone", "default")
    assert exc.value.status == 404


def test_delete_preconditions_on_resource_version(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    cm = core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="p"))
    )
    stale = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version="1"))
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_config_map("p", "default", body=stale)
    assert exc.value.status == 409
    current = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(resource_version=cm.metadata.resource_version)
    )
    assert core.delete_namespaced_config_map("p", "default", body=current)["status"] == "Success"


def test_namespaces_are_simple_and_must_exist_for_api_clients(
    api: client.ApiClient, make_pod: Callable[..., dict[str, Any]]
) -> None:
    core = client.CoreV1Api(api)
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("tenant-a", make_pod("p"))
    assert exc.value.status == 404
    ns = core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="tenant-a")))
    assert ns.status.phase == "Active"
    core.create_namespaced_pod("tenant-a", make_pod("p"))
    assert {n.metadata.name for n in core.list_namespace().items} >= {
        "default",
        "kube-node-lease",
        "tenant-a",
    }
    deleted = core.delete_namespace("tenant-a")
    assert deleted["metadata"]["name"] == "tenant-a"
    # No cascading (documented): the pod outlives its namespace.
    assert core.read_namespaced_pod("p", "tenant-a").metadata.name == "p"


def test_nodes_are_cluster_scoped_with_status(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    node = client.V1Node(
        metadata=client.V1ObjectMeta(name="gpu-node-1", labels={"nvidia.com/gpu.present": "true"}),
        status=client.V1NodeStatus(capacity={"nvidia.com/gpu": "8"}),
    )
    created = core.create_node(node)
    assert created.metadata.namespace is None
    assert created.status.capacity == {"nvidia.com/gpu": "8"}  # nodes keep status on create
    patched = core.patch_node_status(
        "gpu-node-1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    assert [c.type for c in patched.status.conditions] == ["Ready"]


def test_returned_objects_do_not_alias_the_store(
    cluster: ServedCluster, make_pod: Callable[..., dict[str, Any]]
) -> None:
    def scenario() -> tuple[str, str]:
        store = cluster.store
        body = make_pod("alias")
        created = store.create("pods", body, namespace="default", validate=False)
        created["metadata"]["labels"] = {"changed": "yes"}
        body["metadata"]["name"] = "other"
        got = store.get("pods", "alias", "default")
        got["spec"]["containers"].clear()
        again = store.get("pods", "alias", "default")
        return str(again["metadata"].get("labels")), str(len(again["spec"]["containers"]))

    assert cluster.call(scenario) == ("None", "1")
