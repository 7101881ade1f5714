"""Conformance of CustomResourceDefinitions and generically served custom resources.

Aspects: creating a CRD (ApiextensionsV1Api) makes it Established and serves its resources at
/apis/GROUP/VERSION, cluster- or namespace-scoped, visible in discovery; CRUD and merge patch
through CustomObjectsApi; the status subresource when declared (and 404 when not); bodies
validated against openAPIV3Schema (422 naming the field) and pruned of unknown fields;
strategic merge refused (415); a malformed CRD is 422; deleting the CRD stops serving it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration

GROUP = "gpuhealth.io"
VERSION = "v1alpha1"


def _crd(plural: str, kind: str, scope: str, *, status: bool = True) -> dict[str, Any]:
    version: dict[str, Any] = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["node", "device"],
                        "properties": {
                            "node": {"type": "string"},
                            "device": {"type": "string"},
                            "reason": {"type": "string", "enum": ["xid", "ecc", "lost"]},
                            "expiresAt": {"type": "string", "nullable": True},
                            "budget": {"x-kubernetes-int-or-string": True},
                        },
                    },
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
            }
        },
    }
    if status:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [version],
        },
    }


def _quarantine(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceQuarantine",
        "metadata": {"name": name},
        "spec": {"node": "n1", "device": "GPU-1", "reason": "xid", **spec},
    }


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    crd = client.ApiextensionsV1Api(api).create_custom_resource_definition(
        _crd("devicequarantines", "DeviceQuarantine", "Cluster")
    )
    assert {c.type: c.status for c in crd.status.conditions}["Established"] == "True"
    return client.CustomObjectsApi(api)


def test_cluster_scoped_custom_resources_crud_and_merge_patch(custom: client.CustomObjectsApi) -> None:
    created = custom.create_cluster_custom_object(GROUP, VERSION, "devicequarantines", _quarantine("q1"))
    assert created["metadata"]["resourceVersion"] and created["metadata"]["uid"]
    assert "status" not in created
    got = custom.get_cluster_custom_object(GROUP, VERSION, "devicequarantines", "q1")
    assert got["spec"]["device"] == "GPU-1"
    patched = custom.patch_cluster_custom_object(
        GROUP, VERSION, "devicequarantines", "q1", {"spec": {"reason": "ecc", "expiresAt": None}}
    )
    assert patched["spec"]["reason"] == "ecc" and patched["metadata"]["generation"] == 2
    listed = custom.list_cluster_custom_object(GROUP, VERSION, "devicequarantines")
    assert listed["kind"] == "DeviceQuarantineList"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["q1"]
    custom.delete_cluster_custom_object(GROUP, VERSION, "devicequarantines", "q1")
    with pytest.raises(ApiException) as exc:
        custom.get_cluster_custom_object(GROUP, VERSION, "devicequarantines", "q1")
    assert exc.value.status == 404


def test_status_subresource_of_a_custom_resource(custom: client.CustomObjectsApi) -> None:
    custom.create_cluster_custom_object(GROUP, VERSION, "devicequarantines", _quarantine("q1"))
    with_status = custom.patch_cluster_custom_object_status(
        GROUP, VERSION, "devicequarantines", "q1", {"status": {"phase": "Quarantined", "history": [1, 2]}}
    )
    assert with_status["status"] == {"phase": "Quarantined", "history": [1, 2]}
    assert with_status["metadata"]["generation"] == 1  # status writes leave the generation alone
    ignored = custom.patch_cluster_custom_object(
        GROUP, VERSION, "devicequarantines", "q1", {"status": {"phase": "Released"}}
    )
    assert ignored["status"]["phase"] == "Quarantined"


def test_custom_resource_schema_validation_and_pruning(custom: client.CustomObjectsApi) -> None:
    with pytest.raises(ApiException) as exc:
        custom.create_cluster_custom_object(
            GROUP, VERSION, "devicequarantines", _quarantine("bad", reason="heat")
        )
    assert exc.value.status == 422
    body = json.loads(exc.value.body)
    assert body["reason"] == "Invalid" and body["details"]["causes"][0]["field"] == "spec.reason"
    missing = _quarantine("bad")
    del missing["spec"]["device"]
    with pytest.raises(ApiException) as exc:
        custom.create_cluster_custom_object(GROUP, VERSION, "devicequarantines", missing)
    assert exc.value.status == 422 and "spec.device" in exc.value.body
    pruned = custom.create_cluster_custom_object(
        GROUP, VERSION, "devicequarantines", _quarantine("ok", unknownField=1, budget="10%")
    )
    assert "unknownField" not in pruned["spec"] and pruned["spec"]["budget"] == "10%"


def test_strategic_merge_is_refused_for_custom_resources(
    api: client.ApiClient, custom: client.CustomObjectsApi
) -> None:
    custom.create_cluster_custom_object(GROUP, VERSION, "devicequarantines", _quarantine("q1"))
    with pytest.raises(ApiException) as exc:
        custom.patch_cluster_custom_object(
            GROUP,
            VERSION,
            "devicequarantines",
            "q1",
            {"spec": {"reason": "ecc"}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert exc.value.status == 415


def test_namespaced_custom_resources_without_status(api: client.ApiClient) -> None:
    client.ApiextensionsV1Api(api).create_custom_resource_definition(
        _crd("migrations", "Migration", "Namespaced", status=False)
    )
    custom = client.CustomObjectsApi(api)
    body = _quarantine("m1")
    body["kind"] = "Migration"
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "migrations", body)
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, "default", "migrations")
    assert [i["metadata"]["namespace"] for i in listed["items"]] == ["default"]
    assert custom.list_namespaced_custom_object(GROUP, VERSION, "kube-system", "migrations")["items"] == []
    with pytest.raises(ApiException) as exc:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, "default", "migrations", "m1", {"status": {"phase": "x"}}
        )
    assert exc.value.status == 404


def test_crd_appears_in_discovery_and_deleting_it_stops_serving(
    api: client.ApiClient, custom: client.CustomObjectsApi
) -> None:
    groups = {g.name: g for g in client.ApisApi(api).get_api_versions().groups}
    assert groups[GROUP].preferred_version.group_version == f"{GROUP}/{VERSION}"
    resources = client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION)
    assert {r.name for r in resources.resources} == {"devicequarantines", "devicequarantines/status"}
    custom.create_cluster_custom_object(GROUP, VERSION, "devicequarantines", _quarantine("q1"))
    client.ApiextensionsV1Api(api).delete_custom_resource_definition(f"devicequarantines.{GROUP}")
    with pytest.raises(ApiException) as exc:
        custom.list_cluster_custom_object(GROUP, VERSION, "devicequarantines")
    assert exc.value.status == 404


def test_malformed_crd_is_422(api: client.ApiClient) -> None:
    bad = _crd("things", "Thing", "Cluster")
    bad["metadata"]["name"] = "wrong.name.io"
    with pytest.raises(ApiException) as exc:
        client.ApiextensionsV1Api(api).create_custom_resource_definition(bad)
    assert exc.value.status == 422 and "metadata.name" in exc.value.body


@pytest.mark.parametrize(
    ("node_schema", "field"),
    [
        ({"type": "string", "pattern": "("}, ".properties.spec.properties.node.pattern"),
        ({"$ref": "#/definitions/node"}, ".properties.spec.properties.node.$ref"),
        ({"type": "text"}, ".properties.spec.properties.node.type"),
    ],
    ids=["pattern-not-a-regex", "ref", "unknown-type"],
)
def test_a_crd_whose_schema_could_never_validate_is_422_on_create_and_update(
    api: client.ApiClient, node_schema: dict[str, Any], field: str
) -> None:
    extensions = client.ApiextensionsV1Api(api)
    bad = _crd("things", "Thing", "Cluster")
    bad["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["node"] = (
        node_schema
    )
    with pytest.raises(ApiException) as exc:
        extensions.create_custom_resource_definition(bad)
    assert exc.value.status == 422
    assert f"spec.versions[0].schema.openAPIV3Schema{field}" in json.loads(exc.value.body)["message"]
    good = api.sanitize_for_serialization(
        extensions.create_custom_resource_definition(_crd("things", "Thing", "Cluster"))
    )
    update = json.loads(json.dumps(good))
    update["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["node"] = (
        node_schema
    )
    with pytest.raises(ApiException) as exc:
        extensions.replace_custom_resource_definition(good["metadata"]["name"], update)
    assert exc.value.status == 422
    # The CRD as it was keeps serving its resources.
    thing = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Thing", "metadata": {"name": "t"}}
    thing["spec"] = {"node": "n1", "device": "GPU-1"}
    created = client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, "things", thing)
    assert created["spec"]["node"] == "n1"
