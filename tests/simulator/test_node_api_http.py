"""`HttpNodeApi`, the node agents' HTTP adapter, against the simulated apiserver on loopback.

Aspects: a read-modify-write that loses a race (another writer changed the object between its
GET and PUT) is retried on the 409 and keeps both changes; a change-free result writes nothing
(no new resourceVersion); a missing object and an existing one answer the seam's `ApiError`
with the server's code (404, 409); a resource the agents never write is refused by name; a
delete with a grace period of 0 removes a pod at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.resources import NODE
from gpuhealth.kube.transport import KubeTransport
from simulator.apiserver.errors import ApiError
from simulator.fleet.node_api_http import HttpNodeApi
from simulator.testing import ClusterHandle, running_cluster
from tests.support.agents import scenario

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterHandle]:
    with running_cluster(scenario("n")) as handle:
        yield handle


@pytest.fixture
def api(cluster: ClusterHandle) -> Iterator[HttpNodeApi]:
    adapter = HttpNodeApi(lambda: KubeClient(KubeTransport(api_client(str(cluster.kubeconfig_path)))))
    yield adapter
    adapter.close()


def test_a_lost_race_is_retried_and_keeps_both_changes(cluster: ClusterHandle, api: HttpNodeApi) -> None:
    other = KubeClient(KubeTransport(api_client(str(cluster.kubeconfig_path))))
    calls = []

    def label(obj: dict[str, Any]) -> dict[str, Any]:
        calls.append(obj["metadata"]["resourceVersion"])
        if len(calls) == 1:  # someone else writes after our GET: our PUT is stale
            other.patch(NODE, "n-dp-0", {"metadata": {"labels": {"other": "yes"}}})
        obj["metadata"]["labels"]["ours"] = "yes"
        return obj

    written = api.mutate("nodes", "n-dp-0", None, label)
    assert len(calls) == 2 and calls[0] != calls[1]
    assert {"ours", "other"} <= set(written["metadata"]["labels"])
    other.close()


def test_a_change_free_result_writes_nothing(api: HttpNodeApi) -> None:
    before = api.get("nodes", "n-dp-0")["metadata"]["resourceVersion"]
    api.mutate("nodes", "n-dp-0", None, lambda obj: None)
    assert api.get("nodes", "n-dp-0")["metadata"]["resourceVersion"] == before


def test_errors_carry_the_servers_code_and_unknown_resources_are_refused(api: HttpNodeApi) -> None:
    with pytest.raises(ApiError) as missing:
        api.mutate("nodes", "no-such-node", None, lambda obj: obj)
    assert (missing.value.code, missing.value.reason) == (404, "NotFound")
    with pytest.raises(ApiError) as exists:
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-dp-0"}})
    assert (exists.value.code, exists.value.reason) == (409, "AlreadyExists")
    with pytest.raises(ValueError, match="do not write 'secrets'"):
        api.get("secrets", "x", "default")


def test_a_delete_with_grace_zero_removes_a_running_pod_at_once(
    cluster: ClusterHandle, api: HttpNodeApi
) -> None:
    (pod,) = [p for p in cluster.list("pods") if p["metadata"]["namespace"] == "inference"]
    name = pod["metadata"]["name"]
    api.delete("pods", name, "inference", grace_period_seconds=0)
    assert name not in {p["metadata"]["name"] for p in cluster.list("pods", "inference")}
