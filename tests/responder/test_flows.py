"""The responder's whole flow on a simulated fleet, for both paths, with one leader and with the
leader replaced at every step.

Aspects: a checkpointable Job holds a device that fails; the alert, delivered through the
`Recorder` (the webhook's sink), opens the record; the reconciler (migrator hooked in as the
service does) enforces it, asks the job for its checkpoint, evicts it once committed, and the
Job comes back on another device (never the quarantined one); the alert resolves and the device
walks Probing -> Canary -> Stabilizing -> Ramp -> Released with real probe and canary Jobs; the
history holds every phase in order, the enforcement is gone, and every effect landed once (one
rule or annotation, one checkpoint request and one eviction per pod, one migration Lease, one
probe and one canary Job). The same flow with two replicas (each its own client) handing over
whenever the record moved on: a new leader continues from the records alone, same end, same
single effects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.clock import ManualClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.resources import NAMESPACE, Resource
from gpuhealth.kube.transport import KubeTransport
from responder.health import StaticHealth
from responder.migration import REQUESTED
from responder.policy import Health
from responder.recorder import QUARANTINES, Recorder
from responder.records import MigrationOutcome, Phase, Quarantine
from simulator.fleet.objects import gpu_uuid
from simulator.testing import running_cluster
from tests.support.flows import (
    NS,
    WALK,
    Effect,
    Flow,
    Replica,
    alert_labels,
    enforced_on_node,
    new_replica,
    rule_present,
    running,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
GPUS = 2
SCENARIO: dict[str, Any] = {
    "name": "flows",
    "fleet": [
        {"name": "dra", "count": 1, "gpusPerNode": GPUS, "path": "dra"},
        {"name": "dp", "count": 1, "gpusPerNode": GPUS, "path": "device-plugin"},
    ],
    "workloads": [
        {
            "name": f"train-{group}",
            "namespace": f"ml-{group}",
            "kind": "Job",
            "replicas": 1,
            "gpusPerPod": 1,
            "checkpoint": {"mode": "annotation", "commitAfter": "1s"},
            "nodeGroup": group,
        }
        for group in ("dra", "dp")
    ],
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with running_cluster(SCENARIO, speed=20) as handle:
        client = KubeClient(KubeTransport(api_client(str(handle.kubeconfig_path))))
        try:
            client.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
            client.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
            wait_until(lambda: _served(client), "the CRD is served")
        finally:
            client.close()
        yield handle


def _served(client: KubeClient) -> bool:
    try:
        client.list(QUARANTINES)
    except NotFound:
        return False
    return True


class World:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.client = KubeClient(KubeTransport(api_client(str(kubeconfig))))
        self.clock = ManualClock()
        self.health = StaticHealth()
        for node, dra in (("dra-0", True), ("dp-0", False)):
            for i in range(GPUS):
                self.health.set(node, _device(node, i, dra=dra), Health.HEALTHY, 0.0)
        self.effects: Counter[Effect] = Counter()
        self.replicas: list[Replica] = []

    def replica(self) -> Replica:
        replica = new_replica(self.kubeconfig, self.effects, self.health, self.clock)
        self.replicas.append(replica)
        return replica

    def flow(self, *, dra: bool) -> tuple[Flow, dict[str, Any]]:
        group = "dra" if dra else "dp"
        namespace, node = f"ml-{group}", f"{group}-0"
        [(pod, device)] = wait_until(lambda: running(self.client, namespace, dra=dra), "the job runs")
        index = int(device.rsplit("-", 1)[1]) if dra else _index(node, device)
        labels = alert_labels(node, device, dra=dra, uuid=gpu_uuid(node, index))
        recorder = Recorder(self.client, self.clock)
        flow = Flow(self.client, self.health, self.clock, recorder, node, device, labels, namespace, dra)
        return flow, pod

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()
        self.client.close()


def _device(node: str, index: int, *, dra: bool) -> str:
    return f"gpu.nvidia.com/{node}/gpu-{index}" if dra else gpu_uuid(node, index)


def _index(node: str, uuid: str) -> int:
    return next(i for i in range(GPUS) if gpu_uuid(node, i) == uuid)


@pytest.fixture
def world(cluster: Any) -> Iterator[World]:
    w = World(cluster.kubeconfig_path)
    try:
        yield w
    finally:
        w.close()


def phases(seen: list[Quarantine]) -> list[Phase]:
    walked: list[Phase] = []
    for entry in seen[-1].status.history:
        if not walked or walked[-1] != entry.phase:
            walked.append(entry.phase)
    return walked


def check_end(w: World, flow: Flow, pod: dict[str, Any], record: Quarantine) -> None:
    """The end state and the effects, the same whoever led."""
    assert phases([record]) == list(WALK)
    # The job moved once, off the device, and the quarantine kept it off while it held.
    [migration] = record.status.migrations
    assert migration.outcome is MigrationOutcome.SUCCEEDED
    assert len(migration.evictions) == 1 and migration.requested_at
    [(moved, device)] = wait_until(lambda: running(w.client, flow.namespace, dra=flow.dra), "the job runs")
    assert moved["metadata"]["uid"] != pod["metadata"]["uid"]
    assert device != flow.device
    # The enforcement is gone.
    if flow.dra:
        assert not rule_present(w.client, record.name)
    else:
        assert not enforced_on_node(w.client, flow.node, flow.device)
    # Every effect landed once.
    effects = w.effects
    evictions = {k: n for k, n in effects.items() if k[1] == "pods/eviction"}
    assert evictions == {("create", "pods/eviction", pod["metadata"]["name"]): 1}
    requests = {k: n for k, n in effects.items() if k[0] == "patch" and k[1].startswith(f"pods:{REQUESTED}=")}
    assert list(requests.values()) == [1] and [k[2] for k in requests] == [pod["metadata"]["name"]]
    leases = {k: n for k, n in effects.items() if k[:2] == ("create", "leases")}
    assert list(leases.values()) == [1]
    jobs = {k: n for k, n in effects.items() if k[:2] == ("create", "jobs")}
    assert sorted(jobs.values()) == [1, 1] and len(jobs) == 2  # one probe, one canary
    if flow.dra:
        # One rule, its taint turned to the canary's at Ramp (an update), deleted at release.
        for verb in ("create", "delete"):
            assert {k: n for k, n in effects.items() if k[:2] == (verb, "devicetaintrules")} == {
                (verb, "devicetaintrules", record.name): 1
            }


@pytest.mark.parametrize("dra", [True, False], ids=["dra", "device-plugin"])
def test_one_leader_moves_the_job_and_releases_the_device(world: World, dra: bool) -> None:
    w = world
    flow, pod = w.flow(dra=dra)
    leader = w.replica()
    flow.fire()
    record = flow.drive(lambda _: leader)
    check_end(w, flow, pod, record)


@pytest.mark.parametrize("dra", [True, False], ids=["dra", "device-plugin"])
def test_the_leader_killed_at_every_step_changes_nothing(world: World, dra: bool) -> None:
    w = world
    flow, pod = w.flow(dra=dra)
    replicas = [w.replica(), w.replica()]
    current = {"index": 0, "status": None, "handovers": 0}

    def leader(record: Quarantine) -> Replica:
        # Whenever the record moved on (a phase, a migration step), the leader is gone and the
        # other replica takes over from what is stored.
        if current["status"] is not None and current["status"] != record.status:
            current["index"] = 1 - int(current["index"] or 0)
            current["handovers"] = int(current["handovers"] or 0) + 1
        current["status"] = record.status
        return replicas[int(current["index"] or 0)]

    flow.fire()
    record = flow.drive(leader)
    assert int(current["handovers"] or 0) >= len(WALK) - 1
    check_end(w, flow, pod, record)
