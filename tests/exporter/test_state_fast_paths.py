"""The state's fast paths give the same results as the general ones.

Aspects covered: the signature skip (an unchanged pod only confirms, yet a health or
message change inside an otherwise identical pod is applied, and a resourceVersion
regression is ignored even when the signature matches); the one-container signature
shape; a pod replaced on the same devices (allocations move to the new pod, values and
versions stay, a different reported value is a change); a terminal pod releasing its
devices (a provisional one is dropped); a pod with nothing to report yet; claims looked
up once per pod with entries of two claims.
"""

from __future__ import annotations

from exporter.parse import pod_signature
from exporter.snapshot import Allocation
from exporter.state import OUT_OF_ORDER, UNRESOLVED_PREFIX, DeviceStateStore
from gpuhealth.clock import ManualClock
from tests.exporter.fixtures.builders import DRIVER, claim, container, gpu_uuid, pod, resource, slice_

U0, U1 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1)


def dp_pod(
    name: str, health: str = "Healthy", *, rv: int = 1, message: str | None = None, **kw: object
) -> dict:
    entries = [resource(U0, health, message), resource(U1)]
    return pod(name, container("main", ("nvidia.com/gpu", entries)), rv=rv, **kw)  # type: ignore[arg-type]


def test_an_unchanged_pod_only_confirms_and_a_change_inside_it_is_applied(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_pod("ADDED", dp_pod("p", rv=1))
    clock.advance(10)
    quiet = dp_pod("p", rv=2)
    quiet["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    store.apply_pod("MODIFIED", quiet)
    d = store.device("node-1", U0)
    assert d is not None and (d.status_version, d.observed_at) == (1, clock.now())
    # Everything else identical, one entry's health differs: the signature differs, it applies.
    store.apply_pod("MODIFIED", dp_pod("p", "Unhealthy", rv=3))
    d = store.device("node-1", U0)
    assert d is not None and (d.health, d.status_version) == ("Unhealthy", 2)
    # Only the message moves: also a change.
    store.apply_pod("MODIFIED", dp_pod("p", "Unhealthy", rv=4, message="XID 79"))
    d = store.device("node-1", U0)
    assert d is not None and (d.message, d.status_version) == ("XID 79", 3)
    assert store.stats.status_changes == 4  # two creations, two changes


def test_a_resource_version_regression_is_ignored_even_with_the_same_signature(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_pod("ADDED", dp_pod("p", rv=10))
    seen = store.device("node-1", U0)
    clock.advance(10)
    store.apply_pod("MODIFIED", dp_pod("p", rv=9))  # same signature, older version
    store.apply_pod("MODIFIED", dp_pod("p", "Unhealthy", rv=8))  # different signature, older version
    d = store.device("node-1", U0)
    assert d == seen  # neither confirmed nor changed
    assert store.stats.events_ignored[OUT_OF_ORDER] == 2


def test_one_container_signatures_track_what_devices_depend_on() -> None:
    base = dp_pod("p", rv=1)
    restarted = dp_pod("p", rv=2)
    restarted["status"]["containerStatuses"][0]["restartCount"] = 3
    assert pod_signature(base) == pod_signature(restarted)
    assert pod_signature(base) != pod_signature(dp_pod("p", "Unknown", rv=2))
    assert pod_signature(base) != pod_signature(dp_pod("p", rv=2, node="node-2"))
    assert pod_signature(base) != pod_signature(dp_pod("p", rv=2, phase="Succeeded"))
    assert pod_signature(base) != pod_signature(dp_pod("p", rv=2, claim_statuses={"gpus": "c"}))
    # The same container as the only one of two: another shape, never equal.
    two = pod("p", base["status"]["containerStatuses"][0], container("side"), rv=1)
    assert pod_signature(two) is not None and pod_signature(two) != pod_signature(base)
    assert pod_signature({"status": {"containerStatuses": [5]}}) is None


def test_a_pod_replaced_on_the_same_devices_moves_allocations_and_keeps_versions(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_pod("ADDED", dp_pod("old", "Unhealthy", rv=1))
    store.apply_pod("MODIFIED", dp_pod("old", "Unhealthy", rv=2, phase="Succeeded"))
    store.apply_pod("DELETED", dp_pod("old", "Unhealthy", rv=3, phase="Succeeded"))
    assert store.device("node-1", U0).allocations == ()  # type: ignore[union-attr]
    clock.advance(5)
    store.apply_pod("ADDED", dp_pod("new", "Unhealthy", rv=4))
    d0, d1 = store.device("node-1", U0), store.device("node-1", U1)
    assert d0 is not None and d1 is not None
    assert d0.allocations == d1.allocations == (Allocation("team-a", "new", "main", "nvidia.com/gpu"),)
    assert (d0.health, d0.status_version, d1.status_version) == ("Unhealthy", 1, 1)
    # The next pod on these devices reports a different value: that is a change.
    store.apply_pod("ADDED", dp_pod("other", "Healthy", rv=5))
    d0 = store.device("node-1", U0)
    assert d0 is not None and (d0.health, d0.status_version) == ("Healthy", 2)
    assert [a.pod for a in d0.allocations] == ["new", "other"]


def test_a_terminal_pod_releases_devices_and_drops_provisional_ones(store: DeviceStateStore) -> None:
    unresolved = pod(
        "p",
        container("main", ("claim:gpus", [resource("k8s.gpu.nvidia.com/claim=x-gpu-0")])),
        claim_statuses={"gpus": "p-gpus"},
        rv=1,
    )
    store.apply_pod("ADDED", unresolved)
    assert [k[1].startswith(UNRESOLVED_PREFIX) for k in store.snapshot().devices] == [True]
    store.apply_pod("ADDED", dp_pod("q", rv=2))
    store.apply_pod("MODIFIED", {**unresolved, "status": {**unresolved["status"], "phase": "Failed"}}
                    | {"metadata": {**unresolved["metadata"], "resourceVersion": "3"}})  # fmt: skip
    store.apply_pod("MODIFIED", dp_pod("q", rv=4, phase="Succeeded"))
    snap = store.snapshot()
    assert set(snap.devices) == {("node-1", U0), ("node-1", U1)}  # the provisional one is gone
    assert all(d.allocations == () for d in snap.devices.values())


def test_a_pod_with_nothing_to_report_yet_holds_nothing(store: DeviceStateStore) -> None:
    pending = pod("p", container("main"), phase="Pending", rv=1, node="")
    store.apply_pod("ADDED", pending)
    store.apply_pod("MODIFIED", pod("p", container("main"), phase="Pending", rv=2))
    assert store.snapshot().devices == {}
    store.apply_pod("MODIFIED", dp_pod("p", rv=3))
    assert len(store.snapshot().devices) == 2


def test_entries_of_two_claims_resolve_each_through_its_own_claim(store: DeviceStateStore) -> None:
    store.apply_slice("ADDED", slice_("node-1-gpus", "node-1", {"gpu-0": U0, "gpu-1": U1}))
    store.apply_claim("ADDED", claim("p-a", [("a", DRIVER, "node-1", "gpu-0")]))
    store.apply_claim("ADDED", claim("p-b", [("b", DRIVER, "node-1", "gpu-1")]))
    two_claims = pod(
        "p",
        container(
            "main",
            ("claim:a", [resource("k8s.gpu.nvidia.com/claim=claim-uid-p-a-gpu-0", "Unhealthy")]),
            ("claim:b", [resource("k8s.gpu.nvidia.com/claim=claim-uid-p-b-gpu-1")]),
            ("claim:c", [resource("k8s.gpu.nvidia.com/claim=unknown-gpu-2")]),
        ),
        claim_statuses={"a": "p-a", "b": "p-b", "c": "p-c"},
    )
    store.apply_pod("ADDED", two_claims)
    snap = store.snapshot()
    assert snap.devices[("node-1", U0)].health == "Unhealthy"
    assert snap.devices[("node-1", U1)].allocations[0].claim == "p-b"
    assert sum(k[1].startswith(UNRESOLVED_PREFIX) for k in snap.devices) == 1
    # The missing claim arrives: the provisional device resolves (the claim was a tracked use).
    store.apply_claim("ADDED", claim("p-c", [("c", DRIVER, "node-1", "gpu-0")], uid="unknown"))
    assert not any(k[1].startswith(UNRESOLVED_PREFIX) for k in store.snapshot().devices)
