"""The migrator against the real eviction API, a real PodDisruptionBudget and real controllers.

Aspects: a Deployment of two checkpointing pods, each with a DRA claim from a template, is
placed by the real controllers and scheduler on a test Node; the test writes the pods' status
as their kubelet would (Running, Ready), so the real disruption controller counts them healthy.
One device is quarantined (the responder's DeviceTaintRule) and the responder's migrator,
acting as the responder's ServiceAccount, moves the job: it takes the job's Lease, asks for a
checkpoint, and once the workload commits it (the test, as the checkpoint agent), evicts. With
the budget allowing no disruption the real eviction API answers 429 and the move waits; once
the budget allows one it answers 201: the pod is terminating, and the real ReplicaSet
controller makes a replacement that the real scheduler places on the free device, never on the
quarantined one, once the evicted pod is gone and its claim released.
Of the pods' status the responder wrote only its `gpuhealth.io/serving` condition (False,
admitted by the pod-status admission policy): the apiserver's audit log, which keeps the body
of every `pods/status` write, shows its writes carrying `status.conditions` and nothing else
(no container status, no `allocatedResourcesStatus`, no phase), and no other write of a pod's
status by any gpuhealth account.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.resources import POD, RESOURCE_CLAIM
from gpuhealth.testing.loopback import wait_until
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import discover
from responder.migrate.executor import Migrator, MigratorSettings
from responder.migrate.plan import CHECKPOINT, COMMITTED, REQUESTED, SERVING, TOPOLOGY
from responder.reconcile.policy import QUARANTINE_TAINT, Enforce
from responder.records import Migration, Quarantine
from simulator.controlplane import ControlPlane
from tests.deploy.manifests import NAMESPACE
from tests.deploy.rbac import user
from tests.support.backends import shipped
from tests.support.controlplane import (
    DEPLOYMENT,
    POD_DISRUPTION_BUDGET,
    RESOURCE_CLAIM_TEMPLATE,
    admin,
    allocated_device,
    as_service_account,
    audit_events,
    claim_spec,
    dra_record,
    kubectl,
    namespace_ready,
    pod_spec,
    publish_devices,
    ready_node,
    run_as_kubelet,
)

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

NODE, NS, APP = "evict-0", "tenant-evict", "trainer"
TIMEOUT = 60.0


def _install_job(client: KubeClient, device_class: str) -> None:
    client.create(
        RESOURCE_CLAIM_TEMPLATE,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": NS},
            "spec": {"spec": claim_spec(device_class)},
        },
    )
    labels = {"app": APP}
    template = {
        "metadata": {"labels": labels, "annotations": {CHECKPOINT: "annotation", TOPOLOGY: "shardable"}},
        "spec": pod_spec(NODE, {"resourceClaimTemplateName": "one-gpu"}),
    }
    client.create(
        DEPLOYMENT,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": APP, "namespace": NS},
            "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": template},
        },
    )
    client.create(
        POD_DISRUPTION_BUDGET,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": APP, "namespace": NS},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": labels}},
        },
    )


def _placed(client: KubeClient) -> dict[str, str]:
    """Pod name -> allocated device of the job's live pods, once all are bound and allocated."""
    out = {}
    for claim in client.list(RESOURCE_CLAIM, namespace=NS).items:
        device = allocated_device(claim)
        for reserved in (claim.get("status") or {}).get("reservedFor") or []:
            if device is not None:
                out[reserved["name"]] = device
    return out


def _live_pods(client: KubeClient) -> list[dict[str, Any]]:
    pods = client.list(POD, namespace=NS, label_selector=f"app={APP}").items
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _bound_and_running(client: KubeClient, count: int) -> dict[str, str] | None:
    """Once `count` live pods are bound with their claims allocated: mark each Running and Ready
    (as the kubelet) and return pod -> device."""
    pods = [p for p in _live_pods(client) if p["spec"].get("nodeName") == NODE]
    placed = _placed(client)
    if len(pods) != count or any(p["metadata"]["name"] not in placed for p in pods):
        return None
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Running":
            run_as_kubelet(client, pod)
    return {p["metadata"]["name"]: placed[p["metadata"]["name"]] for p in pods}


def _budget(client: KubeClient, allowed: int) -> bool:
    status = client.get(POD_DISRUPTION_BUDGET, APP, namespace=NS).get("status") or {}
    return status.get("currentHealthy") == 2 and status.get("disruptionsAllowed") == allowed


def _only(record: Quarantine) -> Migration:
    [entry] = record.status.migrations
    return entry


def _only_serving_conditions_written(plane: ControlPlane) -> None:
    """Every `pods/status` write by a gpuhealth account in the job's namespace (there was at least
    one, admitted) is a patch of the pod's conditions with the serving condition False, nothing
    else. (Other tests of the session write refused ones on purpose, elsewhere.)"""
    writes = [
        e
        for e in audit_events(plane)
        if e["user"]["username"].startswith(f"system:serviceaccount:{NAMESPACE}:")
        and (ref := e.get("objectRef") or {}).get("namespace") == NS
        and (ref.get("resource"), ref.get("subresource")) == ("pods", "status")
    ]
    assert writes, "no pods/status write by a gpuhealth account"
    for event in writes:
        assert event["user"]["username"] == user(NAMESPACE, "gpuhealth-responder"), event["user"]
        assert (event["verb"], event["responseStatus"]["code"]) == ("patch", 200), event
        body = event["requestObject"]
        assert body.keys() <= {"metadata", "status"} and body["metadata"].keys() <= {"resourceVersion"}, body
        assert body["status"].keys() == {"conditions"}, body
        [serving] = [c for c in body["status"]["conditions"] if c["type"] == SERVING]
        assert serving["status"] == "False", serving


def test_a_checkpointed_job_is_evicted_through_the_real_api_under_a_real_budget(
    installed: ControlPlane,
) -> None:
    client = admin(installed)
    account = as_service_account(installed, client, NAMESPACE, "gpuhealth-responder")
    try:
        ready_node(client, NODE)
        device_class, _ = publish_devices(client, NODE, "gpu.evict.gpuhealth.test", 3)
        namespace_ready(client, NS)
        _install_job(client, device_class)
        placed = wait_until(
            "the job's two pods bound, allocated, running",
            lambda: _bound_and_running(client, 2),
            timeout=TIMEOUT,
        )
        wait_until("the budget to allow no disruption", lambda: _budget(client, 0), timeout=TIMEOUT)

        [(victim, device)] = sorted(placed.items())[:1]
        record = dra_record(client, NODE, device_class, device)
        rules = discover(account)
        Enforcer(account, rules).enforce(record, Enforce(QUARANTINE_TAINT, "xid-79", "NoSchedule"))

        clock = ManualClock(time.time())
        migrator = Migrator(account, MigratorSettings(), clock, backends=shipped(account))
        record = migrator.step(record, clock.now())  # takes the job's Lease
        record = migrator.step(record, clock.now())  # stops new requests, asks for the checkpoint
        pod = client.get(POD, victim, namespace=NS)
        serving = [c for c in pod["status"]["conditions"] if c["type"] == SERVING]
        assert [c["status"] for c in serving] == ["False"], pod["status"]["conditions"]
        key = pod["metadata"]["annotations"][REQUESTED]
        assert key == _only(record).key
        # The workload's checkpoint agent commits.
        client.patch(POD, victim, {"metadata": {"annotations": {COMMITTED: key}}}, namespace=NS)

        record = migrator.step(record, clock.now())  # the eviction decided, stored first
        assert _only(record).evicting and not _only(record).evictions
        record = migrator.step(record, clock.now())
        entry = _only(record)
        assert "refused by a budget (429)" in entry.detail, entry
        assert entry.retry_at and entry.evictions == ()
        assert not client.get(POD, victim, namespace=NS)["metadata"].get("deletionTimestamp")

        client.patch(POD_DISRUPTION_BUDGET, APP, {"spec": {"minAvailable": 1}}, namespace=NS)
        wait_until("the budget to allow one disruption", lambda: _budget(client, 1), timeout=TIMEOUT)
        clock.advance(60)  # past the retry time the 429 set
        record = migrator.step(record, clock.now())
        entry = _only(record)
        assert len(entry.evictions) == 1, entry
        assert client.get(POD, victim, namespace=NS)["metadata"].get("deletionTimestamp")

        # Its kubelet would stop it and remove it; then its claim is released (the real
        # resourceclaim controller), the device is free but tainted. The real ReplicaSet
        # controller replaces the pod; the real scheduler avoids the quarantined device.
        done = kubectl(installed, "delete", "pod", "-n", NS, victim, "--grace-period=0", "--force")
        assert done.returncode == 0, done.stderr
        now_placed = wait_until(
            "a replacement pod placed", lambda: _bound_and_running(client, 2), timeout=TIMEOUT
        )
        assert victim not in now_placed
        assert device not in now_placed.values()
        assert sorted(now_placed.values()) == sorted({f"gpu-{i}" for i in range(3)} - {device})
        _only_serving_conditions_written(installed)
    finally:
        account.close()
        client.close()
