"""What `kubectl gpuhealth devices` joins (`kubectl_gpuhealth.join`, pure).

Aspects: several exporters' views merge into one row per (node, device), the freshest report
winning; the filters (node, health, the namespace of the pods holding a device with idle
devices shown only for every namespace, pods picked by a selector); a pod's entries resolve to
the key the exporter and the records use: a device-plugin replica `<uuid>::<n>` to its GPU, a
DRA CDI ID through its claim's allocation to the exporter's device (its UUID when the slice
gave one, else `<driver>/<pool>/<device>`); an entry whose claim is unknown stays unresolved
and joins nothing; the record of the device and the exporter's row come with each entry.
"""

from __future__ import annotations

from typing import Any

from exporter.identity import ClaimInfo, ClaimResult
from exporter.snapshot import Allocation, DeviceState
from kubectl_gpuhealth.join import claim_names, merge_views, pod_devices, records_by_device, select
from responder.enforce.node_annotation import DEVICE_PLUGIN
from responder.records import Quarantine, QuarantineSpec

DRIVER = "gpu.nvidia.com"
T0 = 1_800_000_000.0


def device(
    node: str, key: str, health: str = "Healthy", *holders: tuple[str, str], **identity: str
) -> DeviceState:
    allocations = tuple(Allocation(ns, pod, "main", "nvidia.com/gpu") for ns, pod in holders)
    return DeviceState(node, key, health, "", 1, T0, T0, T0, allocations=allocations, **identity)


def test_views_merge_into_one_row_per_device_the_freshest_winning() -> None:
    node_mode = [(device("n1", "GPU-a", "Unhealthy"), 2.0), (device("n1", "GPU-b"), 1.0)]
    cluster_mode = [(device("n1", "GPU-a", "Healthy"), 40.0), (device("n2", "GPU-c"), 3.0)]
    merged = merge_views([cluster_mode, node_mode])
    assert [(d.node, d.device, d.health, age) for d, age in merged] == [
        ("n1", "GPU-a", "Unhealthy", 2.0),
        ("n1", "GPU-b", "Healthy", 1.0),
        ("n2", "GPU-c", "Healthy", 3.0),
    ]


def test_filters_by_node_health_namespace_and_selected_pods() -> None:
    rows = [
        (device("n1", "GPU-a", "Unhealthy", ("inference", "serve-1")), 1.0),
        (device("n1", "GPU-b", "Healthy", ("research", "train-0"), ("inference", "serve-2")), 1.0),
        (device("n2", "GPU-c"), 1.0),  # idle
    ]

    def keys(**filters: Any) -> list[str]:
        return [d.device for d, _ in select(rows, **filters)]

    assert keys(namespace=None) == ["GPU-a", "GPU-b", "GPU-c"]
    assert keys(namespace="inference") == ["GPU-a", "GPU-b"]
    assert keys(namespace="research") == ["GPU-b"]
    assert keys(namespace="default") == []
    assert keys(namespace=None, node="n2") == ["GPU-c"]
    assert keys(namespace=None, health="Unhealthy") == ["GPU-a"]
    assert keys(namespace=None, pods={("inference", "serve-2")}) == ["GPU-b"]
    assert keys(namespace="inference", pods=set()) == []


def pod(entries: list[tuple[str, str, str, str]], *, claims: dict[str, str] | None = None) -> dict[str, Any]:
    """(container, name, resourceID, health) entries on node n1; `claims` pod claim -> generated name."""
    containers: dict[str, list[dict[str, Any]]] = {}
    for container, name, resource_id, health in entries:
        groups = containers.setdefault(container, [])
        group = next((g for g in groups if g["name"] == name), None)
        if group is None:
            group = {"name": name, "resources": []}
            groups.append(group)
        group["resources"].append({"resourceID": resource_id, "health": health, "message": f"{health} now"})
    status: dict[str, Any] = {
        "phase": "Running",
        "containerStatuses": [{"name": c, "allocatedResourcesStatus": g} for c, g in containers.items()],
    }
    if claims:
        status["resourceClaimStatuses"] = [{"name": k, "resourceClaimName": v} for k, v in claims.items()]
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
        "spec": {"nodeName": "n1"},
        "status": status,
    }


def record(node: str, key: str) -> Quarantine:
    spec = QuarantineSpec(node, key, DEVICE_PLUGIN, "FatalXid", "alert/x", "2099-01-01T00:00:00Z")
    return Quarantine(name=f"q-{key}", spec=spec)


def test_a_device_plugin_replica_joins_its_gpu_row_and_record() -> None:
    the_pod = pod(
        [("main", "nvidia.com/gpu", "GPU-a::2", "Unhealthy"), ("side", "nvidia.com/gpu", "GPU-b", "Healthy")]
    )
    rows = [(device("n1", "GPU-a", "Unhealthy"), 12.0), (device("n2", "GPU-b"), 1.0)]
    found = pod_devices(the_pod, {}, rows, records_by_device([record("n1", "GPU-a")]))
    assert [(f.container, f.resource_id, f.device, f.health, f.message) for f in found] == [
        ("main", "GPU-a::2", "GPU-a", "Unhealthy", "Unhealthy now"),
        ("side", "GPU-b", "GPU-b", "Healthy", "Healthy now"),
    ]
    assert found[0].exporter == rows[0] and found[0].quarantine is not None
    # GPU-b of another node is another device: no row, no record.
    assert found[1].exporter is None and found[1].quarantine is None


def test_dra_entries_resolve_through_their_claim_to_the_exporters_key() -> None:
    the_pod = pod(
        [
            ("main", "claim:gpus", "k8s.gpu.nvidia.com/claim=cuid-gpu-0", "Healthy"),
            ("main", "claim:gpus", "k8s.gpu.nvidia.com/claim=cuid-gpu-1", "Unknown"),
            ("main", "claim:other", "k8s.gpu.nvidia.com/claim=x-gpu-2", "Healthy"),
        ],
        claims={"gpus": "p-gpus-abc", "other": "p-other-def"},
    )
    assert claim_names(the_pod) == ["p-gpus-abc", "p-other-def"]
    claims = {
        "p-gpus-abc": ClaimInfo(
            "ns",
            "p-gpus-abc",
            "cuid",
            (ClaimResult("r", DRIVER, "n1", "gpu-0"), ClaimResult("r", DRIVER, "n1", "gpu-1")),
        )
    }
    with_uuid = device("n1", "GPU-0", "Healthy", driver=DRIVER, pool="n1", device_name="gpu-0", uuid="GPU-0")
    without = device("n1", f"{DRIVER}/n1/gpu-1", "Unknown", driver=DRIVER, pool="n1", device_name="gpu-1")
    rows = [(with_uuid, 3.0), (without, 95.0)]
    found = pod_devices(the_pod, claims, rows, records_by_device([record("n1", f"{DRIVER}/n1/gpu-1")]))
    assert [(f.resource, f.device, f.health) for f in found] == [
        ("claim:gpus", "GPU-0", "Healthy"),
        ("claim:gpus", f"{DRIVER}/n1/gpu-1", "Unknown"),
        ("claim:other", "", "Healthy"),  # its claim was not read: unresolved
    ]
    assert [f.exporter[1] if f.exporter else None for f in found] == [3.0, 95.0, None]
    assert [f.quarantine is not None for f in found] == [False, True, False]


def test_a_pod_without_reports_has_no_devices() -> None:
    bare = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Pending"},
    }
    assert pod_devices(bare, {}, [], {}) == []
    assert claim_names(bare) == []
