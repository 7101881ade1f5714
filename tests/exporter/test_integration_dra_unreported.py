"""End to end: a DRA pod on a node whose kubelet writes no health is shown holding its GPUs.

Aspects covered: `gpuhealth exporter` (its own process) against a simulated DRA node group with
`resourceHealthStatus: false` (a kubelet before 1.36, or its gate off): the Job's pod carries no
`allocatedResourcesStatus`, yet `gpu_device_allocation_info` names it on exactly the GPUs its
claim's allocation gives it (container, `claim:<pod claim>`, the ResourceClaim, as a kubelet's
report would), while every GPU's health comes from its ResourceSlice (source `resourceslice`);
the driver tainting a held GPU turns it Unhealthy from the slice, the pod still on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuhealth.testing.loopback import wait_until
from tests.exporter.fixtures.scrapes import ones as scrape
from tests.support.exporters import cluster_exporter

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIO: dict[str, Any] = {
    "name": "exporter-dra-unreported",
    "description": "1 DRA node with 4 GPUs whose kubelet writes no health; a Job holds 2",
    "fleet": [
        {"name": "gpu-dra", "count": 1, "gpusPerNode": 4, "path": "dra", "resourceHealthStatus": False},
    ],
    "workloads": [
        {"name": "train", "namespace": "research", "kind": "Job", "replicas": 1,
         "gpusPerPod": 2, "path": "dra"},
    ],
    "timeline": [],
}  # fmt: skip
NODE = "gpu-dra-0"


def test_a_dra_pod_without_allocated_resources_status_holds_its_claims_gpus(tmp_path: Path) -> None:
    from simulator.fleet.objects import allocated_resource_name

    with cluster_exporter(SCENARIO, NODE, 4, tmp_path) as (cluster, port, uuids):

        def held() -> dict[str, dict[str, str]] | None:
            found = scrape(port)
            if found is None:
                return None
            info = {i["device"]: i["source"] for i in found.get("gpu_device_info", [])}
            holders = {a["device"]: a for a in found.get("gpu_device_allocation_info", [])}
            complete = set(info) == set(uuids) and set(info.values()) == {"resourceslice"}
            return holders if complete and len(holders) == 2 else None

        holders = wait_until("2 GPUs held by the Job's pod, all 4 from their slice", held, timeout=60)
        pods = cluster.call(lambda c: c.store.list("pods", "research")[0])
        (pod,) = [p for p in pods if (p.get("spec") or {}).get("nodeName") == NODE]
        status = pod["status"]
        assert all("allocatedResourcesStatus" not in cs for cs in status["containerStatuses"])
        claim_name = {s["name"]: s["resourceClaimName"] for s in status["resourceClaimStatuses"]}["gpus"]
        claim = cluster.call(lambda c: c.store.get("resourceclaims.resource.k8s.io", claim_name, "research"))
        allocated = {r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}
        assert {f"gpu-{uuids[d]}" for d in holders} == allocated
        container = pod["spec"]["containers"][0]
        # The name a kubelet's report gives the claim (`claim:<pod claim>[/<request>]`).
        (reference,) = container["resources"]["claims"]
        resource = allocated_resource_name(reference)
        for allocation in holders.values():
            assert (allocation["pod"], allocation["container"], allocation["claim"]) == (
                pod["metadata"]["name"],
                container["name"],
                claim_name,
            )
            assert allocation["resource"] == resource

        target = sorted(holders)[0]
        cluster.inject({"fault": "gpu-lost", "device": {"node": NODE, "gpu": uuids[target]}})

        def lost() -> dict[str, list[dict[str, str]]] | None:
            found = scrape(port)
            if found is None:
                return None
            unhealthy = {
                h["device"] for h in found.get("gpu_device_health", []) if h["status"] == "Unhealthy"
            }
            return found if unhealthy == {target} else None

        found = wait_until("the held GPU Unhealthy from its driver taint", lost, timeout=60)
        assert {i["device"]: i["source"] for i in found["gpu_device_info"]}[target] == "resourceslice"
        assert target in {a["device"] for a in found["gpu_device_allocation_info"]}
