"""The responder's whole flow on a simulated fleet: shared by the flow and leader-kill tests.

A `Replica` is what the service builds for a leader (its own API client, the Enforcer, the
job checks, Events, the breaker store, the migrator hooked in as `migrate`); a `Flow` drives
one device's quarantine from an alert to its release, alerts entering through the `Recorder`
(the webhook's sink), passes run by whichever replica the test makes the leader. Every write
the replicas make that lands is counted by verb, resource and name (`Effects`), so a test
can say that nothing was applied twice.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from gpuhealth.clock import ManualClock, SystemClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.resources import NAMESPACE, NODE, POD, RESOURCE_CLAIM, Resource
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import wait_until
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import discover
from responder.ladder import LADDER, Kind
from responder.migrate.executor import Migrator, MigratorSettings
from responder.migrate.plan import REQUESTED
from responder.reconcile.breaker_store import BreakerStore
from responder.reconcile.events import KubeEvents
from responder.reconcile.health import HealthSource, StaticHealth
from responder.reconcile.limits import BucketSettings
from responder.reconcile.policy import Health, PolicySettings
from responder.reconcile.reconciler import Reconciler, ReconcilerSettings
from responder.records import (
    QUARANTINES,
    Migration,
    MigrationOutcome,
    Phase,
    Quarantine,
    from_object,
)
from responder.webhook.intake import Alert
from responder.webhook.recorder import Recorder
from simulator.fleet.objects import gpu_uuid
from tests.support.holds import wiring

NS = "gpuhealth-system"
_LENGTHS: dict[str, Any] = {
    r.setting: 3600.0 if r.kind == Kind.CHECK else 5.0 for r in LADDER.rungs if r.setting
}
"""An hour for each check of the ladder (a real Job in the simulated cluster), 5 s for each wait."""
POLICY = PolicySettings(**_LENGTHS, backoff_seconds=300)
SETTINGS = ReconcilerSettings(policy=POLICY, bucket=BucketSettings(burst=50, per_hour=60))
DEADLINE = 90.0
WALK = (Phase.PENDING, Phase.QUARANTINED, *LADDER.phases, Phase.RELEASED)
"""Every phase of an uneventful quarantine, in order."""

Effect = tuple[str, str, str]
"""(verb, resource plural[/subresource], name) of a write that landed."""


class CountingClient(KubeClient):
    """A KubeClient that counts the writes that landed (a failed write applied nothing)."""

    effects: Counter[Effect]

    def create(self, resource: Resource, obj: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        created = super().create(resource, obj, *args, **kwargs)
        if not kwargs.get("dry_run"):
            sub = kwargs.get("subresource")
            plural = f"{resource.plural}/{sub}" if sub else resource.plural
            name = (obj.get("metadata") or {}).get("name") or (created.get("metadata") or {}).get("name")
            self.effects[("create", plural, str(name))] += 1
        return created

    def patch(self, resource: Resource, name: str, patch: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        patched = super().patch(resource, name, patch, *args, **kwargs)
        annotations = (patch.get("metadata") or {}).get("annotations") or {}
        for key, value in annotations.items():
            self.effects[("patch", f"{resource.plural}:{key}={value}", name)] += 1
        return patched

    def delete(self, resource: Resource, name: str, *args: Any, **kwargs: Any) -> Any:
        deleted = super().delete(resource, name, *args, **kwargs)
        self.effects[("delete", resource.plural, name)] += 1
        return deleted


def counting_client(kubeconfig: Path, effects: Counter[Effect]) -> CountingClient:
    client = CountingClient(KubeTransport(api_client(str(kubeconfig))))
    client.effects = effects
    return client


@dataclass
class Replica:
    """One responder replica's leader side: the reconciler with the migrator hooked in."""

    client: CountingClient
    reconciler: Reconciler

    def close(self) -> None:
        self.client.close()


def new_replica(
    kubeconfig: Path,
    effects: Counter[Effect],
    health: HealthSource,
    clock: ManualClock,
    settings: ReconcilerSettings = SETTINGS,
) -> Replica:
    client = counting_client(kubeconfig, effects)
    # The migrator judges leases on a monotonic clock of its own, as in the service.
    backends = Enforcer(client, discover(client))
    migrator = Migrator(client, MigratorSettings(), SystemClock(), backends=backends)
    reconciler = Reconciler(
        client,
        health=health,
        **wiring(client, backends),
        events=KubeEvents(client),
        breaker_store=BreakerStore(client, NS),
        settings=settings,
        clock=clock,
        registry=CollectorRegistry(),
        migrate=migrator.step,
    )
    return Replica(client, reconciler)


# ----- the fleet's side -------------------------------------------------------------------------


def plugin_device(pod: dict[str, Any]) -> str | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for entry in status.get("allocatedResourcesStatus") or []:
            for resource in entry.get("resources") or []:
                return str(resource["resourceID"])
    return None


def dra_device(client: KubeClient, pod: dict[str, Any]) -> str | None:
    """`<driver>/<pool>/<device>` of the claim reserved for `pod` (as the record names it)."""
    namespace, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
    for claim in client.list(RESOURCE_CLAIM, namespace=namespace).items:
        status = claim.get("status") or {}
        if not any(r.get("uid") == uid for r in status.get("reservedFor") or []):
            continue
        for result in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
            return f"{result['driver']}/{result['pool']}/{result['device']}"
    return None


def device_of(client: KubeClient, pod: dict[str, Any], *, dra: bool) -> str | None:
    if not (pod.get("status") or {}).get("containerStatuses"):
        return None
    return dra_device(client, pod) if dra else plugin_device(pod)


def running(client: KubeClient, namespace: str, *, dra: bool) -> list[tuple[dict[str, Any], str]]:
    """The namespace's running pods with the device each holds."""
    out = []
    for pod in client.list(POD, namespace=namespace).items:
        if (pod.get("status") or {}).get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
            continue
        device = device_of(client, pod, dra=dra)
        if device:
            out.append((pod, device))
    return out


def alert_labels(node: str, device: str, *, dra: bool, uuid: str) -> dict[str, str]:
    if dra:
        driver, pool, name = device.split("/")
        return {"device": device, "driver": driver, "pool": pool, "device_name": name, "uuid": uuid}
    return {"device": device, "uuid": device}


def delivery(status: str, node: str, labels: dict[str, str], *, starts_at: float) -> Alert:
    """One alert as the webhook parses it: the same episode (fingerprint, startsAt) both times."""
    return Alert(
        status=status,
        labels={"alertname": "GPUDeviceUnhealthy", "action": "quarantine", "node": node, **labels},
        annotations={},
        starts_at=starts_at,
        ends_at=None,
        fingerprint=f"fp-{node}-{labels['device']}",
    )


@dataclass
class Flow:
    """One device's quarantine, driven pass by pass by whichever replica `leader()` names."""

    client: KubeClient
    health: StaticHealth
    clock: ManualClock
    recorder: Recorder
    node: str
    device: str
    labels: dict[str, str]
    namespace: str
    dra: bool
    name: str = ""
    starts_at: float = 0.0
    seen: list[Quarantine] = field(default_factory=list)
    moved_to: str = ""
    """The device the job came back on while the quarantine held."""
    hardware: Callable[[dict[str, Any]], None] | None = None
    """Injects a fault into the simulated fleet (a timeline entry): the device itself failing."""

    def device_fault(self, kind: str) -> None:
        """Device plugin: the GPU fails (and recovers) in the fleet too, so its plugin reports it
        Unhealthy until the job has moved and its alert resolves, as on a real node. That, not
        the quarantine annotation (which no kubelet reads), keeps the device manager from
        handing it out again."""
        if not self.dra and self.hardware is not None:
            gpu = _index(self.node, self.device)
            self.hardware({"fault": kind, "device": {"node": self.node, "gpu": gpu}})

    def record(self) -> Quarantine:
        return from_object(self.client.get(QUARANTINES, self.name))

    def fire(self) -> None:
        self.device_fault("device-unhealthy")
        self.health.set(self.node, self.device, Health.UNHEALTHY)
        self.starts_at = self.clock.now() - 60
        outcomes = self.recorder.record_all([self._alert("firing")])
        assert len(outcomes) == 1
        [self.name] = [
            obj["metadata"]["name"]
            for obj in self.client.list(QUARANTINES).items
            if obj["spec"]["node"] == self.node and obj["spec"]["device"] == self.device
        ]

    def await_moved(self) -> None:
        """Wait for the job to run again (still Quarantined: the enforcement holds) and note
        where: never the quarantined device."""
        [(_, device)] = wait_until(
            "the job runs", lambda: running(self.client, self.namespace, dra=self.dra), timeout=DEADLINE
        )
        assert device != self.device, "the quarantined device was allocated again"
        self.moved_to = device

    def resolve(self) -> None:
        self.recorder.record_all([self._alert("resolved")])

    def _alert(self, status: str) -> Alert:
        return delivery(status, self.node, self.labels, starts_at=self.starts_at)

    def migration(self) -> Migration | None:
        migrations = self.record().status.migrations
        assert len(migrations) <= 1, migrations
        return migrations[0] if migrations else None

    def drive(self, leader: Callable[[Quarantine], Replica]) -> Quarantine:
        """Passes until Released, the world answering as it would: once the job has moved the
        device recovers (it reads Healthy again) and then its alert resolves, as on a real node
        (an alert resolving over a device that still reads Unhealthy starts no release).

        `leader(record)` names the replica that runs the next pass: it sees the record as
        stored, so a test can hand leadership over whenever the record moved on."""
        resolved = False

        def released() -> bool:
            nonlocal resolved
            record = self.record()
            if not self.seen or self.seen[-1].status != record.status:
                self.seen.append(record)
            phase = record.status.phase
            if phase == Phase.RELEASED:
                return True
            migration = record.status.migrations[0] if record.status.migrations else None
            if (
                not resolved
                and phase == Phase.QUARANTINED
                and migration is not None
                and migration.outcome is MigrationOutcome.SUCCEEDED
            ):
                self.await_moved()
                # The GPU is well again (the fleet and the metrics say so): its alert resolves.
                self.device_fault("recover")
                self.health.set(self.node, self.device, Health.HEALTHY, self.clock.now())
                self.resolve()
                resolved = True
            leader(record).reconciler.reconcile_once()
            self.clock.advance(0.5)
            return False

        wait_until(f"{self.name} released", released, timeout=DEADLINE)
        return self.record()


def enforced_on_node(client: KubeClient, node: str, device: str) -> bool:
    annotations = client.get(NODE, node)["metadata"].get("annotations") or {}
    return device in (annotations.get("gpuhealth.io/quarantined-devices") or "")


def rule_present(client: KubeClient, name: str) -> bool:
    rules = discover(client)
    assert rules is not None
    try:
        client.get(rules, name)
    except NotFound:
        return False
    return True


# ----- the world the tests share ---------------------------------------------------------------

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


def prepare(kubeconfig: Path) -> None:
    """The CRD and the responder's namespace, once per cluster."""
    client = KubeClient(KubeTransport(api_client(str(kubeconfig))))
    try:
        client.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
        client.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait_until("the CRD is served", lambda: _served(client), timeout=DEADLINE)
    finally:
        client.close()


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
        [(pod, device)] = wait_until(
            "the job runs", lambda: running(self.client, namespace, dra=dra), timeout=DEADLINE
        )
        index = int(device.rsplit("-", 1)[1]) if dra else _index(node, device)
        labels = alert_labels(node, device, dra=dra, uuid=gpu_uuid(node, index))
        recorder = Recorder(self.client, self.clock)
        flow = Flow(self.client, self.health, self.clock, recorder, node, device, labels, namespace, dra)
        flow.hardware = self.inject
        return flow, pod

    def inject(self, fault: dict[str, Any]) -> None:
        """One timeline entry through the simulator's own route (`POST /simulator/v1/faults`)."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        server = config["clusters"][0]["cluster"]["server"]
        request = urllib.request.Request(
            f"{server}/simulator/v1/faults",
            data=json.dumps(fault).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 201, answer.status

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()
        self.client.close()


def _device(node: str, index: int, *, dra: bool) -> str:
    return f"gpu.nvidia.com/{node}/gpu-{index}" if dra else gpu_uuid(node, index)


def _index(node: str, uuid: str) -> int:
    return next(i for i in range(GPUS) if gpu_uuid(node, i) == uuid)


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
    [(moved, device)] = wait_until(
        "the job runs", lambda: running(w.client, flow.namespace, dra=flow.dra), timeout=DEADLINE
    )
    assert moved["metadata"]["uid"] != pod["metadata"]["uid"]
    assert device == flow.moved_to != flow.device  # it stayed where it came back while quarantined
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
    checks = len(LADDER.checks())
    assert sorted(jobs.values()) == [1] * checks and len(jobs) == checks  # one Job per check
    if flow.dra:
        # One rule, its taint turned to the canary's at Ramp (an update), deleted at release.
        for verb in ("create", "delete"):
            assert {k: n for k, n in effects.items() if k[:2] == (verb, "devicetaintrules")} == {
                (verb, "devicetaintrules", record.name): 1
            }
