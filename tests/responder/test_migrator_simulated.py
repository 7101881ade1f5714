"""The migration executor in a whole simulated fleet (responder.migrate.executor with kubelets, scheduler,
controllers and the workloads' checkpoint agents).

Aspects: a checkpointable Job on a quarantined device (the device fails in the fleet too: its
plugin reports it Unhealthy, so the kubelet keeps the job off it; no kubelet reads the node
annotation the Enforcer writes) is asked for its checkpoint, commits, is evicted and comes back on another
device, the move succeeds and its Lease is gone; a workload without a checkpoint is
unrecoverable (an Event on the pod, evidence in the record, the pod untouched); a disruption
budget that refuses (429) is waited on with the retry time in the record, never spun; two
records for two devices of one job: exactly one flow owns the job and the job moves once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.clock import SystemClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.errors import ApiError, NotFound
from gpuhealth.kube.events import EVENT
from gpuhealth.kube.resources import LEASE, POD, Resource
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import wait_until
from responder.enforce.node_annotation import DEVICE_PLUGIN
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import discover
from responder.migrate.executor import Migrator, MigratorSettings
from responder.migrate.leases import lease_name
from responder.migrate.plan import COMMITTED, UNRECOVERABLE_REASON
from responder.reconcile.policy import QUARANTINE_TAINT, Enforce
from responder.records import (
    QUARANTINES,
    Migration,
    MigrationOutcome,
    Phase,
    Quarantine,
    QuarantineSpec,
    from_object,
    record_name,
    to_object,
)
from simulator.testing import running_cluster
from tests.support.backends import shipped

pytestmark = pytest.mark.integration

CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
PDB = Resource("policy", "v1", "poddisruptionbudgets", namespaced=True)
DEADLINE = 60.0

SCENARIO: dict[str, Any] = {
    "name": "migrations",
    "fleet": [{"name": "gpu-dp", "count": 2, "gpusPerNode": 4, "path": "device-plugin"}],
    "workloads": [
        {
            "name": "train",
            "namespace": "ml",
            "kind": "Job",
            "replicas": 2,
            "gpusPerPod": 1,
            "checkpoint": {"mode": "annotation", "commitAfter": "2s"},
            "topology": "fixed",
        },
        {"name": "infer", "namespace": "serve", "kind": "Deployment", "replicas": 1, "gpusPerPod": 1},
        {
            "name": "web",
            "namespace": "web",
            "kind": "Deployment",
            "replicas": 1,
            "gpusPerPod": 1,
            "checkpoint": {"mode": "annotation", "commitAfter": "1s"},
        },
    ],
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with running_cluster(SCENARIO, speed=20) as handle:
        yield handle


@pytest.fixture
def client(cluster: Any) -> Iterator[KubeClient]:
    kube = KubeClient(KubeTransport(api_client(str(cluster.kubeconfig_path))))
    try:
        kube.get(CRDS, "devicequarantines.gpuhealth.io")
    except NotFound:
        kube.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
        wait_until("the CRD is served", lambda: _served(kube), timeout=DEADLINE)
    try:
        yield kube
    finally:
        kube.close()


def _served(kube: KubeClient) -> bool:
    try:
        kube.list(QUARANTINES)
    except NotFound:
        return False
    return True


def device_of(pod: dict[str, Any]) -> str | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for entry in status.get("allocatedResourcesStatus") or []:
            for resource in entry.get("resources") or []:
                return str(resource["resourceID"])
    return None


def running(client: KubeClient, namespace: str, name_prefix: str) -> list[dict[str, Any]]:
    pods = client.list(POD, namespace=namespace).items
    return [
        p
        for p in pods
        if p["metadata"]["name"].startswith(name_prefix)
        and (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
        and device_of(p)
    ]


def quarantine(cluster: Any, client: KubeClient, pod: dict[str, Any]) -> Quarantine:
    """A stored, enforced record for the device `pod` holds, which its plugin reports Unhealthy."""
    node, device = pod["spec"]["nodeName"], device_of(pod)
    assert device is not None
    gpu = cluster.call(lambda c: next(g.index for g in c.fleet.nodes[node].gpus if g.uuid == device))
    cluster.inject({"fault": "device-unhealthy", "device": {"node": node, "gpu": gpu}})
    spec = QuarantineSpec(
        node=node,
        device=device,
        path=DEVICE_PLUGIN,
        reason="Unhealthy",
        actor="alert/GPUDeviceUnhealthy",
        expires_at="2030-01-01T00:00:00Z",
        uuid=device,
    )
    obj = to_object(Quarantine(name=record_name(node, device), spec=spec))
    obj.pop("status")
    record = from_object(client.create(QUARANTINES, obj))
    record = record.with_phase(Phase.QUARANTINED, time="2026-11-30T10:00:00Z", actor="test", message="m")
    Enforcer(client, discover(client)).enforce(record, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))
    return record


def migrate(
    migrator: Migrator, records: list[Quarantine], until: Callable[[list[Quarantine]], bool]
) -> list[Quarantine]:
    """Steps every record (as the reconciler would) until `until` holds; the records as they end."""

    def step() -> bool:
        for i, r in enumerate(records):
            # The device's pods may not be readable (injected faults): the reconciler retries
            # such a record, as this loop does.
            with contextlib.suppress(ApiError):
                records[i] = migrator.step(r, time.time())
        return until(records)

    wait_until("the migrations reach the expected state", step, timeout=DEADLINE)
    return records


def the(record: Quarantine) -> Migration:
    assert len(record.status.migrations) == 1, record.status.migrations
    return record.status.migrations[0]


def test_a_checkpointed_job_moves_off_the_device_and_one_flow_owns_it(
    cluster: Any, client: KubeClient
) -> None:
    pods = wait_until(
        "both train pods run", lambda: len(p := running(client, "ml", "train")) == 2 and p, timeout=DEADLINE
    )
    before = {p["metadata"]["uid"] for p in pods}
    devices = {device_of(p) for p in pods}
    records = [quarantine(cluster, client, p) for p in pods]  # two devices of one job fail together
    migrator = Migrator(client, MigratorSettings(node_in_flight=2), SystemClock(), backends=shipped(client))

    records = migrate(migrator, records, lambda rs: any(the(r).started_at for r in rs))
    owners = {r.name for r in records if the(r).started_at}
    assert len(owners) == 1  # exactly one flow took the job's Lease
    lease = client.get(LEASE, lease_name(the(records[0]).owner), namespace="ml")
    assert lease["spec"]["holderIdentity"] in owners

    records = migrate(
        migrator, records, lambda rs: all(the(r).outcome is MigrationOutcome.SUCCEEDED for r in rs)
    )
    owner = next(r for r in records if r.name in owners)
    assert len(the(owner).evictions) == 2 and the(owner).requested_at
    assert all(not the(r).evictions for r in records if r.name not in owners)
    with pytest.raises(NotFound):
        client.get(LEASE, lease_name(the(owner).owner), namespace="ml")
    after = wait_until(
        "the job runs again", lambda: len(p := running(client, "ml", "train")) == 2 and p, timeout=DEADLINE
    )
    assert not before & {p["metadata"]["uid"] for p in after}
    assert not devices & {device_of(p) for p in after}  # the quarantine kept them off both devices
    assert all(p["metadata"]["annotations"].get(COMMITTED) is None for p in after)


def test_work_without_a_checkpoint_is_unrecoverable(cluster: Any, client: KubeClient) -> None:
    pods = wait_until("the infer pod runs", lambda: running(client, "serve", "infer"), timeout=DEADLINE)
    record = quarantine(cluster, client, pods[0])
    migrator = Migrator(client, MigratorSettings(), SystemClock(), backends=shipped(client))
    [record] = migrate(migrator, [record], lambda rs: the(rs[0]).outcome.finished)
    entry = the(record)
    assert entry.outcome is MigrationOutcome.UNRECOVERABLE and "no checkpoint" in entry.detail
    assert [e.pod for e in entry.evidence] == [pods[0]["metadata"]["name"]]
    events = [
        e
        for e in client.list(EVENT, namespace="serve").items
        if e.get("reason") == UNRECOVERABLE_REASON
        and e["involvedObject"]["name"] == pods[0]["metadata"]["name"]
    ]
    assert len(events) == 1 and events[0]["type"] == "Warning"
    still = client.get(POD, pods[0]["metadata"]["name"], namespace="serve")
    assert still["metadata"]["uid"] == pods[0]["metadata"]["uid"] and not still["metadata"].get(
        "deletionTimestamp"
    )
    assert the(from_object(to_object(record))) == entry


def test_a_budget_that_refuses_is_waited_on_never_spun(cluster: Any, client: KubeClient) -> None:
    pods = wait_until("the web pod runs", lambda: running(client, "web", "web"), timeout=DEADLINE)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "web"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
    }
    client.create(PDB, budget)
    record = quarantine(cluster, client, pods[0])
    migrator = Migrator(client, MigratorSettings(), SystemClock(), backends=shipped(client))
    [record] = migrate(migrator, [record], lambda rs: bool(the(rs[0]).retry_at))
    entry = the(record)
    assert entry.outcome is MigrationOutcome.WAITING and "429" in entry.detail and not entry.evictions
    # Until the retry time, steps change nothing: no second eviction is tried.
    record = migrator.step(record, time.time())
    assert the(record).retry_at == entry.retry_at
    assert (
        client.get(POD, pods[0]["metadata"]["name"], namespace="web")["metadata"]["uid"]
        == pods[0]["metadata"]["uid"]
    )
    client.delete(PDB, "web", namespace="web")
    [record] = migrate(
        migrator,
        [record],
        lambda rs: the(rs[0]).outcome is MigrationOutcome.SUCCEEDED,
    )
    assert len(the(record).evictions) == 1
