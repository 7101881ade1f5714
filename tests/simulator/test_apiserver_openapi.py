"""OpenAPI documents of the simulated apiserver (what kubectl reads to validate, apply and explain).

Aspects: the 1.37 definitions converted to OpenAPI (single types, refs into components/schemas or
definitions, allOf-wrapped refs with siblings in v3, no `additionalProperties: false`, int-or-string);
a group/version document holds its resources' paths and only the schemas they reach; every
served kind has a PATCH operation tagged with its group/version/kind and a `fieldValidation`
query parameter (kubectl's test for server-side field validation); `/openapi/v3` lists every
served group/version with a hash that changes when a CRD changes; CRD schemas appear under
their reversed-group name; v2 is JSON, and a protobuf-only client gets 406.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import urllib3

from gpuhealth.clock import ManualClock
from simulator.apiserver import openapi
from simulator.apiserver.errors import ApiError
from simulator.apiserver.resources import CRD_KEY, ResourceInfo, info_from_crd
from simulator.apiserver.store import Store

if TYPE_CHECKING:
    from tests.simulator.conftest import ServedCluster

V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "devicequarantines.gpuhealth.io"},
    "spec": {
        "group": "gpuhealth.io",
        "scope": "Cluster",
        "names": {"plural": "devicequarantines", "singular": "devicequarantine", "kind": "DeviceQuarantine"},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "properties": {"node": {"type": "string"}}}
                        },
                    }
                },
            }
        ],
    },
}


def _store() -> Store:
    return Store(ManualClock(), seed=1)


def _doc(store: Store, path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(openapi.OpenApiDocs().serve_v3(store, path, "application/json"))
    return data


def _patch_ops(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {path: item["patch"] for path, item in doc["paths"].items() if "patch" in item}


def test_definitions_are_converted_to_openapi() -> None:
    v3 = openapi.builtin_schemas(3)
    spec = v3["io.k8s.api.core.v1.PodSpec"]
    assert spec["properties"]["activeDeadlineSeconds"]["type"] == "integer"
    assert spec["properties"]["affinity"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.api.core.v1.Affinity"}
    ]
    assert spec["properties"]["containers"]["x-kubernetes-patch-merge-key"] == "name"
    assert "additionalProperties" not in v3["io.k8s.api.core.v1.Pod"]
    assert "enum" not in v3["io.k8s.api.core.v1.Pod"]["properties"]["kind"]
    assert v3["io.k8s.apimachinery.pkg.util.intstr.IntOrString"]["format"] == "int-or-string"
    v2 = openapi.builtin_schemas(2)
    assert (
        v2["io.k8s.api.core.v1.PodSpec"]["properties"]["affinity"]["$ref"]
        == "#/definitions/io.k8s.api.core.v1.Affinity"
    )


def test_core_document_paths_and_field_validation() -> None:
    doc = _doc(_store(), "api/v1")
    assert doc["openapi"].startswith("3.") and doc["info"]["title"] == "Kubernetes"
    patches = _patch_ops(doc)
    pod_patch = patches["/api/v1/namespaces/{namespace}/pods/{name}"]
    assert pod_patch["x-kubernetes-group-version-kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert any(p["name"] == "fieldValidation" and p["in"] == "query" for p in pod_patch["parameters"])
    assert "/api/v1/nodes/{name}/status" in doc["paths"] and "/api/v1/pods" in doc["paths"]
    schemas = doc["components"]["schemas"]
    assert "io.k8s.api.core.v1.Pod" in schemas and "io.k8s.api.core.v1.PodList" in schemas
    assert "io.k8s.api.core.v1.PodSpec" in schemas  # reached through references
    assert "io.k8s.api.apps.v1.Deployment" not in schemas  # not served in this group/version
    kinds = {gvk["kind"] for s in schemas.values() for gvk in s.get("x-kubernetes-group-version-kind", [])}
    assert {"Pod", "Node", "Namespace", "ConfigMap", "Event"} <= kinds


def test_each_served_kind_has_a_patch_with_its_gvk() -> None:
    store = _store()
    for info in store.registry.all():
        for version in info.versions:
            doc = _doc(store, openapi.group_version_path(info.group, version))
            gvks = [op["x-kubernetes-group-version-kind"] for op in _patch_ops(doc).values()]
            assert {"group": info.group, "version": version, "kind": info.kind} in gvks, info.key


def test_discovery_lists_group_versions_and_hash_follows_crds() -> None:
    store = _store()
    docs = openapi.OpenApiDocs()
    first = json.loads(docs.serve_v3(store, "", None))["paths"]
    assert {"api/v1", "apis/batch/v1", "apis/resource.k8s.io/v1", "apis/resource.k8s.io/v1beta2"} <= set(
        first
    )
    assert first["api/v1"]["serverRelativeURL"].startswith("/openapi/v3/api/v1?hash=")
    store.create(CRD_KEY, json.loads(json.dumps(CRD)))
    second = json.loads(docs.serve_v3(store, "", None))["paths"]
    assert "apis/gpuhealth.io/v1alpha1" in second and second["api/v1"] == first["api/v1"]
    doc = json.loads(docs.serve_v3(store, "apis/gpuhealth.io/v1alpha1", None))
    name = openapi.crd_schema_name(info_from_crd(CRD), "v1alpha1")
    assert name == "io.gpuhealth.v1alpha1.DeviceQuarantine"
    schema = doc["components"]["schemas"][name]
    assert schema["properties"]["spec"]["properties"]["node"] == {"type": "string"}
    assert schema["x-kubernetes-group-version-kind"] == [
        {"group": "gpuhealth.io", "version": "v1alpha1", "kind": "DeviceQuarantine"}
    ]
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in doc["components"]["schemas"]


def test_unknown_group_version_is_404_and_protobuf_only_is_406() -> None:
    docs = openapi.OpenApiDocs()
    with pytest.raises(ApiError) as exc:
        docs.serve_v3(_store(), "apis/nope.io/v1", None)
    assert exc.value.code == 404
    with pytest.raises(ApiError) as exc:
        docs.serve_v2(_store(), V2_PROTOBUF)
    assert exc.value.code == 406 and "application/json" in exc.value.message


def test_v2_is_one_document_with_definitions() -> None:
    doc = json.loads(openapi.OpenApiDocs().serve_v2(_store(), "application/json"))
    assert doc["swagger"] == "2.0"
    assert "io.k8s.api.batch.v1.Job" in doc["definitions"]
    post = doc["paths"]["/api/v1/namespaces/{namespace}/configmaps"]["post"]
    assert post["parameters"][0] == {
        "in": "body",
        "name": "body",
        "required": True,
        "schema": {"$ref": "#/definitions/io.k8s.api.core.v1.ConfigMap"},
    }


@pytest.mark.integration
def test_openapi_over_http(cluster: ServedCluster) -> None:
    http = urllib3.PoolManager(retries=False)
    listing = http.request("GET", f"{cluster.url}/openapi/v3")
    assert listing.status == 200
    url = json.loads(listing.data)["paths"]["api/v1"]["serverRelativeURL"]
    doc = http.request("GET", cluster.url + url)
    assert doc.status == 200 and "components" in json.loads(doc.data)
    v2 = http.request("GET", f"{cluster.url}/openapi/v2", headers={"Accept": V2_PROTOBUF})
    assert v2.status == 406 and json.loads(v2.data)["reason"] == "NotAcceptable"
    assert (
        http.request("GET", f"{cluster.url}/openapi/v2", headers={"Accept": "application/json"}).status == 200
    )
    assert http.request("POST", f"{cluster.url}/openapi/v3").status == 405


def test_a_kind_missing_from_the_schema_set_still_has_its_patch() -> None:
    store = _store()
    store.registry.add(ResourceInfo("example.io", "v1", "gizmos", "gizmo", "Gizmo", True))
    doc = _doc(store, "apis/example.io/v1")
    patch = doc["paths"]["/apis/example.io/v1/namespaces/{namespace}/gizmos/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "example.io",
        "version": "v1",
        "kind": "Gizmo",
    }
    assert doc["components"]["schemas"]["io.example.v1.Gizmo"]["x-kubernetes-preserve-unknown-fields"] is True
