"""The simulated kubelet seen through the official client over HTTP.

Aspects: a pod created with `spec.nodeName` turns Running; a DELETE with gracePeriodSeconds
returns the pod with deletionTimestamp (Terminating, visible to readers) and the pod is gone
once the kubelet has stopped it; the kubelet's Events are listed through the API.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuhealth.kube.config import api_client
from gpuhealth.testing.loopback import wait_until
from simulator.testing import running_cluster

pytestmark = pytest.mark.integration

SCENARIO: dict[str, Any] = {
    "name": "kubelet",
    "fleet": [{"name": "dp", "count": 1, "gpusPerNode": 4, "path": "device-plugin"}],
    "workloads": [],
}


def test_a_client_pod_runs_and_terminates_gracefully() -> None:
    with running_cluster(SCENARIO, speed=5) as cluster:
        core = client.CoreV1Api(api_client(str(cluster.kubeconfig_path)))
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name="client", annotations={"sim.gpuhealth.io/stop-after": "never"}),
            spec=client.V1PodSpec(
                node_name="dp-0",
                containers=[
                    client.V1Container(
                        name="main",
                        image="busybox:1.36",
                        command=["sleep", "3600"],
                        resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}),
                    )
                ],
            ),
        )
        core.create_namespaced_pod("default", pod)

        def running() -> bool:
            return core.read_namespaced_pod("client", "default").status.phase == "Running"

        wait_until("the pod Running", running, timeout=20)
        got = core.read_namespaced_pod("client", "default")
        assert got.status.container_statuses[0].allocated_resources_status[0].name == "nvidia.com/gpu"

        deleted = core.delete_namespaced_pod(
            "client", "default", body=client.V1DeleteOptions(grace_period_seconds=5)
        )
        assert deleted.metadata.deletion_timestamp is not None
        assert deleted.metadata.deletion_grace_period_seconds == 5
        terminating = core.read_namespaced_pod("client", "default")
        assert terminating.metadata.deletion_timestamp is not None

        def gone() -> bool:
            try:
                core.read_namespaced_pod("client", "default")
            except ApiException as exc:
                return exc.status == 404
            return False

        wait_until("the pod gone", gone, timeout=20)
        reasons = [e.reason for e in core.list_namespaced_event("default").items]
        assert {"Pulled", "Created", "Started", "Killing"} <= set(reasons)

        # gracePeriodSeconds in the query: refused when not a number, 0 removes the pod at once.
        core.create_namespaced_pod("default", pod)
        wait_until("the pod Running again", running, timeout=20)
        url = f"{cluster.url}/api/v1/namespaces/default/pods/client?gracePeriodSeconds="
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url + "soon", method="DELETE"))
        assert refused.value.code == 400
        assert "gracePeriodSeconds" in json.loads(refused.value.read())["message"]
        with urllib.request.urlopen(urllib.request.Request(url + "0", method="DELETE")) as resp:
            assert resp.status == 200
        assert gone()
