"""`SimulatedCluster` on a ManualClock: stepped, served over HTTP, stopped without leftovers.

Aspects: with a ManualClock the fleet moves only when stepped (`fleet.advance`), while the
HTTP routes answer; the status route reports timeline progress; a fault posted as JSON with
a mistake gets a 400 Status naming the field; the kubeconfig points at the server; stopping
leaves no task behind (checked by the conftest). Listen addresses: tests/core/test_http.py.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
import yaml

from gpuhealth.clock import ManualClock
from simulator.runner import SimulatedCluster

pytestmark = pytest.mark.integration

SCENARIO = {
    "fleet": [{"name": "n", "count": 1, "gpusPerNode": 2, "path": "dra"}],
    "workloads": [{"name": "w", "replicas": 1, "gpusPerPod": 2}],
    "timeline": [{"at": "30s", "fault": "gpu-lost", "device": {"node": "n-0", "gpu": 1}}],
}


async def test_manual_clock_cluster_moves_only_when_stepped(tmp_path: Path) -> None:
    clock = ManualClock()
    kubeconfig = tmp_path / "kc" / "config"
    async with (
        SimulatedCluster(SCENARIO, clock=clock, kubeconfig_out=kubeconfig) as cluster,
        aiohttp.ClientSession() as http,
    ):
        assert yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"] == cluster.url
        async with http.get(f"{cluster.url}/simulator/v1/status") as resp:
            status = await resp.json()
        assert status["simulatedSeconds"] == 0
        assert status["timeline"] == {"applied": 0, "total": 1}

        await cluster.fleet.advance(31)
        async with http.get(f"{cluster.url}/simulator/v1/status") as resp:
            status = await resp.json()
        assert status["simulatedSeconds"] == 31
        assert status["timeline"] == {"applied": 1, "total": 1}
        assert status["faultsApplied"][0]["fault"] == "gpu-lost"
        pods, _ = cluster.store.list("pods")
        rows = pods[0]["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"]
        assert [r["health"] for r in rows] == ["Healthy", "Unhealthy"]

        bad = {"fault": "kubelet-stop", "node": "n-0", "duration": "forever"}
        async with http.post(f"{cluster.url}/simulator/v1/faults", json=bad) as resp:
            assert resp.status == 400
            body = await resp.json()
        assert body["kind"] == "Status"
        assert body["message"].startswith("<request>:1: duration: 'forever' is not a duration")
        async with http.post(f"{cluster.url}/simulator/v1/faults", json={**bad, "duration": 60}) as resp:
            assert resp.status == 201
        await cluster.fleet.advance(0)
        assert cluster.fleet.nodes["n-0"].kubelet == "kubelet-stop"
