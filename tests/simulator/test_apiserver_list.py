"""Conformance of LIST on the simulated apiserver, through the official client.

Aspects: labelSelector with every operator (both sides: matching and not); fieldSelector on
metadata.name, metadata.namespace, spec.nodeName and status.phase with = / == / !=; an
unsupported field or a malformed selector is 400; the list carries the cluster resourceVersion;
limit/continue pages cover every item once; big lists are streamed whole;
deletecollection honours selectors; lists across namespaces; resource.k8s.io served at
v1 and v1beta2 from one storage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
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
