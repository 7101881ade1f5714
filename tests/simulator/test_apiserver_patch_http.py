"""Conformance of PATCH on the simulated apiserver, through the official client.

Aspects: the client's default content types (strategic merge for a dict body, JSON patch for a
list body); merge patch; strategic merge of containers by name, conditions by type, finalizers
as a set, `$patch: delete`, null deleting a map entry; a change to a pod's containers refused;
a resourceVersion in the patch as a precondition (current passes, stale conflicts); a failing
JSON patch `test` op (422 worded as the apiserver's patch library); an unsupported patch type;
strategic merge refused for custom resources.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration


@pytest.fixture
def core(api: client.ApiClient, make_pod: Callable[..., dict[str, Any]]) -> client.CoreV1Api:
    core = client.CoreV1Api(api)
    body = make_pod("p", labels={"app": "infer", "tier": "gpu"}, finalizers=["a/one"])
    body["spec"]["containers"].append({"name": "sidecar", "image": "registry.example/side:1"})
    core.create_namespaced_pod("default", body)
    return core


def test_dict_body_is_strategic_merge_containers_merge_by_name(core: client.CoreV1Api) -> None:
    patched = core.patch_namespaced_pod(
        "p", "default", {"spec": {"containers": [{"name": "sidecar", "image": "registry.example/side:2"}]}}
    )
    images = {c.name: c.image for c in patched.spec.containers}
    assert images == {"main": "registry.example/infer:1", "sidecar": "registry.example/side:2"}


def test_strategic_merge_deletes_list_elements_and_map_entries(core: client.CoreV1Api) -> None:
    core.patch_namespaced_pod_status(
        "p", "default", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )
    patched = core.patch_namespaced_pod_status(
        "p",
        "default",
        {
            "metadata": {"labels": {"tier": None}},
            "status": {"conditions": [{"type": "Ready", "$patch": "delete"}]},
        },
    )
    assert not patched.status.conditions
    relabelled = core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"tier": None}}})
    assert relabelled.metadata.labels == {"app": "infer"}


def test_strategic_merge_that_changes_a_pods_containers_is_forbidden(core: client.CoreV1Api) -> None:
    # A pod's containers are immutable apart from their images, so this delete is refused (as real).
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p", "default", {"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}}
        )
    assert exc.value.status == 422
    message = json.loads(exc.value.body)["message"]
    assert message.startswith(
        'Pod "p" is invalid: spec: Forbidden: pod updates may not change fields other than'
    )
    assert [c.name for c in core.read_namespaced_pod("p", "default").spec.containers] == ["main", "sidecar"]


def test_strategic_merge_finalizers_union_and_delete_from_primitive_list(core: client.CoreV1Api) -> None:
    added = core.patch_namespaced_pod("p", "default", {"metadata": {"finalizers": ["b/two"]}})
    assert added.metadata.finalizers == ["a/one", "b/two"]
    removed = core.patch_namespaced_pod(
        "p", "default", {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a/one"]}}
    )
    assert removed.metadata.finalizers == ["b/two"]


def test_strategic_merge_status_conditions_merge_by_type(core: client.CoreV1Api) -> None:
    core.patch_namespaced_pod_status(
        "p",
        "default",
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}},
    )
    patched = core.patch_namespaced_pod_status(
        "p",
        "default",
        {
            "status": {
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "True"},
                ]
            }
        },
    )
    assert {c.type: c.status for c in patched.status.conditions} == {"Ready": "True", "PodScheduled": "True"}
    assert patched.status.phase == "Running"


def test_merge_patch_replaces_lists_whole(core: client.CoreV1Api) -> None:
    patched = core.patch_namespaced_pod(
        "p",
        "default",
        {"metadata": {"finalizers": ["c/three"], "annotations": {"gpuhealth.io/checkpoint": "annotation"}}},
        _content_type="application/merge-patch+json",
    )
    assert patched.metadata.finalizers == ["c/three"]
    assert patched.metadata.annotations == {"gpuhealth.io/checkpoint": "annotation"}


def test_list_body_is_json_patch(core: client.CoreV1Api) -> None:
    patched = core.patch_namespaced_pod(
        "p",
        "default",
        [
            {"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}},
            {"op": "replace", "path": "/metadata/labels/app", "value": "train"},
        ],
    )
    assert patched.metadata.annotations == {"k": "v"}
    assert patched.metadata.labels["app"] == "train"


def test_json_patch_test_op_failure_is_rejected_and_changes_nothing(core: client.CoreV1Api) -> None:
    before = core.read_namespaced_pod("p", "default")
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p",
            "default",
            [
                {"op": "test", "path": "/metadata/labels/app", "value": "other"},
                {"op": "replace", "path": "/metadata/labels/app", "value": "train"},
            ],
        )
    assert exc.value.status == 422
    # kube-apiserver's words (it keeps the patch library's to itself).
    rejected = "the server rejected our request due to an error in our request"
    assert json.loads(exc.value.body)["message"] == rejected
    after = core.read_namespaced_pod("p", "default")
    assert after.metadata.resource_version == before.metadata.resource_version


def test_resource_version_in_patch_is_a_precondition(core: client.CoreV1Api) -> None:
    current = core.read_namespaced_pod("p", "default").metadata.resource_version
    ok = core.patch_namespaced_pod(
        "p", "default", {"metadata": {"resourceVersion": current, "labels": {"x": "1"}}}
    )
    assert ok.metadata.labels["x"] == "1"
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p", "default", {"metadata": {"resourceVersion": current, "labels": {"x": "2"}}}
        )
    assert exc.value.status == 409


def test_no_op_patch_keeps_resource_version(core: client.CoreV1Api) -> None:
    before = core.read_namespaced_pod("p", "default").metadata.resource_version
    after = core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "infer"}}})
    assert after.metadata.resource_version == before


def test_unsupported_patch_type_is_415(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p", "default", {"metadata": {}}, _content_type="application/apply-patch+yaml"
        )
    assert exc.value.status == 415


def test_patch_that_breaks_the_schema_is_422_naming_the_field(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p", "default", {"spec": {"containers": [{"name": "main", "imagePullPolicy": "Sometimes"}]}}
        )
    assert exc.value.status == 422
    assert 'spec.containers[0].imagePullPolicy: Unsupported value: \\"Sometimes\\"' in exc.value.body
    # A value of the wrong JSON type never gets that far: the decoder refuses it (400).
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p", "default", {"spec": {"containers": [{"name": "main", "imagePullPolicy": 3}]}}
        )
    assert exc.value.status == 400 and "cannot unmarshal number into Go struct field" in exc.value.body
