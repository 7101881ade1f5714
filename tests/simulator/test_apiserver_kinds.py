"""Kinds served as stored objects, through the official client and kubectl.

Aspects: Services get a ClusterIP from 10.96.0.0/12 with clusterIPs, ipFamilies and
ipFamilyPolicy set, headless ones keep "None", an address asked for is honoured, a taken or
out-of-range one is 422 worded as the real allocator; the `kubernetes` Service and the system
PriorityClasses exist from the start; every namespace (bootstrap and new) has the
`kubernetes.io/metadata.name` label and a `default` ServiceAccount; Secrets,
ReplicationControllers, Endpoints, EndpointSlices, events.k8s.io Events, RBAC objects and
APIServices are created, read and validated; a pod naming a missing RuntimeClass is refused (403)
as the RuntimeClass admission plugin refuses it; discovery gives scope, short names, categories and
verbs as kubectl reads them (`kubectl api-resources`, `kubectl get all`, short names).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuhealth.clock import ManualClock
from simulator.apiserver import service_ips
from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import Store

if TYPE_CHECKING:
    from tests.simulator.conftest import ServedCluster


def _service(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80}], **spec},
    }


def test_dynamic_addresses_avoid_the_static_band_and_used_ones() -> None:
    rng = random.Random(1)
    used = {service_ips.kubernetes_service_ip()}
    for i in range(50):
        svc = _service(f"s{i}")
        service_ips.allocate(svc, used, rng)
        ip = svc["spec"]["clusterIP"]
        assert ip not in used
        assert int(ip.split(".")[1]) >= 97  # above 10.96.0.0 + 1/16 of the /12
        used.add(ip)


def test_ipv6_is_not_configured() -> None:
    svc = _service("v6", ipFamilies=["IPv6"])
    with pytest.raises(ApiError) as exc:
        service_ips.allocate(svc, set(), random.Random(1))
    assert (
        exc.value.message == 'Service "v6" is invalid: spec.ipFamilies[0]: Invalid value: "IPv6": '
        "not configured on this cluster"
    )


@pytest.mark.integration
def test_services_get_cluster_ips(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    svc = core.create_namespaced_service("default", _service("web"))
    assert svc.spec.cluster_ip.startswith("10.")
    assert svc.spec.cluster_ips == [svc.spec.cluster_ip]
    assert (svc.spec.ip_families, svc.spec.ip_family_policy, svc.spec.type) == (
        ["IPv4"],
        "SingleStack",
        "ClusterIP",
    )
    headless = core.create_namespaced_service("default", _service("db", clusterIP="None"))
    assert (headless.spec.cluster_ip, headless.spec.cluster_ips) == ("None", ["None"])
    fixed = core.create_namespaced_service("default", _service("dns", clusterIP="10.96.0.10"))
    assert fixed.spec.cluster_ips == ["10.96.0.10"]
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_service("default", _service("dns2", clusterIP="10.96.0.10"))
    assert exc.value.status == 422
    assert json.loads(exc.value.body)["message"] == (
        'Service "dns2" is invalid: spec.clusterIPs: Invalid value: []string{"10.96.0.10"}: '
        "failed to allocate IP 10.96.0.10: provided IP is already allocated"
    )
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_service("default", _service("far", clusterIP="192.168.0.1"))
    assert (
        "is not in the valid range. The range of valid IPs is 10.96.0.0/12"
        in json.loads(exc.value.body)["message"]
    )
    kubernetes = core.read_namespaced_service("kubernetes", "default")
    assert kubernetes.spec.cluster_ip == "10.96.0.1"
    by_ip = core.list_namespaced_service("default", field_selector="spec.clusterIP=10.96.0.10")
    assert [s.metadata.name for s in by_ip.items] == ["dns"]


@pytest.mark.integration
def test_every_namespace_has_its_name_label_and_a_default_service_account(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team", labels={"a": "b"})))
    for ns in ("default", "kube-system", "team"):
        assert core.read_namespace(ns).metadata.labels["kubernetes.io/metadata.name"] == ns
        assert core.read_namespaced_service_account("default", ns).metadata.namespace == ns
    assert core.read_namespace("team").metadata.labels["a"] == "b"
    selected = core.list_namespace(label_selector="kubernetes.io/metadata.name in (team, default)")
    assert sorted(n.metadata.name for n in selected.items) == ["default", "team"]


@pytest.mark.integration
def test_stored_kinds_round_trip(cluster: ServedCluster, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_secret(
        "default", {"metadata": {"name": "s"}, "type": "Opaque", "data": {"k": "dg=="}}
    )
    assert core.read_namespaced_secret("s", "default").data == {"k": "dg=="}
    assert [
        s.metadata.name for s in core.list_namespaced_secret("default", field_selector="type=Opaque").items
    ] == ["s"]
    rc = {
        "metadata": {"name": "rc"},
        "spec": {
            "replicas": 1,
            "selector": {"app": "rc"},
            "template": {
                "metadata": {"labels": {"app": "rc"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
    }
    assert core.create_namespaced_replication_controller("default", rc).metadata.generation == 1
    core.create_namespaced_endpoints("default", {"metadata": {"name": "web"}, "subsets": []})
    client.DiscoveryV1Api(api).create_namespaced_endpoint_slice(
        "default", {"metadata": {"name": "web-1"}, "addressType": "IPv4", "endpoints": []}
    )
    client.EventsV1Api(api).create_namespaced_event(
        "default",
        {
            "metadata": {"name": "e1"},
            "eventTime": "2026-11-30T10:00:00.000000Z",
            "reportingController": "gpuhealth.io/responder",
            "reportingInstance": "responder-0",
            "action": "Quarantine",
            "reason": "XID79",
            "type": "Warning",
            "regarding": {"kind": "Node", "name": "n1"},
        },
    )
    assert [e.reason for e in client.EventsV1Api(api).list_namespaced_event("default").items] == ["XID79"]
    rbac = client.RbacAuthorizationV1Api(api)
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}
    rbac.create_namespaced_role("default", {"metadata": {"name": "r"}, "rules": [rule]})
    rbac.create_cluster_role({"metadata": {"name": "cr"}, "rules": [rule]})
    subject = {"kind": "ServiceAccount", "name": "default", "namespace": "default"}
    rbac.create_namespaced_role_binding(
        "default",
        {
            "metadata": {"name": "rb"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [subject],
        },
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": "crb"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cr"},
            "subjects": [subject],
        }
    )
    assert rbac.read_cluster_role_binding("crb").role_ref.name == "cr"
    # The client checks types itself; the server's decoder is seen with a raw request (a wrong JSON
    # type is a 400 decoding error, as from the real apiserver, not a 422).
    bad = urllib3.PoolManager().request(
        "POST",
        f"{cluster.url}/apis/rbac.authorization.k8s.io/v1/clusterroles",
        body=json.dumps({"metadata": {"name": "bad"}, "rules": [{"verbs": "get"}]}),
        headers={"Content-Type": "application/json"},
    )
    assert bad.status == 400 and b"cannot unmarshal string" in bad.data
    client.ApiregistrationV1Api(api).create_api_service(
        {
            "metadata": {"name": "v1.gpuhealth.io"},
            "spec": {
                "group": "gpuhealth.io",
                "version": "v1",
                "groupPriorityMinimum": 1000,
                "versionPriority": 15,
            },
        }
    )
    classes = client.SchedulingV1Api(api).list_priority_class()
    assert {"system-node-critical", "system-cluster-critical"} <= {c.metadata.name for c in classes.items}


def _kubectl(served: ServedCluster, *args: str) -> str:
    proc = subprocess.run(
        ["kubectl", "--kubeconfig", str(served.kubeconfig), *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_sees_scopes_short_names_and_categories(make_cluster: Callable[..., ServedCluster]) -> None:
    served = make_cluster()
    table = _kubectl(served, "api-resources", "--no-headers")
    rows = {(line.split()[0], line.split()[-1]): line.split() for line in table.splitlines()}
    assert rows[("services", "Service")][1:4] == ["svc", "v1", "true"]
    assert rows[("serviceaccounts", "ServiceAccount")][1:4] == ["sa", "v1", "true"]
    assert rows[("priorityclasses", "PriorityClass")][1:4] == ["pc", "scheduling.k8s.io/v1", "false"]
    assert rows[("clusterroles", "ClusterRole")][1:3] == ["rbac.authorization.k8s.io/v1", "false"]
    assert rows[("apiservices", "APIService")][1:3] == ["apiregistration.k8s.io/v1", "false"]
    everything = _kubectl(served, "get", "all", "-n", "default", "-o", "name")
    assert "service/kubernetes" in everything.split()
    assert _kubectl(served, "get", "sa", "-n", "kube-system", "-o", "name").split() == [
        "serviceaccount/default"
    ]


def test_a_pod_naming_a_missing_runtime_class_is_refused_as_the_runtime_class_admission_does() -> None:
    store = Store(ManualClock())
    store.create("namespaces", {"metadata": {"name": "ns"}})
    pod = {
        "metadata": {"name": "check", "namespace": "ns"},
        "spec": {"runtimeClassName": "nvidia", "containers": [{"name": "c", "image": "i"}]},
    }
    with pytest.raises(ApiError) as refused:
        store.create("pods", pod)
    assert (refused.value.code, refused.value.reason) == (403, "Forbidden")
    assert refused.value.message == 'pods "check" is forbidden: pod rejected: RuntimeClass "nvidia" not found'
    store.create("runtimeclasses.node.k8s.io", {"metadata": {"name": "nvidia"}, "handler": "nvidia"})
    created = store.create("pods", pod)
    assert created["spec"]["runtimeClassName"] == "nvidia"
