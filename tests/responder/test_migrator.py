"""The migration executor against a fake client (responder.migrate.executor).

Aspects: new requests stop through pods/status before the checkpoint request (behind the
readiness gate, once Ready is False; a stop that loses a race asks for nothing that pass); a
failed checkpoint is unrecoverable at once, its evidence in a ConfigMap owned by the record (the
pod's status, the device, its series, or why they could not be read); a move succeeds only once
its replacement runs on a healthy device (recovery time observed by path) and fails at the
replacement timeout; the checkpoint flow end to end (lease taken and owned by the record, checkpoint
requested once with the key, eviction with a dry run first only after the commit, success
once the targets are gone, lease released, counted once); work without a checkpoint is
unrecoverable (evidence in the record, an Event on the pod, nothing evicted); a 429 waits at
least 10 s and is kept in the record; 403 and the several-budgets 500 fail the move once,
escalated, never retried, while a plain 500 is retried like a 503; two records for two
devices of one job: one flow owns it; a lease another holds is taken only
after its duration has passed on our monotonic clock; the node cap is rebuilt from records;
restrict moves nothing; device-plugin replicas (`<uuid>::<n>`) and a ReplicaSet's Deployment;
DRA pods found through their claims; with the breaker open (`finish`) no move begins and one under
way ends; the device quarantined again (a new episode) with the job back on it: moved again,
under a new key, counted again.
"""

from __future__ import annotations

import builtins
import copy
import json
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuhealth.clock import ManualClock
from gpuhealth.kube.client import ObjectList
from gpuhealth.kube.errors import AlreadyExists, ApiError, Conflict, NotFound, TooManyRequests, Unavailable
from gpuhealth.kube.events import EVENT
from gpuhealth.kube.meta import rfc3339
from gpuhealth.kube.resources import Resource
from responder.enforce.node_annotation import DEVICE_PLUGIN
from responder.enforce.taint_rules import DRA
from responder.migrate.executor import Migrator, MigratorMetrics, MigratorSettings
from responder.migrate.leases import lease_name
from responder.migrate.plan import (
    COMMITTED,
    FAILED_REASON,
    REQUESTED,
    UNRECOVERABLE_REASON,
    MigrationSettings,
    Mode,
)
from responder.reconcile.work_lost import LAST_CHECKPOINT
from responder.records import (
    QUARANTINES,
    Migration,
    MigrationOutcome,
    Phase,
    Quarantine,
    QuarantineSpec,
    QuarantineStatus,
    from_object,
    to_object,
)
from tests.support.backends import shipped

UUID = "GPU-4a1c"
NOW = 1_800_000_000.0


class FakeClient:
    """Objects by (plural, namespace, name); evictions answered from a queue of errors."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.evictions: list[tuple[str, bool]] = []
        self.eviction_errors: list[ApiError] = []
        self.version = 0

    def _key(self, resource: Resource, name: str, namespace: str | None) -> tuple[str, str, str]:
        return (resource.plural, namespace or "", name)

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        obj["metadata"].setdefault("uid", f"uid-{obj['metadata']['name']}")
        return copy.deepcopy(obj)

    def add(self, resource: Resource, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[self._key(resource, meta["name"], meta.get("namespace"))] = obj
        self._stamp(obj)

    def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        try:
            return copy.deepcopy(self.objects[self._key(resource, name, namespace)])
        except KeyError:
            raise NotFound(name) from None

    def list(
        self, resource: Resource, *, namespace: str | None = None, field_selector: str | None = None
    ) -> ObjectList:
        items = []
        for (plural, ns, _), obj in self.objects.items():
            if plural != resource.plural or (namespace is not None and ns != namespace):
                continue
            if field_selector and obj.get("spec", {}).get("nodeName") != field_selector.split("=", 1)[1]:
                continue
            items.append(copy.deepcopy(obj))
        return ObjectList(items, str(self.version))

    def create(
        self,
        resource: Resource,
        obj: dict[str, Any],
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        if subresource == "eviction":
            self.evictions.append((obj["metadata"]["name"], dry_run))
            if self.eviction_errors:
                raise self.eviction_errors.pop(0)
            if not dry_run:
                pod = self.objects[("pods", namespace or "", obj["metadata"]["name"])]
                pod["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
            return {}
        key = self._key(resource, obj["metadata"]["name"], namespace)
        if key in self.objects:
            raise AlreadyExists(key[2])
        obj = copy.deepcopy(obj)
        obj["metadata"]["namespace"] = namespace
        self.objects[key] = obj
        return self._stamp(obj)

    def update(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        key = self._key(resource, meta["name"], meta.get("namespace"))
        if (
            key not in self.objects
            or self.objects[key]["metadata"]["resourceVersion"] != meta["resourceVersion"]
        ):
            raise Conflict(meta["name"])
        self.objects[key] = copy.deepcopy(obj)
        return self._stamp(self.objects[key])

    def patch(
        self,
        resource: Resource,
        name: str,
        patch: dict[str, Any],
        *,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        obj = self.objects.get(self._key(resource, name, namespace))
        if obj is None:
            raise NotFound(name)
        version = patch["metadata"].get("resourceVersion")
        if version is not None and version != obj["metadata"]["resourceVersion"]:
            raise Conflict(name)  # a merge patch with a resourceVersion is conditional
        if subresource == "status":
            obj.setdefault("status", {}).update(patch["status"])  # lists are replaced whole
        else:
            obj["metadata"].setdefault("annotations", {}).update(patch["metadata"]["annotations"])
        return self._stamp(obj)

    def delete(self, resource: Resource, name: str, **kwargs: Any) -> dict[str, Any]:
        key = self._key(resource, name, kwargs.get("namespace"))
        if key not in self.objects:
            raise NotFound(name)
        if kwargs.get("resource_version") not in (None, self.objects[key]["metadata"]["resourceVersion"]):
            raise Conflict(name)
        del self.objects[key]
        return {}

    # ----- what the workload and its owner do -------------------------------------------------------

    def commit(self, pod: str, namespace: str = "ml") -> None:
        meta = self.objects[("pods", namespace, pod)]["metadata"]
        meta["annotations"][COMMITTED] = meta["annotations"][REQUESTED]
        self._stamp(self.objects[("pods", namespace, pod)])

    def pod(self, name: str, namespace: str = "ml") -> dict[str, Any]:
        return self.objects[("pods", namespace, name)]

    def events(self) -> builtins.list[dict[str, Any]]:
        return [o for (plural, _, _), o in self.objects.items() if plural == EVENT.plural]


def pod(
    name: str,
    *,
    device: str | None = UUID,
    node: str = "gpu-node-1",
    owner: tuple[str, str] = ("Job", "train"),
    checkpoint: str | None = "annotation",
    namespace: str = "ml",
) -> dict[str, Any]:
    annotations = {} if checkpoint is None else {"gpuhealth.io/checkpoint": checkpoint}
    health = "Unhealthy" if device == UUID else "Healthy"
    resources = [] if device is None else [{"resourceID": device, "health": health}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": annotations,
            "ownerReferences": [
                {"kind": owner[0], "name": owner[1], "uid": f"uid-{owner[1]}", "controller": True}
            ],
        },
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "main",
                    "allocatedResourcesStatus": [{"name": "nvidia.com/gpu", "resources": resources}],
                }
            ],
        },
    }


def record(name: str = "gpu-node-1-gpu-4a1c", device: str = UUID, **changes: Any) -> Quarantine:
    spec = QuarantineSpec(
        node="gpu-node-1",
        device=device,
        path=DEVICE_PLUGIN,
        reason="Unhealthy",
        actor="alert/GPUDeviceUnhealthy",
        expires_at="2027-01-16T08:00:00Z",
        uuid=device,
    )
    status = QuarantineStatus(phase=Phase.QUARANTINED, phase_since="2027-01-15T08:00:00.000000Z")
    return replace(Quarantine(name=name, spec=spec, status=status, uid=f"uid-{name}"), **changes)


@pytest.fixture
def client() -> FakeClient:
    return FakeClient()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


def migrator(
    client: FakeClient, clock: ManualClock, registry: CollectorRegistry | None = None, **settings: Any
) -> Migrator:
    return Migrator(
        client,
        MigratorSettings(**settings),
        clock,
        metrics=MigratorMetrics(registry or CollectorRegistry()),
        records=lambda: [from_object(o) for o in client.list(QUARANTINES).items],
        backends=shipped(client),
    )


def only(r: Quarantine) -> Migration:
    assert len(r.status.migrations) == 1
    return r.status.migrations[0]


def counted(registry: CollectorRegistry, outcome: str) -> float:
    return registry.get_sample_value("gpuhealth_migrations_total", {"outcome": outcome}) or 0.0


def test_the_checkpoint_flow_moves_the_job_and_releases_the_lease(
    client: FakeClient, clock: ManualClock
) -> None:
    client.add(Resource("", "v1", "pods", True), pod("train-0"))
    registry = CollectorRegistry()
    m = migrator(client, clock, registry)
    r = m.step(record(), clock.now())
    entry = only(r)
    assert (entry.namespace, entry.owner, entry.owner_uid) == ("ml", "Job/train", "uid-train")
    assert (
        entry.outcome is MigrationOutcome.WAITING and entry.started_at and entry.targets == ("uid-train-0",)
    )
    lease = client.get(
        Resource("coordination.k8s.io", "v1", "leases", True), lease_name("Job/train"), namespace="ml"
    )
    assert lease["spec"]["holderIdentity"] == r.name
    assert lease["metadata"]["ownerReferences"][0]["uid"] == r.uid

    r = m.step(r, clock.now())
    assert client.pod("train-0")["metadata"]["annotations"][REQUESTED] == only(r).key
    assert only(r).requested_at and not client.evictions
    r = m.step(r, clock.now())  # nothing new until the commit
    assert not client.evictions

    client.commit("train-0")
    clock.advance(40.0)  # the checkpoint took this long
    r = m.step(r, clock.now())
    # The eviction is decided and stored first; the next step sends it.
    assert not client.evictions and only(r).evicting == "2027-01-15T08:00:40.000000Z"
    r = m.step(r, clock.now())
    assert client.evictions == [("train-0", True), ("train-0", False)]
    assert len(only(r).evictions) == 1

    del client.objects[("pods", "ml", "train-0")]  # the kubelet stops it; the owner makes another elsewhere
    client.add(Resource("", "v1", "pods", True), pod("train-1", device="GPU-other"))
    r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.SUCCEEDED
    assert ("leases", "ml", lease_name("Job/train")) not in client.objects
    r = m.step(r, clock.now())
    assert counted(registry, "succeeded") == 1.0
    # The move's duration, once: from its start to the outcome, in the 60 s bucket.
    duration = {"outcome": "succeeded"}
    assert registry.get_sample_value("gpuhealth_migration_duration_seconds_count", duration) == 1.0
    assert registry.get_sample_value("gpuhealth_migration_duration_seconds_sum", duration) == 40.0
    assert (
        registry.get_sample_value("gpuhealth_migration_duration_seconds_bucket", {**duration, "le": "30.0"})
        == 0
    )
    assert registry.get_sample_value("gpuhealth_migration_duration_seconds_count", {"outcome": "failed"}) == 0
    assert from_object(to_object(r)) == replace(r, resource_version="")


def test_work_without_a_checkpoint_is_unrecoverable_and_never_evicted(
    client: FakeClient, clock: ManualClock
) -> None:
    client.add(
        Resource("", "v1", "pods", True), pod("infer-0", checkpoint=None, owner=("StatefulSet", "infer"))
    )
    registry = CollectorRegistry()
    m = migrator(client, clock, registry)
    r = m.step(record(), clock.now())
    r = m.step(r, clock.now())
    entry = only(r)
    assert entry.outcome is MigrationOutcome.UNRECOVERABLE and "no checkpoint declared" in entry.detail
    assert [e.pod for e in entry.evidence] == ["infer-0"]
    assert '"phase":"Running"' in entry.evidence[0].excerpt and UUID in entry.evidence[0].excerpt
    events = client.events()
    assert [(e["reason"], e["type"], e["involvedObject"]["name"]) for e in events] == [
        (UNRECOVERABLE_REASON, "Warning", "infer-0")
    ]
    assert not client.evictions and counted(registry, "unrecoverable") == 1.0


def test_gpuhealths_own_check_and_holder_pods_on_the_device_are_never_moved(
    client: FakeClient, clock: ManualClock
) -> None:
    """A check whose record went back to Quarantined (its timeout) may still run on the card a
    moment: its Job is gpuhealth's, not a tenant's work (seen in CI's fleet-storm-unhealthy)."""
    pods = Resource("", "v1", "pods", True)
    for name, label in (("canary-1-x", "gpuhealth.io/check"), ("hold-x", "gpuhealth.io/holder")):
        own = pod(name, checkpoint=None, owner=("Job", name), namespace="gpuhealth-system")
        own["metadata"]["labels"] = {label: "canary" if "check" in label else "x"}
        client.add(pods, own)
    m = migrator(client, clock)
    r = m.step(m.step(record(), clock.now()), clock.now())
    assert r.status.migrations == () and not client.evictions and not client.events()


def test_a_commit_that_never_comes_is_unrecoverable_after_the_timeout(
    client: FakeClient, clock: ManualClock
) -> None:
    client.add(Resource("", "v1", "pods", True), pod("train-0"))
    m = migrator(client, clock, migration=MigrationSettings(checkpoint_timeout_seconds=60.0))
    r = m.step(record(), clock.now())
    r = m.step(r, clock.now())
    clock.advance(61)
    r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.UNRECOVERABLE and "no checkpoint committed" in only(r).detail
    assert not client.evictions
    assert ("leases", "ml", lease_name("Job/train")) not in client.objects


def evicting(
    client: FakeClient, clock: ManualClock, registry: CollectorRegistry | None = None, **settings: Any
) -> tuple[Migrator, Quarantine]:
    client.add(Resource("", "v1", "pods", True), pod("train-0"))
    m = migrator(client, clock, registry, **settings)
    r = m.step(record(), clock.now())
    r = m.step(r, clock.now())
    client.commit("train-0")
    r = m.step(r, clock.now())  # the eviction decided and stored: the next step sends it
    return m, r


def test_a_budget_that_refuses_is_waited_on_at_least_ten_seconds(
    client: FakeClient, clock: ManualClock
) -> None:
    m, r = evicting(client, clock)
    client.eviction_errors = [TooManyRequests("budget", retry_after=1.0)]
    r = m.step(r, clock.now())
    entry = only(r)
    assert entry.outcome is MigrationOutcome.WAITING and "429" in entry.detail
    assert entry.retry_at == "2027-01-15T08:00:10.000000Z"
    assert client.evictions == [("train-0", True)]
    clock.advance(9)
    r = m.step(r, clock.now())
    assert client.evictions == [("train-0", True)]  # not before the retry time
    clock.advance(1)
    r = m.step(r, clock.now())
    assert client.evictions[1:] == [("train-0", True), ("train-0", False)] and not only(r).retry_at


SEVERAL = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."


@pytest.mark.parametrize("error", [Unavailable(SEVERAL, status=500), ApiError("no", status=403)])
def test_a_refusal_retrying_cannot_mend_fails_the_move_once(
    client: FakeClient, clock: ManualClock, error: ApiError
) -> None:
    registry = CollectorRegistry()
    m, r = evicting(client, clock)
    m = migrator(client, clock, registry)
    client.eviction_errors = [error]
    r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.FAILED
    assert [e["reason"] for e in client.events()] == [FAILED_REASON]
    assert ("leases", "ml", lease_name("Job/train")) not in client.objects
    clock.advance(600)
    r = m.step(r, clock.now())
    assert client.evictions == [("train-0", True)] and counted(registry, "failed") == 1.0


def test_a_temporary_server_error_is_retried(client: FakeClient, clock: ManualClock) -> None:
    m, r = evicting(client, clock)
    client.eviction_errors = [
        Unavailable("unreachable", status=None),
        Unavailable("busy", status=503),
        Unavailable("an error on the server has prevented the request from succeeding", status=500),
    ]
    for _ in range(3):  # a plain 500 is a server error like a 503, not the budgets' refusal
        r = m.step(r, clock.now())
        assert only(r).outcome is MigrationOutcome.WAITING and "will be retried" in only(r).detail
    r = m.step(r, clock.now())
    assert client.evictions[-1] == ("train-0", False) and not client.events()


def test_two_devices_of_one_job_are_moved_by_exactly_one_flow(client: FakeClient, clock: ManualClock) -> None:
    client.add(Resource("", "v1", "pods", True), pod("train-0", device="GPU-a"))
    client.add(Resource("", "v1", "pods", True), pod("train-1", device="GPU-b"))
    first, second = record("rec-a", device="GPU-a"), record("rec-b", device="GPU-b")
    m = migrator(client, clock, node_in_flight=2)
    a = m.step(first, clock.now())
    b = m.step(second, clock.now())
    assert only(a).targets == only(b).targets == ("uid-train-0", "uid-train-1")  # fixed: the whole job
    assert "another flow (rec-a)" in only(b).detail
    a = m.step(a, clock.now())
    b = m.step(b, clock.now())
    assert "another flow (rec-a)" in only(b).detail
    key = only(a).key
    assert {client.pod(p)["metadata"]["annotations"][REQUESTED] for p in ("train-0", "train-1")} == {key}


def test_a_lease_of_another_is_taken_only_after_its_duration_on_our_clock(
    client: FakeClient, clock: ManualClock
) -> None:
    client.add(Resource("", "v1", "pods", True), pod("train-0"))
    lease = {
        "metadata": {"name": lease_name("Job/train"), "namespace": "ml"},
        # Its renewTime is long past by our wall clock: never compared with it.
        "spec": {
            "holderIdentity": "gone-record",
            "leaseDurationSeconds": 30,
            "renewTime": "2020-01-01T00:00:00Z",
        },
    }
    client.add(Resource("coordination.k8s.io", "v1", "leases", True), lease)
    m = migrator(client, clock)
    r = m.step(record(), clock.now())
    assert "another flow (gone-record)" in only(r).detail
    clock.advance(29)
    r = m.step(r, clock.now())
    assert "another flow" in only(r).detail
    clock.advance(1)
    r = m.step(r, clock.now())
    held = client.get(
        Resource("coordination.k8s.io", "v1", "leases", True), lease_name("Job/train"), namespace="ml"
    )
    assert held["spec"]["holderIdentity"] == r.name and held["spec"]["leaseTransitions"] == 1


def test_the_node_cap_is_rebuilt_from_the_records(client: FakeClient, clock: ManualClock) -> None:
    busy = record("rec-busy", device="GPU-z")
    in_flight = Migration("ml", "Job/other", "uid-other", "k", started_at="2027-01-15T07:59:00.000000Z")
    client.add(QUARANTINES, to_object(busy.with_migrations([in_flight])))
    client.add(Resource("", "v1", "pods", True), pod("train-0"))
    r = migrator(client, clock).step(record(), clock.now())
    assert "in flight" in only(r).detail and not only(r).started_at
    assert ("leases", "ml", lease_name("Job/train")) not in client.objects


def test_the_namespace_eviction_cap_is_rebuilt_from_the_records(
    client: FakeClient, clock: ManualClock
) -> None:
    evicted = Migration("ml", "Job/old", "uid-old", "k", evictions=("2027-01-15T07:30:00.000000Z",))
    client.add(QUARANTINES, to_object(record("rec-old", device="GPU-z").with_migrations([evicted])))
    m, r = evicting(client, clock, namespace_evictions_per_hour=1)
    r = m.step(r, clock.now())
    assert "eviction cap" in only(r).detail and not client.evictions


def test_restrict_moves_nothing(client: FakeClient, clock: ManualClock) -> None:
    client.add(Resource("", "v1", "pods", True), pod("train-0"))
    restricted = record()
    restricted = replace(restricted, spec=replace(restricted.spec, action="restrict"))
    assert migrator(client, clock).step(restricted, clock.now()) == restricted
    assert not client.objects.keys() - {("pods", "ml", "train-0")}


def test_immediate_mode_evicts_without_a_checkpoint(client: FakeClient, clock: ManualClock) -> None:
    client.add(Resource("", "v1", "pods", True), pod("web-0", checkpoint=None, namespace="web"))
    m = migrator(client, clock, modes={"web": Mode.IMMEDIATE})
    r = m.step(record(), clock.now())
    r = m.step(r, clock.now())
    assert not client.evictions and only(r).evicting  # decided and stored first
    r = m.step(r, clock.now())
    assert client.evictions == [("web-0", True), ("web-0", False)]


def test_replicas_and_a_replica_sets_deployment_are_found(client: FakeClient, clock: ManualClock) -> None:
    client.add(
        Resource("apps", "v1", "replicasets", True),
        {
            "metadata": {
                "name": "web-5d9",
                "namespace": "ml",
                "ownerReferences": [
                    {"kind": "Deployment", "name": "web", "uid": "uid-web", "controller": True}
                ],
            }
        },
    )
    client.add(
        Resource("", "v1", "pods", True),
        pod("web-5d9-a", device=f"{UUID}::3", owner=("ReplicaSet", "web-5d9")),
    )
    client.add(Resource("", "v1", "pods", True), pod("other", device=f"{UUID}0::1", owner=("Job", "x")))
    r = migrator(client, clock).step(record(), clock.now())
    assert [(m.owner, m.owner_uid) for m in r.status.migrations] == [("Deployment/web", "uid-web")]


def test_dra_pods_are_found_through_their_claims(client: FakeClient, clock: ManualClock) -> None:
    consumer = pod("train-0", device=None)
    consumer["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "train-0-gpus"}]
    client.add(Resource("", "v1", "pods", True), consumer)
    client.add(Resource("", "v1", "pods", True), pod("bystander", device=None, owner=("Job", "y")))
    claim = {
        "metadata": {"name": "train-0-gpus", "namespace": "ml"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"driver": "gpu.nvidia.com", "pool": "gpu-node-1", "device": "gpu-3"}]
                }
            }
        },
    }
    client.add(Resource("resource.k8s.io", "v1", "resourceclaims", True), claim)
    dra = record(device="gpu.nvidia.com/gpu-node-1/gpu-3")
    dra = replace(
        dra,
        spec=replace(
            dra.spec, path=DRA, uuid="", driver="gpu.nvidia.com", pool="gpu-node-1", device_name="gpu-3"
        ),
    )
    r = migrator(client, clock).step(dra, clock.now())
    assert [m.owner for m in r.status.migrations] == ["Job/train"]


def test_an_unreadable_cluster_is_raised_for_the_caller_to_retry(
    client: FakeClient, clock: ManualClock
) -> None:
    def broken(*args: Any, **kwargs: Any) -> ObjectList:
        raise Unavailable("connection refused", status=None)

    client.list = broken  # type: ignore[method-assign]
    with pytest.raises(Unavailable):
        migrator(client, clock).step(record(), clock.now())
    assert not client.objects  # nothing was done


def test_a_move_that_outlives_the_lease_cap_fails_and_lets_go(client: FakeClient, clock: ManualClock) -> None:
    settings = MigrationSettings(
        checkpoint_timeout_seconds=30.0, lease_margin_seconds=5.0, lease_cap_seconds=100.0
    )
    registry = CollectorRegistry()
    m, r = evicting(client, clock, migration=settings)
    m = migrator(client, clock, registry, migration=settings)
    client.eviction_errors = [TooManyRequests("budget")] * 20
    r = m.step(r, clock.now())
    for _ in range(9):
        clock.advance(10)
        r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.WAITING
    clock.advance(10)
    r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.FAILED and "lease cap" in only(r).detail
    assert [e["reason"] for e in client.events()] == [FAILED_REASON]
    assert ("leases", "ml", lease_name("Job/train")) not in client.objects
    assert counted(registry, "failed") == 1.0


def test_a_move_is_counted_once_even_when_its_end_is_decided_again(
    client: FakeClient, clock: ManualClock
) -> None:
    """The reconciler's write of the record can lose a 409: the next pass decides the same end."""
    client.add(Resource("", "v1", "pods", True), pod("train-0", checkpoint=None))
    registry = CollectorRegistry()
    m = migrator(client, clock, registry)
    start = record()
    assert only(m.step(start, clock.now())).outcome is MigrationOutcome.UNRECOVERABLE
    assert only(m.step(start, clock.now())).outcome is MigrationOutcome.UNRECOVERABLE  # the write was lost
    assert counted(registry, "unrecoverable") == 1.0


def test_with_the_breaker_open_no_move_begins_and_one_under_way_ends(
    client: FakeClient, clock: ManualClock
) -> None:
    client.add(Resource("", "v1", "pods", True), pod("train-0"))
    m = migrator(client, clock)
    held_back = m.finish(record(), clock.now())
    assert "circuit breaker" in only(held_back).detail and not only(held_back).started_at
    assert ("leases", "ml", lease_name("Job/train")) not in client.objects
    # A move that began before the breaker opened goes on to its end.
    r = m.step(record(), clock.now())
    r = m.finish(r, clock.now())
    assert client.pod("train-0")["metadata"]["annotations"][REQUESTED] == only(r).key
    client.commit("train-0")
    r = m.finish(m.finish(r, clock.now()), clock.now())
    assert client.evictions == [("train-0", True), ("train-0", False)]
    del client.objects[("pods", "ml", "train-0")]
    client.add(Resource("", "v1", "pods", True), pod("train-1", device="GPU-other"))
    r = m.finish(r, clock.now())
    assert only(r).outcome is MigrationOutcome.SUCCEEDED
    assert ("leases", "ml", lease_name("Job/train")) not in client.objects


def test_a_device_quarantined_again_moves_the_job_on_it_again(client: FakeClient, clock: ManualClock) -> None:
    pods = Resource("", "v1", "pods", True)
    client.add(pods, pod("train-0"))
    registry = CollectorRegistry()
    m = migrator(client, clock, registry, default_mode=Mode.IMMEDIATE)
    stamp = "2027-01-15T08:00:00.000000Z"
    first = record().with_phase(Phase.PENDING, time=stamp, actor="t", message="m")
    first = first.with_phase(Phase.QUARANTINED, time=stamp, actor="t", message="m")
    r = m.step(m.step(m.step(first, clock.now()), clock.now()), clock.now())
    assert client.evictions == [("train-0", True), ("train-0", False)]
    del client.objects[("pods", "ml", "train-0")]
    client.add(pods, pod("train-1", device="GPU-other"))  # the replacement runs elsewhere
    r = m.step(r, clock.now())
    assert [(e.episode, e.outcome) for e in r.status.migrations] == [(1, MigrationOutcome.SUCCEEDED)]

    # Released, the job's replacement lands on the device, and the device fails again.
    client.add(pods, pod("train-1"))
    assert m.step(r, clock.now()) == r  # the move of this episode ended: nothing begins again
    for phase in (
        "Probing",
        "Canary",
        "Stabilizing",
        "Ramp",
        Phase.RELEASED,
        Phase.PENDING,
        Phase.QUARANTINED,
    ):
        r = r.with_phase(phase, time=stamp, actor="t", message="m")
    assert r.status.episode == 2
    r = m.step(m.step(m.step(r, clock.now()), clock.now()), clock.now())
    assert client.evictions[2:] == [("train-1", True), ("train-1", False)]
    del client.objects[("pods", "ml", "train-1")]
    client.add(pods, pod("train-2", device="GPU-other"))
    r = m.step(r, clock.now())
    moves = r.status.migrations
    assert [(e.owner_uid, e.episode, e.outcome) for e in moves] == [
        ("uid-train", 1, MigrationOutcome.SUCCEEDED),
        ("uid-train", 2, MigrationOutcome.SUCCEEDED),
    ]
    assert moves[1].targets == ("uid-train-1",) and moves[0].key != moves[1].key
    assert counted(registry, "succeeded") == 2.0
    assert from_object(to_object(r)).status.migrations == moves


def test_each_episode_requests_a_checkpoint_under_its_own_key(client: FakeClient, clock: ManualClock) -> None:
    client.add(Resource("", "v1", "pods", True), pod("train-0"))
    m = migrator(client, clock)
    stamp = "2027-01-15T08:00:00.000000Z"
    r = record().with_phase(Phase.PENDING, time=stamp, actor="t", message="m")
    r = m.step(m.step(r.with_phase(Phase.QUARANTINED, time=stamp, actor="t", message="m"), NOW), NOW)
    first_key = client.pod("train-0")["metadata"]["annotations"][REQUESTED]
    # The pod is unrecoverable in this episode (no commit in time) and stays on the device.
    clock.advance(601.0)
    r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.UNRECOVERABLE and not client.evictions
    r = r.with_phase("Probing", time=stamp, actor="t", message="m")
    r = r.with_phase(Phase.QUARANTINED, time=stamp, actor="t", message="m")
    r = m.step(m.step(r, clock.now()), clock.now())
    second_key = client.pod("train-0")["metadata"]["annotations"][REQUESTED]
    assert second_key == r.status.migrations[-1].key != first_key
    client.commit("train-0")
    r = m.step(m.step(r, clock.now()), clock.now())
    assert client.evictions == [("train-0", True), ("train-0", False)]


class Readings:
    """The device's series as a Prometheus would answer, or its failure."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.asked: list[tuple[str, str]] = []

    def series(self, node: str, device: str) -> list[dict[str, Any]]:
        self.asked.append((node, device))
        if self.error is not None:
            raise self.error
        labels = {"__name__": "gpu_nvml_xid_errors_total", "node": node, "device": device, "xid": "79"}
        return [{"metric": labels, "value": 1.0}]


def test_new_requests_stop_through_pods_status_before_the_checkpoint_is_requested(
    client: FakeClient, clock: ManualClock
) -> None:
    gated = pod("train-0")
    gated["spec"]["readinessGates"] = [{"conditionType": "gpuhealth.io/serving"}]
    client.add(Resource("", "v1", "pods", True), gated)
    m = migrator(client, clock)
    r = m.step(m.step(record(), clock.now()), clock.now())
    conditions = {c["type"]: c for c in client.pod("train-0")["status"]["conditions"]}
    assert conditions["gpuhealth.io/serving"]["status"] == "False"
    assert conditions["gpuhealth.io/serving"]["reason"] == "GPUQuarantined"
    assert conditions["Ready"]["status"] == "True"  # the kubelet's, untouched
    assert REQUESTED not in client.pod("train-0")["metadata"]["annotations"]
    assert only(r).requested_at  # the checkpoint timeout counts from the stop
    # The kubelet reads the gate: Ready False, the pod leaves its endpoints; then the request.
    conditions["Ready"]["status"] = "False"
    r = m.step(r, clock.now())
    assert client.pod("train-0")["metadata"]["annotations"][REQUESTED] == only(r).key


def test_a_stop_that_loses_a_race_with_the_kubelet_asks_for_no_checkpoint_in_that_pass(
    client: FakeClient, clock: ManualClock
) -> None:
    client.add(Resource("", "v1", "pods", True), pod("train-0"))
    m = migrator(client, clock)
    r = m.step(record(), clock.now())
    real_patch = client.patch

    def racing(resource: Resource, name: str, patch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        if kwargs.get("subresource") == "status":
            raise Conflict(name)  # the kubelet wrote the pod's status since it was listed
        return real_patch(resource, name, patch, **kwargs)

    client.patch = racing  # type: ignore[method-assign]
    r = m.step(r, clock.now())
    assert REQUESTED not in client.pod("train-0")["metadata"]["annotations"]
    client.patch = real_patch  # type: ignore[method-assign]
    r = m.step(r, clock.now())
    assert client.pod("train-0")["metadata"]["annotations"][REQUESTED] == only(r).key


def test_a_failed_checkpoint_is_unrecoverable_at_once_with_evidence_owned_by_the_record(
    client: FakeClient, clock: ManualClock
) -> None:
    client.add(Resource("", "v1", "pods", True), pod("train-0"))
    registry = CollectorRegistry()
    readings = Readings()
    m = Migrator(
        client,
        MigratorSettings(),
        clock,
        metrics=MigratorMetrics(registry),
        records=lambda: [],
        backends=shipped(client),
        namespace="gpuhealth-system",
        readings=readings,
    )
    r = m.step(m.step(record(), clock.now()), clock.now())
    meta = client.pod("train-0")["metadata"]
    meta["annotations"]["gpuhealth.io/checkpoint-failed"] = f"{meta['annotations'][REQUESTED]}: disk full"
    clock.advance(2)
    r = m.step(r, clock.now())
    entry = only(r)
    assert entry.outcome is MigrationOutcome.UNRECOVERABLE
    assert entry.detail == "the checkpoint of train-0 failed: disk full"
    assert not client.evictions
    assert counted(registry, "unrecoverable") == 1.0
    (event,) = client.events()
    assert event["reason"] == UNRECOVERABLE_REASON and event["involvedObject"]["name"] == "train-0"
    assert "disk full" in event["message"]
    (evidence,) = entry.evidence
    namespace, name = evidence.object.split("/")
    kept = client.get(Resource("", "v1", "configmaps", True), name, namespace=namespace)
    assert namespace == "gpuhealth-system" and name.startswith(r.name + "-evidence-")
    assert kept["metadata"]["ownerReferences"][0]["uid"] == r.uid
    data = kept["data"]
    assert data["reason"] == entry.detail
    assert json.loads(data["device.json"])["device"] == UUID
    pod_doc = json.loads(data["pod.json"])
    assert pod_doc["status"]["containerStatuses"][0]["allocatedResourcesStatus"]
    assert json.loads(data["readings.json"])["series"][0]["metric"]["xid"] == "79"
    assert readings.asked == [("gpu-node-1", UUID)]


def test_evidence_whose_readings_cannot_be_read_says_so_and_holds_nothing_back(
    client: FakeClient, clock: ManualClock
) -> None:
    client.add(Resource("", "v1", "pods", True), pod("train-0", checkpoint=None))
    m = Migrator(
        client,
        MigratorSettings(),
        clock,
        records=lambda: [],
        backends=shipped(client),
        readings=Readings(OSError("connection refused")),
    )
    entry = only(m.step(record(), clock.now()))
    assert entry.outcome is MigrationOutcome.UNRECOVERABLE and "no checkpoint declared" in entry.detail
    namespace, name = entry.evidence[0].object.split("/")
    kept = client.get(Resource("", "v1", "configmaps", True), name, namespace=namespace)
    assert json.loads(kept["data"]["readings.json"]) == {"error": "OSError: connection refused"}


def test_a_move_waits_for_its_replacement_to_run_on_a_healthy_device(
    client: FakeClient, clock: ManualClock
) -> None:
    pods = Resource("", "v1", "pods", True)
    registry = CollectorRegistry()
    m, r = evicting(client, clock, registry=registry)
    r = m.step(r, clock.now())
    assert client.evictions == [("train-0", True), ("train-0", False)]
    del client.objects[("pods", "ml", "train-0")]
    # Recreated, Pending: the move is not done.
    replacement = pod("train-1", device="GPU-other")
    replacement["status"]["phase"] = "Pending"
    client.add(pods, replacement)
    clock.advance(20)
    r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.WAITING and only(r).detail.startswith("awaiting replacement")
    assert only(r).replacing_since == "2027-01-15T08:00:20.000000Z"  # no longer in flight on the node
    client.add(pods, pod("train-1", device="GPU-other"))
    clock.advance(10)
    r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.SUCCEEDED
    labels = {"path": "device-plugin"}
    assert registry.get_sample_value("gpuhealth_migration_recovery_seconds_count", labels) == 1.0
    assert registry.get_sample_value("gpuhealth_migration_recovery_seconds_sum", labels) == 30.0
    assert registry.get_sample_value("gpuhealth_migration_recovery_seconds_count", {"path": "dra"}) == 0


def test_an_eviction_whose_record_was_lost_is_still_read_as_evicted(
    client: FakeClient, clock: ManualClock
) -> None:
    """The pass that sends the eviction loses its write (a 409: the webhook wrote the record
    meanwhile): the next pass reads the record as stored, without the eviction. The pods'
    absence must not read as "gone by themselves": the move awaits the job's replacements and
    observes their recovery (seen in a full run: a move ended as Succeeded with no replacement
    looked for, and no recovery)."""
    pods = Resource("", "v1", "pods", True)
    registry = CollectorRegistry()
    m, stored = evicting(client, clock, registry=registry)
    assert stored.status.migrations[0].evicting and not stored.status.migrations[0].evictions
    lost = m.step(stored, clock.now())
    assert client.evictions == [("train-0", True), ("train-0", False)] and only(lost).evictions
    del client.objects[("pods", "ml", "train-0")]  # evicted; the record of it never written
    clock.advance(20)
    r = m.step(stored, clock.now())
    assert only(r).outcome is MigrationOutcome.WAITING and only(r).detail.startswith("awaiting replacement")
    client.add(pods, pod("train-1", device="GPU-other"))
    clock.advance(10)
    r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.SUCCEEDED and len(client.evictions) == 2
    labels = {"path": "device-plugin"}
    assert registry.get_sample_value("gpuhealth_migration_recovery_seconds_count", labels) == 1.0
    assert registry.get_sample_value("gpuhealth_migration_recovery_seconds_sum", labels) == 30.0


def test_pods_that_ended_on_their_own_after_the_eviction_was_decided_end_the_move(
    client: FakeClient, clock: ManualClock
) -> None:
    m, r = evicting(client, clock)
    client.pod("train-0")["status"]["phase"] = "Succeeded"  # the Job finished before the eviction
    r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.SUCCEEDED
    assert only(r).detail == "every pod of the move has gone" and not client.evictions


def test_a_replacement_whose_device_reads_unknown_has_moved_and_one_on_an_unhealthy_device_has_not(
    client: FakeClient, clock: ManualClock
) -> None:
    """The NVIDIA DRA driver streams no health: the kubelet reports each of its devices Unknown, so
    a replacement there has moved; one whose device the kubelet reports Unhealthy has not."""
    pods = Resource("", "v1", "pods", True)
    m, r = evicting(client, clock)
    r = m.step(r, clock.now())
    del client.objects[("pods", "ml", "train-0")]
    failing = pod("train-1", device="GPU-other")
    failing["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0]["health"] = (
        "Unhealthy"
    )
    client.add(pods, failing)
    r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.WAITING and only(r).detail.startswith("awaiting replacement")
    unknown = pod("train-1", device="GPU-other")
    unknown["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0]["health"] = (
        "Unknown"
    )
    client.add(pods, unknown)
    r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.SUCCEEDED


def test_a_replacement_on_the_quarantined_device_is_moved_again_by_the_same_move(
    client: FakeClient, clock: ManualClock
) -> None:
    pods = Resource("", "v1", "pods", True)
    m, r = evicting(client, clock)
    r = m.step(r, clock.now())
    del client.objects[("pods", "ml", "train-0")]
    r = m.step(r, clock.now())
    assert only(r).replacing_since
    assert ("leases", "ml", lease_name("Job/train")) not in client.objects  # let go while awaiting
    # The kubelet hands the replacement the quarantined device (it reports Healthy now).
    client.add(pods, pod("train-1"))
    r = m.step(r, clock.now())  # the lease again
    r = m.step(r, clock.now())
    entry = only(r)
    assert entry.targets == ("uid-train-1",) and not entry.replacing_since
    assert client.pod("train-1")["metadata"]["annotations"][REQUESTED] == entry.key
    client.commit("train-1")
    r = m.step(r, clock.now())
    assert client.evictions[-1] == ("train-1", False)


def test_a_replacement_that_never_runs_fails_the_move_at_the_replacement_timeout(
    client: FakeClient, clock: ManualClock
) -> None:
    registry = CollectorRegistry()
    m, r = evicting(
        client, clock, registry=registry, migration=MigrationSettings(replacement_timeout_seconds=120.0)
    )
    r = m.step(r, clock.now())
    del client.objects[("pods", "ml", "train-0")]
    clock.advance(120)
    r = m.step(r, clock.now())
    assert only(r).outcome is MigrationOutcome.FAILED and "within 120 s" in only(r).detail
    assert counted(registry, "failed") == 1.0
    assert (
        registry.get_sample_value("gpuhealth_migration_recovery_seconds_count", {"path": "device-plugin"})
        == 0
    )


def test_an_eviction_counts_the_work_lost_since_the_pods_last_checkpoint(
    client: FakeClient, clock: ManualClock
) -> None:
    registry = CollectorRegistry()
    m, r = evicting(client, clock, registry=registry)
    # The workload's checkpoint agent stamped its commit 45 s ago; the eviction lands now.
    client.pod("train-0")["metadata"]["annotations"][LAST_CHECKPOINT] = rfc3339(clock.now() - 45)
    r = m.step(r, clock.now())
    assert client.evictions == [("train-0", True), ("train-0", False)]
    since = {"since": "checkpoint"}
    assert registry.get_sample_value("gpuhealth_migration_work_lost_seconds_count", since) == 1.0
    assert registry.get_sample_value("gpuhealth_migration_work_lost_seconds_sum", since) == 45.0
    assert registry.get_sample_value("gpuhealth_migration_work_lost_seconds_count", {"since": "start"}) == 0
