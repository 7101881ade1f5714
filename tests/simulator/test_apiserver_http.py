"""Conformance of discovery, errors and authentication of the simulated apiserver.

Aspects: /version, /api, /apis and per-group resource lists (with pods/status and pods/eviction,
resource.k8s.io at v1 and v1beta2) through the official client; errors as full Status objects:
malformed JSON 400, schema failure 422 naming the field, unknown resource 404, wrong method 405,
wrong media type 415; bearer-token authentication (401 without or with a wrong token, success
with it) through a kubeconfig the client loads; malformed requests never crash the server.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

if TYPE_CHECKING:
    from tests.simulator.conftest import ServedCluster

pytestmark = pytest.mark.integration

_STATUS_KEYS = {"kind", "apiVersion", "metadata", "status", "message", "reason", "code"}


@pytest.fixture
def http() -> urllib3.PoolManager:
    return urllib3.PoolManager(retries=False)


def _status(resp: urllib3.BaseHTTPResponse) -> dict[str, Any]:
    body = json.loads(resp.data)
    assert set(body) >= _STATUS_KEYS and body["kind"] == "Status" and body["status"] == "Failure"
    assert body["code"] == resp.status
    return body


def test_version_and_api_groups(api: client.ApiClient) -> None:
    assert client.VersionApi(api).get_code().git_version.startswith("v1.37.")
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]
    groups = {g.name: [v.version for v in g.versions] for g in client.ApisApi(api).get_api_versions().groups}
    assert groups["resource.k8s.io"] == ["v1", "v1beta2"]
    for group in ("coordination.k8s.io", "policy", "batch", "apiextensions.k8s.io"):
        assert groups[group] == ["v1"]


def test_resource_lists_name_subresources(api: client.ApiClient) -> None:
    core = {r.name: r for r in client.CoreV1Api(api).get_api_resources().resources}
    assert core["pods"].namespaced and core["pods"].kind == "Pod" and "watch" in core["pods"].verbs
    assert core["pods/status"].verbs == ["get", "patch", "update"]
    assert (core["pods/eviction"].group, core["pods/eviction"].kind) == ("policy", "Eviction")
    assert not core["nodes"].namespaced
    for api_cls in (client.ResourceV1Api, client.ResourceV1beta2Api):
        names = {r.name for r in api_cls(api).get_api_resources().resources}
        assert {"resourceclaims", "resourceclaims/status", "resourceslices", "devicetaintrules"} <= names
    leases = client.CoordinationV1Api(api).get_api_resources().resources
    assert [(r.name, r.kind) for r in leases] == [("leases", "Lease")]


def test_malformed_json_is_400(cluster: ServedCluster, http: urllib3.PoolManager) -> None:
    resp = http.request(
        "POST",
        f"{cluster.url}/api/v1/namespaces/default/configmaps",
        body=b'{"metadata": {"name": ',
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 400 and _status(resp)["reason"] == "BadRequest"


def test_schema_failure_is_422_naming_the_field(
    cluster: ServedCluster, api: client.ApiClient, http: urllib3.PoolManager, make_pod: Callable[..., Any]
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", make_pod("p"))
    # The client's typed models drop unknown fields and check types, so schema failures come from
    # untyped bodies: a PATCH through the client, or raw JSON.
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", {"spec": {"containers": [{"name": "main", "ports": [{}]}]}})
    assert exc.value.status == 422
    status = json.loads(exc.value.body)
    assert status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "spec.containers[0].ports[0].containerPort"
    assert "spec.containers[0].ports[0].containerPort: Required value" in status["message"]
    raw = make_pod("typo")
    raw["spec"]["nodeSelectr"] = {"gpu": "yes"}
    resp = http.request(
        "POST",
        f"{cluster.url}/api/v1/namespaces/default/pods?fieldValidation=Strict",
        body=json.dumps(raw).encode(),
        headers={"Content-Type": "application/json"},
    )
    # An unknown field is the decoder's business (400), not validation's; see test_apiserver_field_validation.
    assert resp.status == 400
    assert 'unknown field "spec.nodeSelectr"' in _status(resp)["message"]


def test_valid_objects_pass_validation(api: client.ApiClient) -> None:
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="ok"),
        spec=client.V1LeaseSpec(holder_identity="x", lease_duration_seconds=10, lease_transitions=0),
    )
    assert client.CoordinationV1Api(api).create_namespaced_lease("default", lease).spec.holder_identity == "x"


@pytest.mark.parametrize(
    ("method", "path", "code", "reason"),
    [
        ("GET", "/api/v1/widgets", 404, "NotFound"),
        ("GET", "/apis/resource.k8s.io/v1alpha9/resourceslices", 404, "NotFound"),
        ("GET", "/api/v1/pods/p", 404, "NotFound"),  # namespaced resource without a namespace
        ("GET", "/api/v1/namespaces/default/pods/p/logs", 404, "NotFound"),
        ("GET", "/nothing/here", 404, "NotFound"),
        ("PUT", "/api/v1/namespaces/default/pods", 405, "MethodNotAllowed"),
        ("POST", "/api/v1/namespaces/default/pods/p", 405, "MethodNotAllowed"),
        ("DELETE", "/api/v1/namespaces/default/pods/p/status", 405, "MethodNotAllowed"),
        ("GET", "/api/v1/namespaces/default/pods/p/eviction", 405, "MethodNotAllowed"),
        ("POST", "/version", 405, "MethodNotAllowed"),
        ("POST", "/api/v1/pods", 405, "MethodNotAllowed"),
    ],
)
def test_error_statuses(
    cluster: ServedCluster, http: urllib3.PoolManager, method: str, path: str, code: int, reason: str
) -> None:
    resp = http.request(method, cluster.url + path, body=b"{}", headers={"Content-Type": "application/json"})
    assert resp.status == code
    assert _status(resp)["reason"] == reason


def test_an_unknown_group_is_the_muxs_plain_404(cluster: ServedCluster, http: urllib3.PoolManager) -> None:
    """kube-apiserver serves no handler there: its mux answers in plain text, not with a Status."""
    resp = http.request("GET", cluster.url + "/apis/example.com/v1/things")
    assert resp.status == 404
    assert resp.headers["Content-Type"].startswith("text/plain")
    assert resp.data == b"404 page not found\n"


def test_yaml_body_is_415(cluster: ServedCluster, http: urllib3.PoolManager) -> None:
    resp = http.request(
        "POST",
        f"{cluster.url}/api/v1/namespaces/default/configmaps",
        body=b"metadata: {name: x}",
        headers={"Content-Type": "application/yaml"},
    )
    assert resp.status == 415 and _status(resp)["reason"] == "UnsupportedMediaType"


def test_bearer_token_is_required_when_configured(
    make_cluster: Callable[..., ServedCluster], http: urllib3.PoolManager
) -> None:
    served = make_cluster(token="s3cret")
    with served.api_client() as api:  # the kubeconfig carries the token
        assert client.CoreV1Api(api).list_namespace().items
    resp = http.request("GET", f"{served.url}/api/v1/namespaces")
    assert resp.status == 401 and _status(resp)["reason"] == "Unauthorized"
    resp = http.request("GET", f"{served.url}/api/v1/namespaces", headers={"Authorization": "Bearer wrong"})
    assert resp.status == 401
    assert http.request("GET", f"{served.url}/healthz").status == 200  # probes stay open


def test_no_token_accepts_any_request(cluster: ServedCluster, http: urllib3.PoolManager) -> None:
    resp = http.request(
        "GET", f"{cluster.url}/api/v1/namespaces", headers={"Authorization": "Bearer anything"}
    )
    assert resp.status == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "content_type"),
    [
        ("POST", "/api/v1/namespaces/default/pods", b"[1, 2, 3]", "application/json"),
        ("POST", "/api/v1/namespaces/default/pods", b'{"metadata": "x"}', "application/json"),
        ("POST", "/api/v1/namespaces/default/configmaps", b'{"metadata": null}', "application/json"),
        ("POST", "/api/v1/namespaces", b'{"metadata": {"name": "ns"}, "status": "x"}', "application/json"),
        ("POST", "/api/v1/namespaces/default/pods", b'{"metadata": {"name": 5}}', "application/json"),
        (
            "POST",
            "/api/v1/namespaces/default/pods",
            b'{"kind": "Node", "metadata": {"name": "a"}}',
            "application/json",
        ),
        ("POST", "/api/v1/namespaces/default/pods", b"\xff\xfe", "application/json"),
        ("POST", "/api/v1/namespaces/default/pods", b"", "application/json"),
        (
            "PUT",
            "/api/v1/namespaces/default/configmaps/missing",
            b'{"metadata": {"name": "other"}}',
            "application/json",
        ),
        ("PATCH", "/api/v1/namespaces/default/configmaps/kube", b"[{}]", "application/json-patch+json"),
        (
            "PATCH",
            "/api/v1/namespaces/default/configmaps/kube",
            b'"str"',
            "application/strategic-merge-patch+json",
        ),
        ("PATCH", "/api/v1/namespaces/default/configmaps/kube", b"null", "application/merge-patch+json"),
        (
            "PATCH",
            "/api/v1/namespaces/default/configmaps/kube",
            b'{"metadata": []}',
            "application/merge-patch+json",
        ),
        ("GET", "/api/v1/pods?labelSelector=%28%28%28", b"", "application/json"),
        ("GET", "/api/v1/pods?limit=-1", b"", "application/json"),
        ("GET", "/api/v1/pods?watch=true&resourceVersion=abc", b"", "application/json"),
        ("GET", "/api/v1/pods?watch=true&timeoutSeconds=x", b"", "application/json"),
        ("GET", "/api/v1/namespaces//pods", b"", "application/json"),
        ("DELETE", "/api/v1/namespaces/default/configmaps/kube", b"[]", "application/json"),
        ("POST", "/api/v1/namespaces/default/pods/kube/eviction", b'{"kind": "Pod"}', "application/json"),
    ],
)
def test_malformed_requests_get_a_status_and_the_server_keeps_serving(
    cluster: ServedCluster, http: urllib3.PoolManager, method: str, path: str, body: bytes, content_type: str
) -> None:
    cluster.call(
        lambda: cluster.store.create("configmaps", {"metadata": {"name": "kube", "namespace": "default"}})
    )
    resp = http.request(method, cluster.url + path, body=body or None, headers={"Content-Type": content_type})
    assert 400 <= resp.status < 500, resp.data
    _status(resp)
    assert http.request("GET", f"{cluster.url}/api/v1/namespaces/default/configmaps/kube").status == 200
