"""The scenario the node-agent tests run on both control planes, and what they read of a pod.

One DRA node and one device-plugin node of four GPUs each; a Job on DRA (a ResourceClaimTemplate)
and a Deployment on the device plugin (`nvidia.com/gpu`), two GPUs per pod, as API objects for
the control plane's controllers when the nodes are agents (`simulator.fleet.api_workloads`).
"""

from __future__ import annotations

from typing import Any

NAMESPACES = ("research", "inference")


def scenario(prefix: str) -> dict[str, Any]:
    """Nodes `<prefix>-dra-0` and `<prefix>-dp-0`."""
    return {
        "name": f"{prefix}-agents",
        "fleet": [
            {"name": f"{prefix}-dra", "count": 1, "gpusPerNode": 4, "path": "dra"},
            {"name": f"{prefix}-dp", "count": 1, "gpusPerNode": 4, "path": "device-plugin"},
        ],
        "workloads": [
            {
                "name": "train", "namespace": "research", "kind": "Job", "replicas": 1, "gpusPerPod": 2,
                "path": "dra", "checkpoint": "annotation",
            },
            {
                "name": "serve", "namespace": "inference", "kind": "Deployment", "replicas": 1,
                "gpusPerPod": 2, "path": "device-plugin",
            },
        ],
        "timeline": [],
    }  # fmt: skip


def allocated_statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """Every container's `allocatedResourcesStatus` entries, in order."""
    return [
        entry
        for cs in (pod.get("status") or {}).get("containerStatuses") or ()
        for entry in cs.get("allocatedResourcesStatus") or ()
    ]


def running_by_node(pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The scenario's two pods by node once both run with allocatedResourcesStatus; else empty."""
    ours = [p for p in pods if p["metadata"]["namespace"] in NAMESPACES]
    if len(ours) != 2 or not all(
        p["status"].get("phase") == "Running" and allocated_statuses(p) for p in ours
    ):
        return {}
    return {p["spec"]["nodeName"]: p for p in ours}
