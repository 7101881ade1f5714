"""End to end: a cluster-mode exporter heals a recovered idle device-plugin GPU from its node's counts.

Aspects covered: `gpuhealth exporter` in cluster mode (its own process: no NVML, no pod-resources
reader) against a simulated device-plugin node with 4 GPUs of which a Job holds 1. A fatal XID
under the Job's pod turns its GPU Unhealthy from the pod's allocatedResourcesStatus (and the
kubelet lowers the node's allocatable); once the pod is gone the GPU stays Unhealthy, from the
pod's last report, while the node's allocatable is short; when the device plugin comes back
(the simulator's `recover`, which stands for the plugin's restart) the node's allocatable meets
its capacity again and the GPU reads Healthy with source `node`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuhealth.testing.loopback import wait_until
from tests.exporter.fixtures.scrapes import ones as scrape
from tests.support.exporters import cluster_exporter, health_and_source

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIO: dict[str, Any] = {
    "name": "exporter-node-allocatable",
    "description": "1 device-plugin node with 4 GPUs, a Job holds 1",
    "fleet": [{"name": "gpu-dp", "count": 1, "gpusPerNode": 4, "path": "device-plugin"}],
    "workloads": [
        {"name": "train", "namespace": "research", "kind": "Job", "replicas": 1,
         "gpusPerPod": 1, "path": "device-plugin"},
    ],
    "timeline": [],
}  # fmt: skip
NODE = "gpu-dp-0"


def test_a_recovered_idle_device_plugin_gpu_turns_healthy_from_its_node(tmp_path: Path) -> None:
    with cluster_exporter(SCENARIO, NODE, 4, tmp_path) as (cluster, port, uuids):

        def holder() -> tuple[str, str, str] | None:
            found = scrape(port)
            if found is None:
                return None
            allocations = found.get("gpu_device_allocation_info", [])
            held = [(a["device"], a["namespace"], a["pod"]) for a in allocations if a["node"] == NODE]
            return held[0] if len(held) == 1 else None

        target, namespace, pod_name = wait_until("1 GPU held by the Job", holder, timeout=60)
        assert target in uuids
        cluster.inject({"fault": "xid", "device": {"node": NODE, "gpu": uuids[target]}, "xid": 79})

        def state() -> tuple[str, str] | None:
            return health_and_source(port, target)

        wait_until("the XID GPU Unhealthy from its pod", lambda: state() == ("Unhealthy", "pod"), timeout=60)
        wait_until(
            "the kubelet's node allocatable one short",
            lambda: cluster.get("nodes", NODE)["status"]["allocatable"]["nvidia.com/gpu"] == "3",
            timeout=60,
        )
        cluster.call(lambda c: c.store.delete("pods", pod_name, namespace))
        seen: list[tuple[str, str]] = []

        def idle_for_a_while() -> bool:
            current = state()
            if current is not None:
                seen.append(current)
            # Positive evidence first: the pod is gone (no allocation on the GPU), then 20
            # scrapes keep showing its last report.
            found = scrape(port) or {}
            gone = not any(a["device"] == target for a in found.get("gpu_device_allocation_info", []))
            return gone and len(seen) >= 20

        wait_until("the idle GPU read 20 times with no pod", idle_for_a_while, timeout=60)
        assert set(seen[-10:]) == {("Unhealthy", "pod")}, seen
        cluster.inject({"fault": "recover", "device": {"node": NODE, "gpu": uuids[target]}})
        wait_until(
            "Healthy from the node once every GPU is allocatable again",
            lambda: state() == ("Healthy", "node"),
            timeout=60,
        )
