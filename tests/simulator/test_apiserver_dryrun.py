"""Server-side dry run (`dryRun=All`) on the simulated apiserver, through the official client.

Aspects: create answers 201 with the defaulted object, a uid and creationTimestamp but no
resourceVersion, and stores nothing; update, patch and status-subresource writes answer the
changed object at the unchanged resourceVersion; delete and deletecollection answer as if done and
delete nothing (a finalized object comes back with its deletionTimestamp); a dry run is still
validated (422) and still conflicts (409); no dry run reaches a watch; an unknown dryRun value is
422 as the apiserver words it; a dry run leaves the seeded uid sequence alone; kubectl's
`--dry-run=server` works against the simulator.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.apiserver.validation import WriteOptions
from tests.simulator.conftest import ServedCluster

pytestmark = pytest.mark.integration


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def http() -> urllib3.PoolManager:
    return urllib3.PoolManager()


def _rv(cluster: ServedCluster) -> int:
    return cluster.call(lambda: cluster.store.resource_version)


def test_dry_run_create_answers_the_defaulted_object_and_stores_nothing(
    cluster: ServedCluster, core: client.CoreV1Api, make_pod: Callable[..., dict[str, Any]]
) -> None:
    before = _rv(cluster)
    created = core.create_namespaced_pod("default", make_pod("p"), dry_run="All")
    assert created.metadata.uid and created.metadata.creation_timestamp is not None
    assert created.metadata.resource_version is None
    assert created.spec.restart_policy == "Always" and created.spec.service_account_name == "default"
    assert created.status.phase == "Pending" and created.status.qos_class == "BestEffort"
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("p", "default")
    assert exc.value.status == 404
    assert _rv(cluster) == before


def test_dry_run_update_patch_and_status_change_nothing(
    cluster: ServedCluster, core: client.CoreV1Api, make_pod: Callable[..., dict[str, Any]]
) -> None:
    stored = core.create_namespaced_pod("default", make_pod("p", labels={"app": "a"}))
    rv = stored.metadata.resource_version
    stored.metadata.labels = {"app": "b"}
    replaced = core.replace_namespaced_pod("p", "default", stored, dry_run="All")
    assert replaced.metadata.labels == {"app": "b"} and replaced.metadata.resource_version == rv
    patched = core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "c"}}}, dry_run="All")
    assert patched.metadata.labels == {"app": "c"} and patched.metadata.resource_version == rv
    status = core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}}, dry_run="All")
    assert status.status.phase == "Running"
    current = core.read_namespaced_pod("p", "default")
    assert current.metadata.labels == {"app": "a"} and current.status.phase == "Pending"
    assert current.metadata.resource_version == rv


def test_dry_run_delete_and_deletecollection_delete_nothing(
    cluster: ServedCluster,
    core: client.CoreV1Api,
    http: urllib3.PoolManager,
    make_pod: Callable[..., dict[str, Any]],
) -> None:
    core.create_namespaced_pod("default", make_pod("p"))
    core.create_namespaced_pod("default", make_pod("kept", finalizers=["example.com/hold"]))
    deleted = core.delete_namespaced_pod("p", "default", dry_run="All")
    assert deleted.metadata.name == "p"
    held = core.delete_namespaced_pod("kept", "default", dry_run="All")
    assert held.metadata.deletion_timestamp is not None
    core.create_namespaced_config_map("default", {"metadata": {"name": "c", "labels": {"x": "1"}}})
    # The client types a deletecollection answer as a Status; the apiserver sends the deleted list.
    gone = http.request(
        "DELETE", f"{cluster.url}/api/v1/namespaces/default/configmaps?labelSelector=x%3D1&dryRun=All"
    )
    assert [item["metadata"]["name"] for item in json.loads(gone.data)["items"]] == ["c"]
    assert core.read_namespaced_pod("p", "default").metadata.deletion_timestamp is None
    assert core.read_namespaced_pod("kept", "default").metadata.deletion_timestamp is None
    assert core.read_namespaced_config_map("c", "default").metadata.name == "c"


def test_dry_run_is_validated_and_conflicts_like_a_real_write(
    core: client.CoreV1Api, make_pod: Callable[..., dict[str, Any]]
) -> None:
    bad = make_pod("Bad_Pod")
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("default", bad, dry_run="All")
    assert exc.value.status == 422
    core.create_namespaced_pod("default", make_pod("p"))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("default", make_pod("p"), dry_run="All")
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"


def test_no_dry_run_reaches_a_watch(
    cluster: ServedCluster, core: client.CoreV1Api, make_pod: Callable[..., dict[str, Any]]
) -> None:
    start = str(_rv(cluster))
    core.create_namespaced_pod("default", make_pod("dry"), dry_run="All")
    core.create_namespaced_pod("default", make_pod("real"))
    events = watch.Watch().stream(
        core.list_namespaced_pod, "default", resource_version=start, timeout_seconds=5
    )
    first = next(iter(events))
    # The first event after the dry run is the real create: the dry one never happened.
    assert (first["type"], first["object"].metadata.name) == ("ADDED", "real")


def test_unknown_dry_run_value_is_422_as_the_apiserver_words_it(
    cluster: ServedCluster, http: urllib3.PoolManager, make_pod: Callable[..., dict[str, Any]]
) -> None:
    resp = http.request(
        "POST",
        f"{cluster.url}/api/v1/namespaces/default/pods?dryRun=Some",
        body=json.dumps(make_pod("p")).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 422
    status = json.loads(resp.data)
    assert status["message"] == (
        'CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: ["Some"]: '
        'supported values: "All"'
    )
    delete = http.request("DELETE", f"{cluster.url}/api/v1/namespaces/default/pods/p?dryRun=x")
    assert delete.status == 422 and json.loads(delete.data)["message"].startswith("DeleteOptions.meta.k8s.io")


def test_a_dry_run_leaves_the_seeded_uid_sequence_alone() -> None:
    body = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "m", "image": "i"}]}}
    plain, dry = Store(ManualClock(), seed=3), Store(ManualClock(), seed=3)
    dry.create(
        "pods", {**body, "metadata": {"name": "q"}}, namespace="default", options=WriteOptions(dry_run=True)
    )
    assert (
        dry.create("pods", body, namespace="default")["metadata"]["uid"]
        == plain.create("pods", body, namespace="default")["metadata"]["uid"]
    )
    assert dry.list("pods", "default")[0][0]["metadata"]["name"] == "p"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_dry_run_server(cluster: ServedCluster, tmp_path: Path, make_pod: Callable[..., Any]) -> None:
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(make_pod("kp")))
    done = subprocess.run(
        [
            "kubectl",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "create",
            "-f",
            str(manifest),
            "--dry-run=server",
            "--validate=false",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answered = json.loads(done.stdout)
    assert answered["metadata"]["uid"] and answered["spec"]["dnsPolicy"] == "ClusterFirst"
    assert cluster.call(lambda: cluster.store.list("pods", "default"))[0] == []
