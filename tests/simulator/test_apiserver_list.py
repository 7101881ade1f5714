"""Conformance of LIST on the simulated apiserver, through the official client.

Aspects: labelSelector with every operator (both sides: matching and not); fieldSelector on
metadata.name, metadata.namespace, spec.nodeName and status.phase with = / == / !=; an
unsupported field or a malformed selector is 400; the list carries the cluster resourceVersion;
limit/continue pages cover every item once; big lists are streamed whole;
deletecollection honours selectors; lists across namespaces; resource.k8s.io served at
v1 and v1beta2 from one storage. Resource versions: continued pages are a snapshot of the first
page's version; an expired continue token is 410 with a token for the latest state;
resourceVersionMatch Exact / NotOlderThan / "0" / legacy-with-limit read what the real apiserver
reads; a future version is 504 ResourceVersionTooLarge; an exact list older than the watch
cache's window is 410; refused combinations are 422 (ListOptions) or 400 with the real wording.
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


@pytest.fixture
def core(api: client.ApiClient, make_pod: Callable[..., dict[str, Any]]) -> client.CoreV1Api:
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team")))
    pods = [
        ("default", make_pod("a", labels={"app": "infer", "gpu": "8"}, node="n1")),
        ("default", make_pod("b", labels={"app": "train", "gpu": "2"}, node="n2")),
        ("default", make_pod("c", labels={"app": "infer"})),
        ("team", make_pod("d", labels={"app": "infer", "tier": "canary"}, node="n1")),
    ]
    for ns, body in pods:
        core.create_namespaced_pod(ns, body)
    core.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Running"}})
    return core


def _names(pod_list: client.V1PodList) -> list[str]:
    return sorted(p.metadata.name for p in pod_list.items)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=infer", ["a", "c", "d"]),
        ("app==infer", ["a", "c", "d"]),
        ("app!=infer", ["b"]),
        ("app in (train, other)", ["b"]),
        ("app notin (train)", ["a", "c", "d"]),
        ("gpu", ["a", "b"]),
        ("!gpu", ["c", "d"]),
        ("app=infer,!tier", ["a", "c"]),
        ("gpu>4", ["a"]),
        ("app=absent", []),
    ],
)
def test_label_selector_operators(core: client.CoreV1Api, selector: str, expected: list[str]) -> None:
    assert _names(core.list_pod_for_all_namespaces(label_selector=selector)) == expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("metadata.name=b", ["b"]),
        ("metadata.namespace=team", ["d"]),
        ("metadata.namespace!=team", ["a", "b", "c"]),
        ("spec.nodeName=n1", ["a", "d"]),
        ("spec.nodeName==n2", ["b"]),
        ("spec.nodeName=", ["c"]),
        ("status.phase=Running", ["a"]),
        ("status.phase!=Running,spec.nodeName=n1", ["d"]),
    ],
)
def test_field_selectors(core: client.CoreV1Api, selector: str, expected: list[str]) -> None:
    assert _names(core.list_pod_for_all_namespaces(field_selector=selector)) == expected


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"field_selector": "spec.image=x"}, "field label not supported"),
        ({"field_selector": "spec.nodeName"}, "invalid field selector"),
        ({"label_selector": "app in (a"}, "unable to parse requirement"),
        ({"label_selector": "app=in valid"}, "unable to parse requirement"),
    ],
)
def test_bad_selectors_are_400(core: client.CoreV1Api, kwargs: dict[str, str], fragment: str) -> None:
    with pytest.raises(ApiException) as exc:
        core.list_pod_for_all_namespaces(**kwargs)
    assert exc.value.status == 400
    assert fragment in exc.value.body


def test_list_carries_the_cluster_resource_version(core: client.CoreV1Api) -> None:
    listed = core.list_namespaced_pod("default")
    newest = max(int(p.metadata.resource_version) for p in listed.items)
    assert int(listed.metadata.resource_version) >= newest
    created = core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="x"))
    )
    assert int(core.list_namespaced_pod("default").metadata.resource_version) == int(
        created.metadata.resource_version
    )


def test_limit_and_continue_page_through_everything_once(core: client.CoreV1Api) -> None:
    first = core.list_pod_for_all_namespaces(limit=3)
    assert len(first.items) == 3 and first.metadata._continue
    assert first.metadata.remaining_item_count == 1
    second = core.list_pod_for_all_namespaces(limit=3, _continue=first.metadata._continue)
    assert second.metadata._continue is None
    assert second.metadata.resource_version == first.metadata.resource_version
    assert sorted(_names(first) + _names(second)) == ["a", "b", "c", "d"]
    with pytest.raises(ApiException) as exc:
        core.list_pod_for_all_namespaces(limit=3, _continue="not-a-token")
    assert exc.value.status == 400


def test_resource_api_serves_v1_and_v1beta2_from_one_storage(api: client.ApiClient) -> None:
    v1 = client.ResourceV1Api(api)
    beta = client.ResourceV1beta2Api(api)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "n1-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-0000"}}}],
        },
    }
    v1.create_resource_slice(body)
    from_beta = beta.list_resource_slice(field_selector="spec.nodeName=n1")
    assert [s.metadata.name for s in from_beta.items] == ["n1-gpu.nvidia.com"]
    assert from_beta.items[0].api_version == "resource.k8s.io/v1beta2"
    assert v1.read_resource_slice("n1-gpu.nvidia.com").api_version == "resource.k8s.io/v1"
    assert v1.list_resource_slice(field_selector="spec.driver=other").items == []


def test_big_lists_are_streamed_whole(cluster: ServedCluster, api: client.ApiClient) -> None:
    def fill() -> None:
        for i in range(400):
            cluster.store.create(
                "configmaps",
                {"metadata": {"name": f"cm-{i:03d}", "namespace": "default"}, "data": {"k": "v" * 64}},
                validate=False,
            )

    cluster.call(fill)
    core = client.CoreV1Api(api)
    listed = core.list_namespaced_config_map("default")
    assert [c.metadata.name for c in listed.items] == [f"cm-{i:03d}" for i in range(400)]
    paged = core.list_namespaced_config_map("default", limit=350)
    assert len(paged.items) == 350 and paged.metadata.remaining_item_count == 50


def test_delete_collection_by_label(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    for name, team in (("a", "x"), ("b", "x"), ("c", "y")):
        meta = client.V1ObjectMeta(name=name, labels={"team": team})
        core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=meta))
    core.delete_collection_namespaced_config_map("default", label_selector="team=x")
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == ["c"]


def test_continued_pages_show_the_first_pages_state(core: client.CoreV1Api) -> None:
    first = core.list_pod_for_all_namespaces(limit=2)
    assert [p.metadata.name for p in first.items] == ["a", "b"]
    # Between pages: c changes, d goes, e arrives; the rest of the list is still the first page's.
    core.patch_namespaced_pod("c", "default", {"metadata": {"labels": {"changed": "yes"}}})
    core.delete_namespaced_pod("d", "team")
    core.create_namespaced_pod(
        "default",
        client.V1Pod(metadata={"name": "e"}, spec={"containers": [{"name": "c", "image": "busybox"}]}),
    )
    rest = core.list_pod_for_all_namespaces(limit=2, _continue=first.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["c", "d"]
    assert "changed" not in (rest.items[0].metadata.labels or {})
    assert rest.metadata.resource_version == first.metadata.resource_version
    assert sorted(p.metadata.name for p in core.list_pod_for_all_namespaces().items) == ["a", "b", "c", "e"]


def test_an_expired_continue_token_is_410_with_a_token_for_the_latest_state(
    make_cluster: Callable[..., ServedCluster], make_pod: Callable[..., dict[str, Any]]
) -> None:
    served = make_cluster(watch_window=1)
    with served.api_client() as api:
        core = client.CoreV1Api(api)
        for name in ("a", "b", "c"):
            core.create_namespaced_pod("default", make_pod(name))
        first = core.list_namespaced_pod("default", limit=1)
        core.create_namespaced_pod("default", make_pod("d"))
        core.create_namespaced_pod("default", make_pod("e"))  # the window (1 event) lost "d"
        with pytest.raises(ApiException) as exc:
            core.list_namespaced_pod("default", limit=1, _continue=first.metadata._continue)
        assert exc.value.status == 410
        status = json.loads(exc.value.body)
        assert status["reason"] == "Expired"
        assert status["message"].startswith("The provided continue parameter is too old")
        latest = core.list_namespaced_pod("default", _continue=status["metadata"]["continue"])
        assert [p.metadata.name for p in latest.items] == ["b", "c", "d", "e"]


def test_resource_version_match_reads(core: client.CoreV1Api) -> None:
    then = core.list_namespaced_pod("default").metadata.resource_version
    core.delete_namespaced_pod("c", "default")
    now = core.list_namespaced_pod("default").metadata.resource_version
    exact = core.list_namespaced_pod("default", resource_version=then, resource_version_match="Exact")
    assert (_names(exact), exact.metadata.resource_version) == (["a", "b", "c"], then)
    newer = core.list_namespaced_pod("default", resource_version=then, resource_version_match="NotOlderThan")
    assert (_names(newer), newer.metadata.resource_version) == (["a", "b"], now)
    anything = core.list_namespaced_pod("default", resource_version="0")
    assert _names(anything) == ["a", "b"]
    legacy_paged = core.list_namespaced_pod("default", resource_version=then, limit=10)
    assert _names(legacy_paged) == ["a", "b", "c"]  # resourceVersion with limit: exact, as real


@pytest.mark.parametrize("match", ["NotOlderThan", "Exact"])
def test_a_future_resource_version_is_504_too_large(core: client.CoreV1Api, match: str) -> None:
    current = int(core.list_namespaced_pod("default").metadata.resource_version)
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod("default", resource_version=str(current + 10), resource_version_match=match)
    assert exc.value.status == 504
    status = json.loads(exc.value.body)
    assert status["reason"] == "Timeout"
    assert status["message"] == f"Too large resource version: {current + 10}, current: {current}"
    assert status["details"] == {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }


def test_an_exact_list_older_than_the_window_is_410(
    make_cluster: Callable[..., ServedCluster], make_pod: Callable[..., dict[str, Any]]
) -> None:
    served = make_cluster(watch_window=1)
    with served.api_client() as api:
        core = client.CoreV1Api(api)
        then = core.list_namespaced_pod("default").metadata.resource_version
        core.create_namespaced_pod("default", make_pod("a"))
        core.create_namespaced_pod("default", make_pod("b"))
        with pytest.raises(ApiException) as exc:
            core.list_namespaced_pod("default", resource_version=then, resource_version_match="Exact")
        assert exc.value.status == 410
        assert json.loads(exc.value.body)["message"].startswith(f"too old resource version: {then} (")


@pytest.mark.parametrize(
    ("query", "code", "fragment"),
    [
        (
            "resourceVersionMatch=Exact",
            422,
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
        ("resourceVersion=0&resourceVersionMatch=Exact", 422, 'resourceVersionMatch "exact" is forbidden'),
        ("resourceVersion=1&resourceVersionMatch=Newest", 422, 'Unsupported value: "Newest"'),
        (
            "continue=abc&resourceVersion=5",
            400,
            "specifying resource version is not allowed when using continue",
        ),
        ("continue=abc", 400, "continue key is not valid"),
        ("resourceVersion=abc", 400, "invalid resource version"),
        ("sendInitialEvents=true", 422, "sendInitialEvents is forbidden for list"),
        ("watch=true&resourceVersionMatch=NotOlderThan", 422, "forbidden for watch unless sendInitialEvents"),
        ("watch=true&sendInitialEvents=true", 422, "sendInitialEvents requires setting resourceVersionMatch"),
    ],
)
def test_refused_option_combinations(cluster: ServedCluster, query: str, code: int, fragment: str) -> None:
    resp = urllib3.PoolManager().request("GET", f"{cluster.url}/api/v1/namespaces/default/pods?{query}")
    status = json.loads(resp.data)
    assert (resp.status, status["code"]) == (code, code)
    assert fragment in status["message"]
    if code == 422:
        assert status["message"].startswith('ListOptions.meta.k8s.io "" is invalid: ')
        assert status["details"]["kind"] == "ListOptions"
