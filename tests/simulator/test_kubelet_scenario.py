"""Workload checkpoint fields in scenario files, and graceful deletion's pure decisions.

Aspects: `checkpoint` as a string or a mapping (`mode`, `commitAfter`: duration, never, fail),
refused with the file, line and field; the grace period a pod DELETE gets (requested, the
pod's own, the default, unbound and finished pods, negative values); a second DELETE only
shortens; a diagnostic on a DRA claim's device passes while that device stays Healthy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from simulator.apiserver.graceful import delete_pod, grace_period
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import ScenarioError, from_dict, parse_text
from tests.simulator.test_kubelet_pods import api_pod, create, get, running, scenario


def with_checkpoint(value: Any) -> dict[str, Any]:
    data = scenario("dra")
    data["workloads"] = [{"name": "w", "replicas": 1, "gpusPerPod": 1, "checkpoint": value}]
    return data


@pytest.mark.parametrize(
    ("value", "after", "fails"),
    [
        ("annotation", 10.0, False),
        ({"mode": "annotation", "commitAfter": "20s"}, 20.0, False),
        ({"commitAfter": "never"}, None, False),
        ({"mode": "annotation", "commitAfter": "fail"}, 0.0, True),
    ],
)
def test_checkpoint_field_forms(value: Any, after: float | None, fails: bool) -> None:
    (workload,) = from_dict(with_checkpoint(value)).workloads
    assert (workload.checkpoint, workload.checkpoint_after, workload.checkpoint_fails) == (
        "annotation", after, fails,
    )  # fmt: skip


def test_checkpoint_errors_name_the_file_line_and_field() -> None:
    text = """fleet:
  - {name: n, count: 1, gpusPerNode: 2, path: dra}
workloads:
  - name: w
    replicas: 1
    gpusPerPod: 1
    checkpoint:
      mode: none
      commitAfter: 20s
"""
    with pytest.raises(
        ScenarioError, match=r"^x.yaml:9: workloads\[0\].checkpoint.commitAfter: only a workload"
    ):
        parse_text(text, "x.yaml")
    bad = text.replace("mode: none", "mode: annotation").replace("20s", "soon")
    with pytest.raises(ScenarioError, match=r"^x.yaml:9: .*'soon' is not a duration, never or fail"):
        parse_text(bad, "x.yaml")
    with pytest.raises(ScenarioError, match=r"checkpoint.colour: unknown field"):
        parse_text(text.replace("commitAfter: 20s", "colour: red"), "x.yaml")


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"nodeName": "n-0", **spec}, "status": {"phase": "Running"}}


def test_the_grace_period_a_pod_delete_gets() -> None:
    assert grace_period(pod(), None) == 30
    assert grace_period(pod(terminationGracePeriodSeconds=5), None) == 5
    assert grace_period(pod(terminationGracePeriodSeconds=5), 60) == 60
    assert grace_period(pod(), -3) == 1
    assert grace_period({"metadata": {}, "spec": {}}, None) == 0
    assert grace_period({**pod(), "status": {"phase": "Succeeded"}}, None) == 0
    action, obj = delete_pod(pod(), 10, 1000.0, lambda _p: True)
    assert action == "terminating" and obj["metadata"]["deletionGracePeriodSeconds"] == 10
    assert delete_pod(obj, 20, 1001.0, lambda _p: True)[0] == "unchanged"
    assert delete_pod(obj, 0, 1001.0, lambda _p: True)[0] == "remove"
    assert delete_pod(pod(), 10, 1000.0, lambda _p: False)[0] == "remove"  # no kubelet runs it


@pytest.fixture
async def dra() -> AsyncIterator[tuple[Fleet, Store]]:
    async for pair in running(scenario("dra")):
        yield pair


async def test_a_diagnostic_on_a_dra_claim_passes_on_its_healthy_device(dra: tuple[Fleet, Store]) -> None:
    fleet, store = dra
    uuid = gpu_uuid("n-0", 2)
    selector = {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"'}}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [selector]}}
                ]
            }
        },
    }
    store.create("resourceclaims.resource.k8s.io", claim, namespace="default")
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n-0", "device": "gpu-2"}
    store.mutate(
        "resourceclaims.resource.k8s.io", "probe", "default",
        lambda o: {**o, "status": {"allocation": {"devices": {"results": [result]}}}}, subresource="status",
    )  # fmt: skip
    # What makes it a check is what it runs (a GPU program), not anything gpuhealth-specific.
    body = api_pod("dra-probe", gpus=0, command=["/cuda-samples/vectorAdd"])
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "probe"}]
    body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    await create(store, body)
    await fleet.advance(12)
    status = get(store, "dra-probe")["status"]
    assert status["phase"] == "Succeeded"  # a GPU program runs 10 s unless told otherwise, and passed
