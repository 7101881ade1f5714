"""The simulated workloads' own request and error counters (`simulator.traffic`).

Aspects: every running workload pod serves requests from the read that first sees it; a pod on
a device that fails (reported Unhealthy, lost) fails its requests and only it; a device that is
only Unknown fails nothing; a workload's own `errorRatio` fails that share on healthy devices
(and a share outside 0 to 1 is refused); a pod moved off the failed device to a healthy one
serves without errors and the gone pod's series disappears; the exposition is Prometheus text
that names the declared families with namespace and pod; the route serves it over HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.objects import DRA_PLUGIN_NAMESPACE
from simulator.runner import WORKLOAD_METRICS_PATH, add_routes
from simulator.scenario import DeviceRef, Fault, ScenarioError, from_dict
from simulator.traffic import CATALOG, JOB, REQUESTS_PER_SECOND, Traffic


def scenario(path: str, replicas: int = 2) -> dict[str, Any]:
    return {
        "fleet": [{"name": "n", "count": 2, "gpusPerNode": 2, "path": path}],
        "workloads": [{"name": "serve", "namespace": "inference", "replicas": replicas, "gpusPerPod": 1}],
    }


async def running(data: dict[str, Any]) -> AsyncIterator[tuple[Fleet, Store]]:
    clock = ManualClock()
    store = Store(clock, seed=3)
    fleet = Fleet(from_dict(data), store, clock)
    await fleet.start()
    task = asyncio.create_task(fleet.follow_deletions())
    await asyncio.sleep(0)
    yield fleet, store
    fleet.stop()
    await task


@pytest.fixture
async def dp() -> AsyncIterator[tuple[Fleet, Store]]:
    async for pair in running(scenario("device-plugin")):
        yield pair


def by_pod(traffic: Traffic) -> dict[str, tuple[float, float]]:
    return {pod: counts for (_ns, pod), counts in traffic.counts().items()}


def pod_on(fleet: Fleet, node: str, gpu: int) -> str:
    (pod,) = [p.name for p in fleet.pods.values() if p.node == node and any(s.gpu == gpu for s in p.slots)]
    return pod


async def test_a_failing_device_fails_its_pods_requests_and_only_theirs(dp: tuple[Fleet, Store]) -> None:
    fleet, _store = dp
    traffic = Traffic(fleet)
    traffic.advance()
    assert set(by_pod(traffic).values()) == {(0.0, 0.0)}  # first seen: counters start at 0
    await fleet.advance(10)
    traffic.advance()
    assert set(by_pod(traffic).values()) == {(10 * REQUESTS_PER_SECOND, 0.0)}

    broken = pod_on(fleet, "n-0", 0)
    fleet.inject(Fault(at=fleet.now(), kind="device-unhealthy", device=DeviceRef("n-0", 0)))
    await fleet.advance(5)
    traffic.advance()
    counts = by_pod(traffic)
    assert counts[broken] == (15 * REQUESTS_PER_SECOND, 5 * REQUESTS_PER_SECOND)
    assert [c for pod, c in counts.items() if pod != broken] == [(15 * REQUESTS_PER_SECOND, 0.0)]


async def test_an_unknown_device_fails_nothing() -> None:
    async for fleet, _store in running(scenario("dra", replicas=1)):
        traffic = Traffic(fleet)
        traffic.advance()
        (pod,) = (p for p in fleet.pods.values() if p.namespace != DRA_PLUGIN_NAMESPACE)
        fleet.inject(Fault(at=fleet.now(), kind="device-unknown", device=DeviceRef(pod.node, 0), duration=60))
        await fleet.advance(30)
        traffic.advance()
        assert by_pod(traffic) == {pod.name: (30 * REQUESTS_PER_SECOND, 0.0)}


async def test_a_moved_pod_serves_without_errors_and_the_gone_one_leaves(dp: tuple[Fleet, Store]) -> None:
    fleet, store = dp
    traffic = Traffic(fleet)
    broken = pod_on(fleet, "n-0", 0)
    fleet.inject(Fault(at=fleet.now(), kind="gpu-lost", device=DeviceRef("n-0", 0)))
    traffic.advance()
    await fleet.advance(4)
    traffic.advance()
    assert by_pod(traffic)[broken] == (4 * REQUESTS_PER_SECOND, 4 * REQUESTS_PER_SECOND)

    store.delete("pods", broken, "inference")
    for _ in range(5):
        await asyncio.sleep(0)
    await fleet.advance(10)  # the replacement delay passes; it lands on a healthy GPU
    traffic.advance()
    assert broken not in by_pod(traffic)
    await fleet.advance(10)
    traffic.advance()
    counts = by_pod(traffic)
    assert len(counts) == 2
    assert all(errors == 0.0 and requests > 0 for requests, errors in counts.values())


async def test_the_route_serves_the_declared_families_as_prometheus_text(dp: tuple[Fleet, Store]) -> None:
    fleet, _store = dp
    app = web.Application()
    add_routes(app, fleet)
    async with TestClient(TestServer(app)) as client:
        await client.get(WORKLOAD_METRICS_PATH)
        await fleet.advance(2)
        response = await client.get(WORKLOAD_METRICS_PATH)
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await response.text()
    samples = [line.split(" ") for line in text.splitlines() if not line.startswith("#")]
    names = {sample[0].split("{")[0] for sample in samples}
    assert names == {name for family in CATALOG for name in family.sample_names}
    pods = sorted(p.name for p in fleet.pods.values())
    requests = [s for s in samples if s[0].startswith("workload_requests_total{")]
    assert [s[0] for s in requests] == [
        f'workload_requests_total{{namespace="inference",pod="{p}"}}' for p in pods
    ]
    assert {float(s[1]) for s in requests} == {2 * REQUESTS_PER_SECOND}
    for family in CATALOG:
        assert f"# TYPE {family.exposed_name} counter" in text


def test_the_rules_default_to_the_series_the_simulated_workloads_export() -> None:
    from rules.render import DEFAULT_CONFIG, load_config

    workloads = load_config(DEFAULT_CONFIG).workloads
    assert (workloads.requests_metric, workloads.errors_metric) == tuple(
        family.sample_names[0] for family in CATALOG
    )
    assert (workloads.namespace_label, workloads.pod_label) == CATALOG["workload_requests"].labels
    assert workloads.matchers == f'job="{JOB}"'


async def test_a_workloads_own_error_ratio_fails_that_share_on_healthy_devices() -> None:
    data = scenario("device-plugin", replicas=1)
    data["workloads"].append(
        {"name": "buggy", "namespace": "inference", "replicas": 1, "gpusPerPod": 1, "errorRatio": 0.25}
    )
    async for fleet, _store in running(data):
        traffic = Traffic(fleet)
        traffic.advance()
        await fleet.advance(10)
        traffic.advance()
        counts = {pod.split("-")[0]: c for pod, c in by_pod(traffic).items()}
        assert counts["buggy"] == (10 * REQUESTS_PER_SECOND, 2.5 * REQUESTS_PER_SECOND)
        assert counts["serve"] == (10 * REQUESTS_PER_SECOND, 0.0)


@pytest.mark.parametrize("share", [-0.1, 1.5, True, "half"])
def test_an_error_ratio_outside_0_to_1_is_refused(share: Any) -> None:
    data = scenario("device-plugin")
    data["workloads"][0]["errorRatio"] = share
    with pytest.raises(ScenarioError, match=r"workloads\[0\]\.errorRatio: expected a share"):
        from_dict(data)
