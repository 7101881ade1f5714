"""A scenario served by `running_cluster` and inspected with the official client.

Aspects: nodes (capacity, Ready), Leases renewed in kube-node-lease, pods with
allocatedResourcesStatus that change as injected faults land, at high speed, DRA claims and
slices, the simulator's own HTTP routes (status, NVML, fault injection) and the token.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client

from exporter.podresources import Allocatable
from exporter.podresources_reads import FetchingReader
from gpuhealth.kube.config import api_client
from gpuhealth.testing.loopback import wait_until
from simulator.fleet.objects import DRA_PLUGIN_NAMESPACE
from simulator.podresources_remote import RemotePodResources
from simulator.testing import running_cluster

pytestmark = pytest.mark.integration

SCENARIO: dict[str, Any] = {
    "name": "small",
    "settings": {"leaseRenewInterval": "10s", "statusSyncInterval": "10s"},
    "fleet": [
        {"name": "dp", "count": 1, "gpusPerNode": 4, "path": "device-plugin"},
        {"name": "dra", "count": 1, "gpusPerNode": 4, "path": "dra"},
    ],
    "workloads": [
        {"name": "serve", "namespace": "inference", "replicas": 2, "gpusPerPod": 2, "path": "device-plugin"},
        {
            "name": "train",
            "namespace": "research",
            "kind": "Job",
            "replicas": 2,
            "gpusPerPod": 2,
            "path": "dra",
        },
    ],
}

# Injected once the healthy start has been checked: a timeline entry would land after a
# fixed simulated time, which a loaded machine can pass before the first check runs.
FAULTS = (
    {"fault": "xid", "device": {"node": "dp-0", "gpu": 1}, "xid": 79},
    {"fault": "gpu-lost", "device": {"node": "dra-0", "gpu": 3}},
)


def _health(pod: Any) -> dict[str, str]:
    out = {}
    for cs in pod.status.container_statuses or []:
        for entry in cs.allocated_resources_status or []:
            for res in entry.resources:
                out[res.resource_id] = res.health
    return out


def _get_json(url: str, token: str | None = None, data: bytes | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_scenario_served_to_the_official_client_changes_as_faults_land() -> None:
    with running_cluster(SCENARIO, speed=20) as cluster:
        api_cl = api_client(str(cluster.kubeconfig_path))
        core = client.CoreV1Api(api_cl)
        nodes = {n.metadata.name: n for n in core.list_node().items}
        assert set(nodes) == {"dp-0", "dra-0"}
        assert nodes["dp-0"].status.capacity["nvidia.com/gpu"] == "4"
        assert "nvidia.com/gpu" not in nodes["dra-0"].status.capacity
        ready = next(c for c in nodes["dp-0"].status.conditions if c.type == "Ready")
        assert ready.status == "True"

        leases = client.CoordinationV1Api(api_cl).list_namespaced_lease("kube-node-lease").items
        assert {lease.spec.holder_identity for lease in leases} == {"dp-0", "dra-0"}
        first = {lease.metadata.name: lease.spec.renew_time for lease in leases}

        listed = core.list_pod_for_all_namespaces().items
        plugins = [p for p in listed if p.metadata.namespace == DRA_PLUGIN_NAMESPACE]
        assert [p.spec.node_name for p in plugins] == ["dra-0"]  # the DRA driver's kubelet plugin
        pods = [p for p in listed if p.metadata.namespace != DRA_PLUGIN_NAMESPACE]
        assert len(pods) == 4
        assert all(set(_health(p).values()) == {"Healthy"} for p in pods)
        dra_pods = [p for p in pods if p.spec.node_name == "dra-0"]
        assert all(p.status.resource_claim_statuses[0].name == "gpus" for p in dra_pods)

        claims = client.ResourceV1Api(api_cl).list_resource_claim_for_all_namespaces().items
        assert len(claims) == 2
        results = [r for c in claims for r in c.status.allocation.devices.results]
        assert {r.pool for r in results} == {"dra-0"}

        for fault in FAULTS:
            cluster.inject(fault)

        def both_unhealthy() -> list[str] | None:
            pods = core.list_pod_for_all_namespaces().items
            found = [rid for p in pods for rid, h in _health(p).items() if h == "Unhealthy"]
            return found if len(found) == 2 else None

        unhealthy = wait_until("both faults in pod status", both_unhealthy, timeout=20, interval=0.1)
        uuid_1 = cluster.call(lambda c: c.fleet.gpu("dp-0", 1).uuid)
        assert uuid_1 in unhealthy
        cdi = [rid for rid in unhealthy if rid.startswith("k8s.gpu.nvidia.com/claim=")]
        assert len(cdi) == 1
        assert cdi[0].endswith("-gpu-3")
        node = core.read_node("dp-0")
        assert node.status.allocatable["nvidia.com/gpu"] == "3"
        assert node.status.capacity["nvidia.com/gpu"] == "4"

        slices = client.ResourceV1Api(api_cl).list_resource_slice().items
        tainted = [d for s in slices for d in s.spec.devices if d.taints]
        assert [d.name for d in tainted] == ["gpu-3"]
        assert {t.key for t in tainted[0].taints} == {"gpu.nvidia.com/xid", "gpu.nvidia.com/gpu-lost"}

        def renewed() -> bool:
            leases = client.CoordinationV1Api(api_cl).list_namespaced_lease("kube-node-lease").items
            times = {lease.metadata.name: lease.spec.renew_time for lease in leases}
            return all(times[name] > first[name] for name in first)

        wait_until("every node Lease renewed", renewed, timeout=20, interval=0.1)

        code, status = _get_json(f"{cluster.url}/simulator/v1/status")
        assert code == 200
        assert [f["fault"] for f in status["faultsApplied"]] == ["xid", "gpu-lost"]
        code, nvml = _get_json(f"{cluster.url}/simulator/v1/nodes/dra-0/nvml?since=0")
        assert code == 200
        assert [d["reachable"] for d in nvml["devices"]] == [True, True, True, False]
        assert [e["xid"] for e in nvml["xid_events"]] == [79]
        code, again = _get_json(f"{cluster.url}/simulator/v1/nodes/dra-0/nvml?since={nvml['next_seq']}")
        assert again["xid_events"] == []
        code, missing = _get_json(f"{cluster.url}/simulator/v1/nodes/nope/nvml")
        assert code == 404
        assert missing["kind"] == "Status"

        # The kubelets' pod-resources view, as a node-mode exporter reads it: the device-plugin
        # GPUs the plugin reports Healthy; none on a DRA node; an unknown node is no answer.
        uuids = cluster.call(lambda c: [g.uuid for g in c.fleet.nodes["dp-0"].gpus])
        allocatable = _reader(cluster.url, "dp-0").allocatable()
        assert allocatable is not None
        assert [allocatable.lists(u) for u in uuids] == [True, False, True, True]
        assert _reader(cluster.url, "dra-0").allocatable() == Allocatable({})
        nowhere = _reader(cluster.url, "nope")
        assert nowhere.allocatable() is None and nowhere.failures == 1


def _reader(url: str, node: str) -> FetchingReader:
    """The node's pod-resources as a node-mode exporter reads them (`--pod-resources sim:URL`)."""
    return FetchingReader(node, RemotePodResources(url, node))


def test_faults_injected_over_http_are_validated_and_applied() -> None:
    with running_cluster(SCENARIO, speed=20, token="s3cret") as cluster:
        body = json.dumps({"fault": "device-unhealthy", "device": {"node": "dp-0", "gpu": 9}}).encode()
        code, _ = _get_json(f"{cluster.url}/simulator/v1/faults", data=body)
        assert code == 401
        code, error = _get_json(f"{cluster.url}/simulator/v1/faults", token="s3cret", data=body)
        assert code == 400
        assert error["message"] == "<request>:1: device.gpu: 9 is out of range (node dp-0 has 4 GPUs)"
        good = json.dumps({"fault": "device-unhealthy", "device": {"node": "dp-0", "gpu": 2}}).encode()
        code, accepted = _get_json(f"{cluster.url}/simulator/v1/faults", token="s3cret", data=good)
        assert code == 201
        assert accepted["accepted"]["fault"] == "device-unhealthy"
        cluster.wait_for(
            lambda c: c.store.get("nodes", "dp-0")["status"]["allocatable"]["nvidia.com/gpu"] == "3"
        )

        cluster.inject({"fault": "ecc", "device": {"node": "dp-0", "gpu": 0}, "corrected": 3})
        cluster.wait_for(lambda c: c.fleet.gpu("dp-0", 0).ecc_corrected == 3)
