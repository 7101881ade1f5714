"""The Kubernetes version the simulated apiserver speaks as, and what it serves because of it.

Aspects: `/version` says v1.37.0 by default and v1.36.0 when asked; 1.37 serves DeviceTaintRule at
resource.k8s.io v1 and v1beta2 (through the official client, and in discovery); 1.36 does not
serve it at all by default (404, absent from discovery, while the simulator's own readers see
an empty table), and with DRADeviceTaintRules=true serves it at v1beta2 only, stored as v1beta2;
unknown versions and gates are refused with the flag named; the `gpuhealth sim` flags refuse
bad values as usage errors.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.apiserver.versions import KubernetesVersion, parse_feature_gates

if TYPE_CHECKING:
    from tests.simulator.conftest import ServedCluster

RULE_KEY = "devicetaintrules.resource.k8s.io"


def _rule(api_version: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "DeviceTaintRule",
        "metadata": {"name": "gpu-3-bad"},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-3"},
            "taint": {"key": "gpuhealth.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"},
        },
    }


def _resource_names(api: client.ApiClient, version: str) -> set[str]:
    resources = client.CustomObjectsApi(api).get_api_resources("resource.k8s.io", version)
    return {r.name for r in resources.resources}


def test_versions_and_gates_are_checked() -> None:
    with pytest.raises(ValueError, match=r"unsupported Kubernetes version '1\.35'"):
        KubernetesVersion("1.35")
    with pytest.raises(ValueError, match="unrecognized feature gate: Nope"):
        KubernetesVersion("1.36", {"Nope": True})
    assert parse_feature_gates("DRADeviceTaintRules=true, ") == {"DRADeviceTaintRules": True}
    with pytest.raises(ValueError, match="expected NAME=true or NAME=false"):
        parse_feature_gates("DRADeviceTaintRules")


def test_an_unserved_resource_keeps_an_empty_table_for_the_simulators_readers() -> None:
    store = Store(ManualClock(), kubernetes_version=KubernetesVersion("1.36"))
    assert store.list(RULE_KEY) == ([], str(store.resource_version))


@pytest.mark.integration
def test_1_37_serves_device_taint_rules_at_v1_and_v1beta2(make_cluster: Callable[..., ServedCluster]) -> None:
    served = make_cluster()
    with served.api_client() as api:
        assert client.VersionApi(api).get_code().git_version == "v1.37.0"
        assert client.VersionApi(api).get_code().minor == "37"
        assert "devicetaintrules" in _resource_names(api, "v1")
        assert "devicetaintrules" in _resource_names(api, "v1beta2")
        client.ResourceV1Api(api).create_device_taint_rule(_rule("resource.k8s.io/v1"))
        beta = client.ResourceV1beta2Api(api).read_device_taint_rule("gpu-3-bad")
        assert beta.api_version == "resource.k8s.io/v1beta2"


@pytest.mark.integration
def test_1_36_does_not_serve_device_taint_rules_by_default(
    make_cluster: Callable[..., ServedCluster],
) -> None:
    served = make_cluster(kubernetes_version=KubernetesVersion("1.36"))
    with served.api_client() as api:
        assert client.VersionApi(api).get_code().git_version == "v1.36.0"
        assert "devicetaintrules" not in _resource_names(api, "v1")
        assert "devicetaintrules" not in _resource_names(api, "v1beta2")
        assert "resourceslices" in _resource_names(api, "v1")
        for call in (
            lambda: client.ResourceV1Api(api).list_device_taint_rule(),
            lambda: client.ResourceV1beta2Api(api).list_device_taint_rule(),
        ):
            with pytest.raises(ApiException) as exc:
                call()
            assert exc.value.status == 404


@pytest.mark.integration
def test_1_36_with_the_gate_serves_them_at_v1beta2_only(make_cluster: Callable[..., ServedCluster]) -> None:
    served = make_cluster(kubernetes_version=KubernetesVersion("1.36", {"DRADeviceTaintRules": True}))
    with served.api_client() as api:
        assert "devicetaintrules" not in _resource_names(api, "v1")
        assert "devicetaintrules" in _resource_names(api, "v1beta2")
        created = client.ResourceV1beta2Api(api).create_device_taint_rule(_rule("resource.k8s.io/v1beta2"))
        assert created.api_version == "resource.k8s.io/v1beta2"
        with pytest.raises(ApiException) as exc:
            client.ResourceV1Api(api).read_device_taint_rule("gpu-3-bad")
        assert exc.value.status == 404
    stored = served.call(lambda: served.store.get(RULE_KEY, "gpu-3-bad"))
    assert stored["apiVersion"] == "resource.k8s.io/v1beta2"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kubernetes-version", "1.35"], "argument --kubernetes-version: invalid choice: '1.35'"),
        (["--feature-gates", "Nope=true"], "--feature-gates: unrecognized feature gate: Nope"),
        (["--feature-gates", "DRADeviceTaintRules"], "--feature-gates: invalid feature gate"),
    ],
)
def test_sim_refuses_bad_version_flags(flags: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuhealth", "sim", *flags], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
