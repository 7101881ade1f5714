"""The device state: what pod, claim, slice, lease and NVML events do to devices.

Aspects covered: both allocation paths; replicas and shared devices (one device, several
allocations); DRA claims with and without a request, by CDI ID and by driver/pool/device;
provisional identities until the claim arrives, and the uuid superseding
driver/pool/device when the slice arrives; heartbeat versus change (status versions);
duplicate and out-of-order pod events; pods leaving (device stays), terminal pods, node
deletion; driver taints; Unknown-since; status age with a stopping and resuming lease
and NVML; snapshots immutable and cheap (no copy without a change); any object with a
junk part, applied or relisted, is counted and never raises.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import parse
from exporter.exposition import render_metrics
from exporter.snapshot import Allocation, DriverTaint, status_age
from exporter.state import CLAIMS, DUPLICATE, LEASES, OUT_OF_ORDER, PODS, SLICES, DeviceStateStore
from gpuhealth.clock import ManualClock
from gpuhealth.nvml import DeviceReading, XidEvent
from tests.exporter.fixtures.builders import DRIVER, claim, container, gpu_uuid, lease, pod, resource, slice_

U0, U1 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1)


def dp_pod(name: str, *ids_health: tuple[str, str], rv: int = 1, **kw: object) -> dict:
    return pod(
        name, container("main", ("nvidia.com/gpu", [resource(i, h) for i, h in ids_health])), rv=rv, **kw
    )  # type: ignore[arg-type]


def test_device_plugin_pod_creates_one_device_per_gpu(store: DeviceStateStore, clock: ManualClock) -> None:
    store.apply_pod("ADDED", dp_pod("p", (U0, "Healthy"), (U1, "Unhealthy")))
    snap = store.snapshot()
    assert set(snap.devices) == {("node-1", U0), ("node-1", U1)}
    d1 = snap.devices[("node-1", U1)]
    assert (d1.health, d1.status_version, d1.uuid, d1.resource) == ("Unhealthy", 1, U1, "nvidia.com/gpu")
    assert d1.first_seen == d1.changed_at == d1.observed_at == clock.now()
    assert d1.allocations == (Allocation("team-a", "p", "main", "nvidia.com/gpu"),)


def test_replicas_and_shared_devices_are_one_device_with_several_allocations(store: DeviceStateStore) -> None:
    store.apply_pod(
        "ADDED",
        pod(
            "a",
            container("c1", ("nvidia.com/gpu", [resource(f"{U0}::0"), resource(f"{U0}::1")])),
            container("c2", ("nvidia.com/gpu", [resource(f"{U0}::2")])),
        ),
    )
    store.apply_pod("ADDED", dp_pod("b", (f"{U0}::3", "Healthy")))
    snap = store.snapshot()
    assert list(snap.devices) == [("node-1", U0)]
    assert [(a.pod, a.container) for a in snap.devices[("node-1", U0)].allocations] == [
        ("a", "c1"),
        ("a", "c2"),
        ("b", "main"),
    ]


def test_a_shared_device_keeps_its_latest_confirmation_when_pods_confirm_out_of_turn(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    # Confirmations fold in the order pods were first queued (b, then a); the fold used to
    # read the devices from before its own first copy, so a's older time overwrote b's.
    store.apply_pod("ADDED", dp_pod("a", (f"{U0}::0", "Healthy"), uid="uid-a"))
    store.apply_pod("ADDED", dp_pod("b", (f"{U0}::1", "Healthy"), uid="uid-b"))
    store.snapshot()  # a scrape holds the devices: the next change copies them
    for name, rv in (("b", 2), ("a", 3), ("b", 4)):
        clock.advance(5)
        store.apply_pod(
            "MODIFIED", dp_pod(name, (f"{U0}::{'ab'.index(name)}", "Healthy"), rv=rv, uid=f"uid-{name}")
        )
    assert store.snapshot().devices[("node-1", U0)].observed_at == clock.now()


def test_most_severe_entry_wins_within_one_pod(store: DeviceStateStore) -> None:
    store.apply_pod(
        "ADDED", dp_pod("a", (f"{U0}::0", "Healthy"), (f"{U0}::1", "Unhealthy"), (f"{U0}::2", "Unknown"))
    )
    assert store.snapshot().devices[("node-1", U0)].health == "Unhealthy"


def test_repeating_the_current_value_is_a_heartbeat_and_a_change_bumps_the_version(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_pod("ADDED", dp_pod("p", (U0, "Healthy"), rv=1))
    t0 = clock.now()
    clock.advance(30)
    store.apply_pod("MODIFIED", dp_pod("p", (U0, "Healthy"), rv=2))
    d = store.snapshot().devices[("node-1", U0)]
    assert (d.status_version, d.changed_at, d.observed_at) == (1, t0, t0 + 30)
    clock.advance(5)
    store.apply_pod("MODIFIED", dp_pod("p", (U0, "Unhealthy"), rv=3))
    d = store.snapshot().devices[("node-1", U0)]
    assert (d.health, d.status_version, d.changed_at, d.observed_at) == ("Unhealthy", 2, t0 + 35, t0 + 35)
    assert store.stats.status_changes == 2


def test_duplicate_and_out_of_order_pod_events_change_nothing(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_pod("ADDED", dp_pod("p", (U0, "Healthy"), rv=5))
    store.apply_pod("MODIFIED", dp_pod("p", (U0, "Unhealthy"), rv=7))
    before = store.snapshot()
    clock.advance(10)
    store.apply_pod("MODIFIED", dp_pod("p", (U0, "Unhealthy"), rv=7))
    store.apply_pod("MODIFIED", dp_pod("p", (U0, "Healthy"), rv=6))
    after = store.snapshot()
    assert after is before
    assert after.devices[("node-1", U0)].health == "Unhealthy"
    assert store.stats.events_ignored == {DUPLICATE: 1, OUT_OF_ORDER: 1}


def test_a_pod_with_a_stale_view_does_not_flip_a_device_another_pod_updated(store: DeviceStateStore) -> None:
    store.apply_pod("ADDED", dp_pod("a", (f"{U0}::0", "Healthy"), rv=1))
    store.apply_pod("ADDED", dp_pod("b", (f"{U0}::1", "Healthy"), rv=2))
    store.apply_pod("MODIFIED", dp_pod("a", (f"{U0}::0", "Unhealthy"), rv=3))
    # b is updated for an unrelated reason, still saying Healthy: nothing new from b.
    b = dp_pod("b", (f"{U0}::1", "Healthy"), rv=4)
    b["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    store.apply_pod("MODIFIED", b)
    d = store.snapshot().devices[("node-1", U0)]
    assert (d.health, d.status_version) == ("Unhealthy", 2)


def test_pods_leaving_release_allocations_but_the_device_stays(store: DeviceStateStore) -> None:
    store.apply_pod("ADDED", dp_pod("a", (U0, "Unhealthy"), rv=1))
    store.apply_pod("ADDED", dp_pod("b", (U1, "Healthy"), rv=2))
    store.apply_pod("DELETED", dp_pod("a", (U0, "Unhealthy"), rv=3))
    store.apply_pod("MODIFIED", dp_pod("b", (U1, "Healthy"), rv=4, phase="Succeeded"))
    snap = store.snapshot()
    assert snap.devices[("node-1", U0)].allocations == ()
    assert snap.devices[("node-1", U0)].health == "Unhealthy"
    assert snap.devices[("node-1", U1)].allocations == ()


def test_node_deletion_removes_its_free_devices_and_versions_continue(store: DeviceStateStore) -> None:
    store.apply_lease("ADDED", lease("node-1"))
    store.apply_pod("ADDED", dp_pod("a", (U0, "Healthy"), rv=1))
    store.apply_pod("MODIFIED", dp_pod("a", (U0, "Unhealthy"), rv=2))
    store.apply_pod("ADDED", dp_pod("b", (U1, "Healthy"), rv=3))
    store.apply_pod("DELETED", dp_pod("a", (U0, "Unhealthy"), rv=4))
    store.apply_lease("DELETED", lease("node-1"))
    snap = store.snapshot()
    assert list(snap.devices) == [("node-1", U1)]  # still held by pod b
    assert "node-1" not in snap.nodes
    store.apply_pod("ADDED", dp_pod("c", (U0, "Healthy"), rv=5, uid="c-2"))
    assert store.snapshot().devices[("node-1", U0)].status_version == 3


def _dra_world(store: DeviceStateStore, *, with_uuid: bool = True) -> None:
    store.apply_slice(
        "ADDED",
        slice_(
            "node-1-gpus",
            "node-1",
            {"gpu-0": U0 if with_uuid else None, "gpu-1": U1 if with_uuid else None},
            taints={"gpu-1": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]},
        ),
    )
    store.apply_claim(
        "ADDED", claim("p-gpus", [("big", DRIVER, "node-1", "gpu-0"), ("big", DRIVER, "node-1", "gpu-1")])
    )


def _dra_pod(rv: int = 1, health: str = "Healthy", name: str = "claim:gpus/big", **kw: object) -> dict:
    return pod(
        "p",
        container(
            "main",
            (
                name,
                [
                    resource("k8s.gpu.nvidia.com/claim=claim-uid-p-gpus-gpu-0", health, "from driver"),
                    resource("k8s.gpu.nvidia.com/claim=claim-uid-p-gpus-gpu-1", "Healthy"),
                ],
            ),
        ),
        rv=rv,
        claim_statuses={"gpus": "p-gpus"},
        **kw,  # type: ignore[arg-type]
    )


def test_dra_entries_resolve_to_the_slice_uuid_with_driver_attributes(store: DeviceStateStore) -> None:
    _dra_world(store)
    store.apply_pod("ADDED", _dra_pod(health="Unknown"))
    snap = store.snapshot()
    d0, d1 = snap.devices[("node-1", U0)], snap.devices[("node-1", U1)]
    assert (d0.health, d0.message, d0.driver, d0.pool, d0.device_name) == (
        "Unknown",
        "from driver",
        DRIVER,
        "node-1",
        "gpu-0",
    )
    assert d0.unknown_since is not None
    assert d0.allocations == (Allocation("team-a", "p", "main", "claim:gpus/big", "p-gpus"),)
    assert d1.driver_taints == (DriverTaint("gpu.nvidia.com/xid", "NoSchedule", "79"),)


def test_dra_claim_without_request_maps_by_position_and_by_driver_pool_device(
    store: DeviceStateStore,
) -> None:
    store.apply_claim(
        "ADDED", claim("c1", [("", DRIVER, "pool-a", "gpu-3"), ("", DRIVER, "pool-a", "gpu-4")])
    )
    store.apply_pod(
        "ADDED",
        pod(
            "p",
            container(
                "main",
                ("claim:whole", [resource("opaque-0"), resource(f"{DRIVER}/pool-a/gpu-3", "Unhealthy")]),
            ),
            spec_claims={"whole": "c1"},
        ),
    )
    snap = store.snapshot()
    assert snap.devices[("node-1", f"{DRIVER}/pool-a/gpu-3")].health == "Unhealthy"
    # opaque-0 is the first entry, so the first result (gpu-3) — the same device, most severe wins.
    assert set(snap.devices) == {("node-1", f"{DRIVER}/pool-a/gpu-3")}


def test_unknown_claim_gives_a_provisional_identity_resolved_when_the_claim_arrives(
    store: DeviceStateStore,
) -> None:
    store.apply_pod("ADDED", _dra_pod(health="Unhealthy"))
    snap = store.snapshot()
    assert all(device.startswith("unresolved/team-a/p-gpus/") for _, device in snap.devices)
    assert store.stats.parse_errors[parse.CLAIM_UNRESOLVED] == 2
    _dra_world(store)
    snap = store.snapshot()
    assert set(snap.devices) == {("node-1", U0), ("node-1", U1)}
    assert snap.devices[("node-1", U0)].health == "Unhealthy"


def test_slice_uuid_supersedes_driver_pool_device_identity(store: DeviceStateStore) -> None:
    store.apply_claim(
        "ADDED", claim("p-gpus", [("big", DRIVER, "node-1", "gpu-0"), ("big", DRIVER, "node-1", "gpu-1")])
    )
    store.apply_pod("ADDED", _dra_pod())
    assert ("node-1", f"{DRIVER}/node-1/gpu-0") in store.snapshot().devices
    store.apply_slice("ADDED", slice_("s", "node-1", {"gpu-0": U0, "gpu-1": U1}))
    assert set(store.snapshot().devices) == {("node-1", U0), ("node-1", U1)}


def test_driver_taint_changes_reach_devices_and_slice_removal_drops_free_devices(
    store: DeviceStateStore,
) -> None:
    _dra_world(store)
    store.apply_pod("ADDED", _dra_pod())
    store.apply_slice("MODIFIED", slice_("node-1-gpus", "node-1", {"gpu-0": U0, "gpu-1": U1}))
    assert store.snapshot().devices[("node-1", U1)].driver_taints == ()
    store.apply_pod("DELETED", _dra_pod(rv=2))
    store.apply_slice("DELETED", slice_("node-1-gpus", "node-1", {}))
    assert store.snapshot().devices == {}


def test_unknown_since_survives_message_changes_and_clears_on_recovery(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    _dra_world(store)
    store.apply_pod("ADDED", _dra_pod(rv=1, health="Unknown"))
    since = clock.now()
    first = store.snapshot().devices[("node-1", U0)].status_version  # after the slice's own report
    clock.advance(10)
    p = _dra_pod(rv=2, health="Unknown")
    p["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0]["message"] = (
        "stream broken"
    )
    store.apply_pod("MODIFIED", p)
    d = store.snapshot().devices[("node-1", U0)]
    assert (d.status_version, d.changed_at, d.unknown_since) == (first + 1, since + 10, since)
    store.apply_pod("MODIFIED", _dra_pod(rv=3, health="Healthy"))
    assert store.snapshot().devices[("node-1", U0)].unknown_since is None


def test_relist_removes_pods_that_are_gone(store: DeviceStateStore) -> None:
    store.apply_pod("ADDED", dp_pod("a", (U0, "Healthy"), rv=1))
    store.apply_pod("ADDED", dp_pod("b", (U1, "Healthy"), rv=2))
    store.relist(PODS, [dp_pod("b", (U1, "Healthy"), rv=2)])
    snap = store.snapshot()
    assert snap.devices[("node-1", U0)].allocations == ()
    assert len(snap.devices[("node-1", U1)].allocations) == 1


def test_malformed_objects_are_counted_and_skipped(store: DeviceStateStore) -> None:
    store.apply_pod("ADDED", {"metadata": 3})
    store.apply_claim(
        "ADDED",
        {"metadata": {"name": "c", "namespace": "n"}, "status": {"allocation": {"devices": {"results": 4}}}},
    )
    store.apply_slice("ADDED", {"spec": {}})
    store.apply_lease("ADDED", {"metadata": {}})
    store.apply_pod("ADDED", dp_pod("ok", (U0, "Bogus")))
    assert store.stats.parse_errors == {
        parse.MALFORMED_POD: 1,
        parse.MALFORMED_CLAIM: 1,
        parse.MALFORMED_SLICE: 1,
        parse.MALFORMED_LEASE: 1,
        parse.INVALID_HEALTH: 1,
    }
    assert store.snapshot().devices[("node-1", U0)].health == "Unknown"


def test_relists_with_names_or_phases_of_the_wrong_type_are_counted_not_raised(
    store: DeviceStateStore,
) -> None:
    # Unhashable values where a string belongs once escaped from a relist (set of seen keys)
    # and from the terminal-phase check; in the observer that exception ended the processor task.
    store.apply_pod("ADDED", dp_pod("ok", (U0, "Healthy")))
    junk_phase = dp_pod("ok", (U0, "Unhealthy"), rv=2)
    junk_phase["status"]["phase"] = {"not": "a phase"}
    store.relist(PODS, [junk_phase])
    assert store.snapshot().devices[("node-1", U0)].health == "Unhealthy"
    store.relist(CLAIMS, [{"metadata": {"name": "c", "namespace": {"a": 1}}}])
    store.relist(SLICES, [{"metadata": {"name": [1]}, "spec": {}}])
    store.relist(LEASES, [{"metadata": {"name": {"a": 1}, "namespace": "kube-node-lease"}}])
    assert store.stats.parse_errors == {
        parse.MALFORMED_CLAIM: 1,
        parse.MALFORMED_SLICE: 1,
        parse.MALFORMED_LEASE: 1,
    }


_junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda children: (
        st.lists(children, max_size=2) | st.dictionaries(st.text(max_size=4), children, max_size=2)
    ),
    max_leaves=6,
)


def _paths(obj: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    children = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in children:
        yield from _paths(value, (*at, key))


def _replaced(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = dict(obj) if isinstance(obj, dict) else list(obj)
    copy[path[0]] = _replaced(obj[path[0]], path[1:], value)
    return copy


_VALID = {
    PODS: dp_pod("p", (U0, "Unhealthy"), (f"{U1}::2", "Healthy"), rv=5, claim_statuses={"gpus": "p-gpus"}),
    CLAIMS: claim("p-gpus", [("gpus", DRIVER, "node-1", "gpu-0")]),
    SLICES: slice_("s", "node-1", {"gpu-0": U0}),
    LEASES: lease("node-1"),
}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_object_with_a_junk_part_is_applied_or_counted_never_raised(data: st.DataObject) -> None:
    store = DeviceStateStore(ManualClock(start=1_800_000_000.0))
    for resource_name, obj in _VALID.items():
        store.relist(resource_name, [obj])
    resource_name = data.draw(st.sampled_from(sorted(_VALID)))
    valid = _VALID[resource_name]
    path = data.draw(st.sampled_from(list(_paths(valid))))
    junk = _replaced(valid, path, data.draw(_junk))
    store.apply_event(resource_name, data.draw(st.sampled_from(["ADDED", "MODIFIED", "DELETED"])), junk)
    store.relist(resource_name, [junk, valid])
    render_metrics(store.snapshot(), 1_800_000_010.0)


def test_status_age_grows_when_the_lease_stops_and_resets_when_it_resumes(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    def renew() -> None:
        stamp = clock.now()
        from datetime import UTC, datetime

        store.apply_lease(
            "MODIFIED", lease("node-1", datetime.fromtimestamp(stamp, UTC).isoformat().replace("+00:00", "Z"))
        )

    renew()
    store.apply_pod("ADDED", dp_pod("p", (U0, "Healthy")))

    def age() -> float:
        snap = store.snapshot()
        return status_age(snap.devices[("node-1", U0)], snap.nodes.get("node-1"), snap.nvml, clock.now())

    for _ in range(3):  # the kubelet renews every 10 s: the status stays fresh
        clock.advance(10)
        renew()
        assert age() == 0.0
    clock.advance(45)  # kubelet stopped: no renewals, the reported value is still Healthy
    assert age() == 45.0
    assert store.snapshot().devices[("node-1", U0)].health == "Healthy"
    clock.advance(15)
    assert age() == 60.0
    renew()  # kubelet back
    assert age() == 0.0


def test_pod_updates_after_the_kubelet_stopped_do_not_refresh_the_status(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    from datetime import UTC, datetime

    renewed = datetime.fromtimestamp(clock.now(), UTC).isoformat().replace("+00:00", "Z")
    store.apply_lease("MODIFIED", lease("node-1", renewed))
    store.apply_pod("ADDED", dp_pod("p", (U0, "Healthy"), rv=1))
    clock.advance(45)  # no renewal since: the kubelet stopped
    marked = dp_pod("p", (U0, "Healthy"), rv=2)
    marked["status"]["conditions"] = [{"type": "Ready", "status": "False"}]  # the node controller's write
    store.apply_pod("MODIFIED", marked)
    snap = store.snapshot()
    assert status_age(snap.devices[("node-1", U0)], snap.nodes["node-1"], None, clock.now()) == 45.0


def test_status_age_in_node_mode_follows_nvml_reachability(clock: ManualClock) -> None:
    store = DeviceStateStore(clock, node_name="node-1", nvml=True)
    store.apply_pod("ADDED", dp_pod("p", (U0, "Healthy")))
    store.apply_nvml([DeviceReading(uuid=U0, index=0, reachable=True)], [XidEvent(U0, 79, clock.now())])
    clock.advance(20)
    store.apply_nvml(
        [DeviceReading(uuid=U0, index=0, reachable=False, error="GPU is lost")], [XidEvent(U0, 79, 0)]
    )
    snap = store.snapshot()
    assert snap.nvml is not None and snap.node_name == "node-1"
    assert snap.nvml.xid_counts == {(U0, 79): 2}
    assert status_age(snap.devices[("node-1", U0)], None, snap.nvml, clock.now()) == 20.0


def test_snapshots_are_immutable_and_reused_until_something_changes(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_pod("ADDED", dp_pod("p", (U0, "Healthy"), rv=1))
    first = store.snapshot()
    assert store.snapshot() is first
    clock.advance(5)
    store.apply_pod("MODIFIED", dp_pod("p", (U0, "Unhealthy"), rv=2))
    second = store.snapshot()
    assert first.devices[("node-1", U0)].health == "Healthy"
    assert second.devices[("node-1", U0)].health == "Unhealthy"
    clock.advance(5)
    store.apply_pod("MODIFIED", {**dp_pod("p", (U0, "Unhealthy"), rv=3)})
    third = store.snapshot()
    assert third.devices[("node-1", U0)].observed_at == clock.now()
    assert second.devices[("node-1", U0)].observed_at == clock.now() - 5


def test_a_relist_of_unchanged_pods_counts_no_duplicates(store: DeviceStateStore) -> None:
    store.apply_pod("ADDED", dp_pod("a", (U0, "Healthy"), rv=1))
    store.relist(PODS, [dp_pod("a", (U0, "Healthy"), rv=1)])
    assert store.stats.events_ignored == {}
    store.apply_pod("MODIFIED", dp_pod("a", (U0, "Healthy"), rv=1))
    assert store.stats.events_ignored == {DUPLICATE: 1}
