"""`fieldValidation` on the simulated apiserver: unknown and duplicate fields, as the real one treats them.

Aspects: without the parameter (Warn) an unknown field is dropped and named in a
`Warning: 299 - "unknown field \\"spec.foo\\""` header; Strict refuses it with the decoder's 400
`strict decoding error`; Ignore drops it silently; duplicate fields in the JSON text likewise;
patches and updates follow the same rule; custom resources are pruned with the same warnings;
an unknown fieldValidation value is 422; the official client sees the warning headers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import urllib3
from kubernetes import client

from simulator.apiserver.validation import duplicate_fields
from tests.simulator.conftest import ServedCluster

PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
def http() -> urllib3.PoolManager:
    return urllib3.PoolManager()


def _send(
    cluster: ServedCluster,
    http: urllib3.PoolManager,
    method: str,
    path: str,
    body: Any,
    content_type: str = "application/json",
) -> urllib3.BaseHTTPResponse:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.request(method, cluster.url + path, body=data, headers={"Content-Type": content_type})


def _pod_with_foo(make_pod: Callable[..., dict[str, Any]], name: str = "p") -> dict[str, Any]:
    pod = make_pod(name)
    pod["spec"]["foo"] = "bar"
    return pod


def test_duplicate_fields_are_named_by_path() -> None:
    raw = b'{"spec": {"replicas": 1, "replicas": 2, "template": {"a": [{"n": 1, "n": 2}]}}}'
    assert duplicate_fields(raw) == ["spec.replicas", "spec.template.a[0].n"]
    assert duplicate_fields(b'{"a": 1}') == []


@pytest.mark.integration
def test_default_is_warn_the_field_is_dropped_with_a_warning_header(
    cluster: ServedCluster, http: urllib3.PoolManager, make_pod: Callable[..., dict[str, Any]]
) -> None:
    resp = _send(cluster, http, "POST", PODS, _pod_with_foo(make_pod))
    assert resp.status == 201
    assert resp.headers.get("Warning") == '299 - "unknown field \\"spec.foo\\""'
    stored = cluster.call(lambda: cluster.store.get("pods", "p", "default"))
    assert "foo" not in stored["spec"]


@pytest.mark.integration
def test_strict_refuses_with_the_decoders_400(
    cluster: ServedCluster, http: urllib3.PoolManager, make_pod: Callable[..., dict[str, Any]]
) -> None:
    resp = _send(cluster, http, "POST", PODS + "?fieldValidation=Strict", _pod_with_foo(make_pod))
    assert resp.status == 400
    status = json.loads(resp.data)
    assert list(status) == ["kind", "apiVersion", "metadata", "status", "message", "reason", "code"]
    assert status["reason"] == "BadRequest"
    assert status["message"] == (
        'Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "spec.foo"'
    )
    assert cluster.call(lambda: cluster.store.list("pods", "default"))[0] == []


@pytest.mark.integration
def test_ignore_drops_silently(
    cluster: ServedCluster, http: urllib3.PoolManager, make_pod: Callable[..., dict[str, Any]]
) -> None:
    resp = _send(cluster, http, "POST", PODS + "?fieldValidation=Ignore", _pod_with_foo(make_pod))
    assert resp.status == 201 and "Warning" not in resp.headers
    assert "foo" not in json.loads(resp.data)["spec"]


@pytest.mark.integration
def test_duplicate_fields_warn_or_refuse(
    cluster: ServedCluster, http: urllib3.PoolManager, make_pod: Callable[..., dict[str, Any]]
) -> None:
    text = json.dumps(make_pod("p"))
    duplicated = text.replace('"kind": "Pod"', '"kind": "Pod", "kind": "Pod"').encode()
    strict = _send(cluster, http, "POST", PODS + "?fieldValidation=Strict", duplicated)
    assert strict.status == 400
    assert json.loads(strict.data)["message"].endswith('strict decoding error: duplicate field "kind"')
    warned = _send(cluster, http, "POST", PODS, duplicated)
    assert warned.status == 201 and warned.headers.get("Warning") == '299 - "duplicate field \\"kind\\""'


@pytest.mark.integration
def test_patches_and_updates_follow_field_validation(
    cluster: ServedCluster, http: urllib3.PoolManager, make_pod: Callable[..., dict[str, Any]]
) -> None:
    assert _send(cluster, http, "POST", PODS, make_pod("p")).status == 201
    patch = {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "main", "bogus": 1}]}}
    strict = _send(
        cluster,
        http,
        "PATCH",
        PODS + "/p?fieldValidation=Strict",
        patch,
        "application/strategic-merge-patch+json",
    )
    assert strict.status == 400
    assert 'unknown field "spec.containers[0].bogus"' in json.loads(strict.data)["message"]
    warned = _send(cluster, http, "PATCH", PODS + "/p", patch, "application/strategic-merge-patch+json")
    assert warned.status == 200
    assert warned.headers.get("Warning") == '299 - "unknown field \\"spec.containers[0].bogus\\""'
    current = json.loads(warned.data)
    current["metadata"]["labels"]["c"] = "d"
    current["spec"]["extra"] = True
    put = _send(cluster, http, "PUT", PODS + "/p?fieldValidation=Strict", current)
    assert put.status == 400 and 'unknown field "spec.extra"' in json.loads(put.data)["message"]


@pytest.mark.integration
def test_unknown_field_validation_value_is_422(
    cluster: ServedCluster, http: urllib3.PoolManager, make_pod: Callable[..., dict[str, Any]]
) -> None:
    resp = _send(cluster, http, "POST", PODS + "?fieldValidation=Loose", make_pod("p"))
    assert resp.status == 422
    assert json.loads(resp.data)["message"].startswith(
        'CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "Loose"'
    )


@pytest.mark.integration
def test_custom_resources_are_pruned_with_warnings_or_refused(
    cluster: ServedCluster, http: urllib3.PoolManager
) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}
                            },
                        }
                    },
                }
            ],
        },
    }
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    assert _send(cluster, http, "POST", path, crd).status == 201
    widgets = "/apis/example.com/v1/namespaces/default/widgets"
    body = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    body["spec"] = {"size": 1, "colour": "red"}
    strict = _send(cluster, http, "POST", widgets + "?fieldValidation=Strict", body)
    assert strict.status == 400
    assert json.loads(strict.data)["message"] == (
        'Widget in version "v1" cannot be handled as a Widget: '
        'strict decoding error: unknown field "spec.colour"'
    )
    warned = _send(cluster, http, "POST", widgets, body)
    assert warned.status == 201 and warned.headers.get("Warning") == '299 - "unknown field \\"spec.colour\\""'
    assert json.loads(warned.data)["spec"] == {"size": 1}


@pytest.mark.integration
def test_the_official_client_sees_the_warning(api: client.ApiClient, make_pod: Callable[..., Any]) -> None:
    # The client's typed models refuse unknown fields in bodies it builds; a patch body is untyped.
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", make_pod("p"))
    _, code, headers = core.patch_namespaced_pod_with_http_info("p", "default", {"spec": {"foo": 1}})
    assert code == 200 and headers["Warning"] == '299 - "unknown field \\"spec.foo\\""'
