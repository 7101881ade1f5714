"""End to end: idle DRA devices are tracked from the simulated cluster's ResourceSlices.

Aspects covered: `gpuhealth exporter` (its own process) against a simulated DRA node with
4 GPUs of which a Job holds 2; every GPU has series, the held ones with source `pod` and
an allocation, the idle ones with source `resourceslice` and none; when the driver
taints an idle GPU (gpu-lost), its health turns Unhealthy from the slice, with the
driver taints (gpu-lost, and the xid it raises) exported, while the held GPUs stay the kubelet's.
In node mode with NVML polled fast, a GPU failed by a fatal XID (still reachable) stays
Unhealthy in every scrape after its pod leaves, from its slice, until the driver clears it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.testing.loopback import child_process, free_port, wait_until
from tests.exporter.fixtures.scrapes import ones as scrape
from tests.support.exporters import cluster_exporter, health_and_source

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIO: dict[str, Any] = {
    "name": "exporter-idle",
    "description": "1 DRA node with 4 GPUs, a Job holds 2; the other 2 are idle",
    "fleet": [{"name": "gpu-dra", "count": 1, "gpusPerNode": 4, "path": "dra"}],
    "workloads": [
        {"name": "train", "namespace": "research", "kind": "Job", "replicas": 1,
         "gpusPerPod": 2, "path": "dra"},
    ],
    "timeline": [],
}  # fmt: skip
NODE = "gpu-dra-0"


def test_idle_dra_devices_have_series_and_a_driver_taint_speaks(tmp_path: Path) -> None:
    with cluster_exporter(SCENARIO, NODE, 4, tmp_path) as (cluster, port, uuids):

        def sources() -> dict[str, str] | None:
            found = scrape(port)
            if found is None:
                return None
            by_device = {i["device"]: i["source"] for i in found.get("gpu_device_info", [])}
            held = {a["device"] for a in found.get("gpu_device_allocation_info", [])}
            complete = set(by_device) == set(uuids) and len(held) == 2
            return by_device if complete and all(by_device[d] == "pod" for d in held) else None

        by_device = wait_until("4 GPUs tracked, 2 held by the Job", sources, timeout=60)
        idle = sorted(d for d, source in by_device.items() if source == "resourceslice")
        assert len(idle) == 2
        target = idle[0]

        cluster.inject({"fault": "gpu-lost", "device": {"node": NODE, "gpu": uuids[target]}})

        def lost() -> dict[str, list[dict[str, str]]] | None:
            found = scrape(port)
            if found is None:
                return None
            unhealthy = {
                h["device"] for h in found.get("gpu_device_health", []) if h["status"] == "Unhealthy"
            }
            tainted = {t["device"] for t in found.get("gpu_device_driver_taint", [])}
            return found if unhealthy == {target} and target in tainted else None

        found = wait_until("the idle GPU Unhealthy from its driver taint", lost, timeout=60)
        info = {i["device"]: i["source"] for i in found["gpu_device_info"]}
        assert info[target] == "resourceslice"
        keys = {t["key"] for t in found["gpu_device_driver_taint"] if t["device"] == target}
        assert "gpu.nvidia.com/gpu-lost" in keys
        assert sorted(d for d, s in info.items() if s == "pod") == sorted(set(uuids) - set(idle))


def test_a_failed_dra_device_stays_unhealthy_when_its_pod_leaves_until_the_driver_clears_it(
    tmp_path: Path,
) -> None:
    """Node mode, NVML polled fast: a fatal XID leaves the GPU reachable, so NVML would call it
    Healthy; once the pod on it is gone the driver's taint keeps it Unhealthy in every scrape
    (the alert does not resolve for want of a pod), until the driver clears the taint."""
    from simulator.testing import running_cluster

    port = free_port()
    with running_cluster(SCENARIO, speed=10.0) as cluster:
        uuids = {
            cluster.call(lambda c, gpu=gpu: c.fleet.gpu(NODE, gpu).uuid): gpu  # type: ignore[misc]
            for gpu in range(4)
        }
        argv = [
            sys.executable, "-m", "gpuhealth", "exporter", "--kubeconfig", str(cluster.kubeconfig_path),
            "--listen", f"127.0.0.1:{port}", "--directory", str(tmp_path / "devices.sqlite"),
            "--node", NODE, "--nvml", f"sim:{cluster.url}", "--nvml-poll-seconds", "0.05",
        ]  # fmt: skip
        with child_process(argv, tmp_path / "exporter.log"):

            def holders() -> dict[str, tuple[str, str]] | None:
                found = scrape(port)
                if found is None:
                    return None
                allocations = found.get("gpu_device_allocation_info", [])
                held = {a["device"]: (a["namespace"], a["pod"]) for a in allocations}
                return held if len(held) == 2 else None

            held = wait_until("2 GPUs held by the Job", holders, timeout=60)
            target = sorted(held)[0]
            namespace, pod_name = held[target]
            cluster.inject({"fault": "xid", "device": {"node": NODE, "gpu": uuids[target]}, "xid": 48})

            def state() -> tuple[str, str] | None:
                return health_and_source(port, target)

            failed = ("Unhealthy", "pod")
            wait_until("the XID GPU Unhealthy from its pod", lambda: state() == failed, timeout=60)
            cluster.call(lambda c: c.store.delete("pods", pod_name, namespace))
            seen: list[tuple[str, str]] = []

            def idle_for_a_while() -> bool:
                current = state()
                if current is not None:
                    seen.append(current)
                # Positive evidence first: the slice speaks for the GPU, then 40 scrapes (each
                # spanning NVML polls 50 ms apart) keep showing it.
                return sum(1 for s in seen if s[1] == "resourceslice") >= 40

            wait_until("the idle GPU read 40 times from its slice", idle_for_a_while, timeout=60)
            assert {health for health, _ in seen} == {"Unhealthy"}, seen
            cluster.inject({"fault": "recover", "device": {"node": NODE, "gpu": uuids[target]}})
            wait_until(
                "Healthy once the driver cleared its taint",
                lambda: state() == ("Healthy", "resourceslice"),
                timeout=60,
            )
