"""Devices no pod holds: tracked from ResourceSlices, with the driver's taints as evidence.

Aspects covered: every device of a slice is tracked with no pod at all (uuid or
driver/pool/device identity), its health from the driver's taints (gpu-lost and xid
Unhealthy, unmonitored Unknown, none Healthy) and source `resourceslice`; a pod holding the
device is the authority (source `pod`), and once it leaves the slice speaks again (a new
status version when it disagrees, only the source when it agrees); a taint added or
removed on an idle device is a status change; a slice device removed from its slice
goes away when nobody holds it;
node mode tracks only its node's slices; the source is on `gpu_device_info`; the
directory stores the source and the slice's evidence (no pod) across a restart; the
health a taint set gives is a pure function, fuzzed. Node mode: every GPU NVML lists is
tracked (reachable Healthy, lost Unhealthy, other errors Unknown, source `nvml`), a pod
holding it is the authority, and a slice outranks NVML for an idle device, also in the
moment between a pod leaving and the next snapshot (an NVML poll never clears a driver taint).
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from exporter.directory import Directory, open_store
from exporter.exposition import render_metrics
from exporter.identity import SLICE_HEALTHY_MESSAGE, slice_health
from exporter.observer import persist
from exporter.snapshot import SOURCE_NVML, SOURCE_POD, SOURCE_SLICE, DriverTaint
from exporter.state import DeviceStateStore
from gpuhealth.clock import ManualClock
from gpuhealth.nvml import DeviceReading
from tests.exporter.fixtures.builders import DRIVER, claim, container, gpu_uuid, pod, resource, slice_

U0, U1, U2 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1), gpu_uuid("node-1", 2)
LOST = {"key": "gpu.nvidia.com/gpu-lost", "value": "true", "effect": "NoSchedule"}
XID = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
UNMONITORED = {"key": "gpu.nvidia.com/unmonitored", "value": "", "effect": "NoSchedule"}


def _slice(taints: dict[str, list[dict[str, str]]] | None = None, node: str = "node-1") -> dict:
    return slice_(
        f"{node}-gpus",
        node,
        {"gpu-0": gpu_uuid(node, 0), "gpu-1": gpu_uuid(node, 1), "gpu-2": gpu_uuid(node, 2)},
        taints=taints,
    )


def _pod_on_gpu0(rv: int = 1, health: str = "Healthy", phase: str = "Running") -> dict:
    return pod(
        "p",
        container(
            "main",
            (
                "claim:gpus/big",
                [resource("k8s.gpu.nvidia.com/claim=claim-uid-p-gpus-gpu-0", health, "kubelet")],
            ),
        ),
        rv=rv,
        claim_statuses={"gpus": "p-gpus"},
        phase=phase,
    )


def test_every_slice_device_is_tracked_with_no_pod(store: DeviceStateStore, clock: ManualClock) -> None:
    store.apply_slice("ADDED", _slice({"gpu-1": [LOST], "gpu-2": [UNMONITORED]}))
    devices = store.snapshot().devices
    assert set(devices) == {("node-1", U0), ("node-1", U1), ("node-1", U2)}
    got = {k[1]: (d.health, d.source, d.driver, d.device_name) for k, d in devices.items()}
    assert got == {
        U0: ("Healthy", SOURCE_SLICE, DRIVER, "gpu-0"),
        U1: ("Unhealthy", SOURCE_SLICE, DRIVER, "gpu-1"),
        U2: ("Unknown", SOURCE_SLICE, DRIVER, "gpu-2"),
    }
    assert devices[("node-1", U2)].unknown_since == clock.now()
    assert devices[("node-1", U0)].message == SLICE_HEALTHY_MESSAGE
    assert devices[("node-1", U1)].driver_taints == (
        DriverTaint("gpu.nvidia.com/gpu-lost", "NoSchedule", "true"),
    )


def test_a_slice_device_without_uuid_is_keyed_by_driver_pool_device(store: DeviceStateStore) -> None:
    store.apply_slice("ADDED", slice_("s", "node-1", {"gpu-0": None}))
    assert list(store.snapshot().devices) == [("node-1", f"{DRIVER}/node-1/gpu-0")]


def test_a_pod_is_the_authority_while_it_holds_the_device_then_the_slice_speaks(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", claim("p-gpus", [("big", DRIVER, "node-1", "gpu-0")]))
    v_idle = store.snapshot().devices[("node-1", U0)].status_version
    clock.advance(5)
    store.apply_pod("ADDED", _pod_on_gpu0(health="Unhealthy"))
    held = store.snapshot().devices[("node-1", U0)]
    assert (held.health, held.message, held.source, held.status_version) == (
        "Unhealthy",
        "kubelet",
        SOURCE_POD,
        v_idle + 1,
    )
    assert len(held.allocations) == 1
    # The driver taints the device while the pod holds it: the kubelet stays the authority.
    store.apply_slice("MODIFIED", _slice({"gpu-0": [XID]}))
    assert store.snapshot().devices[("node-1", U0)].source == SOURCE_POD
    # The pod leaves (migrated): the slice's evidence is the device's status from now on.
    # It agrees (Unhealthy): the slice vouches for it, the status and its version stay.
    clock.advance(5)
    store.apply_pod("DELETED", _pod_on_gpu0(rv=2))
    idle = store.snapshot().devices[("node-1", U0)]
    assert (idle.health, idle.message, idle.source, idle.allocations, idle.status_version) == (
        "Unhealthy",
        "kubelet",
        SOURCE_SLICE,
        (),
        v_idle + 1,
    )
    # The driver clears the taint: evidence of recovery for a device no pod holds.
    clock.advance(5)
    store.apply_slice("MODIFIED", _slice())
    healed = store.snapshot().devices[("node-1", U0)]
    assert (healed.health, healed.source, healed.status_version) == ("Healthy", SOURCE_SLICE, v_idle + 2)
    assert healed.changed_at == clock.now()


def test_a_hand_back_that_disagrees_is_a_status_change(store: DeviceStateStore, clock: ManualClock) -> None:
    store.apply_slice("ADDED", _slice({"gpu-0": [LOST]}))
    store.apply_claim("ADDED", claim("p-gpus", [("big", DRIVER, "node-1", "gpu-0")]))
    store.apply_pod("ADDED", _pod_on_gpu0(health="Healthy"))
    held = store.snapshot().devices[("node-1", U0)]
    clock.advance(5)
    store.apply_pod("DELETED", _pod_on_gpu0(rv=2))
    d = store.snapshot().devices[("node-1", U0)]
    assert (d.health, d.source, d.status_version, d.changed_at) == (
        "Unhealthy",
        SOURCE_SLICE,
        held.status_version + 1,
        clock.now(),
    )


def test_a_pod_that_agrees_with_the_slice_takes_the_device_back_without_a_change(
    store: DeviceStateStore,
) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", claim("p-gpus", [("big", DRIVER, "node-1", "gpu-0")]))
    store.apply_pod("ADDED", _pod_on_gpu0())
    store.apply_pod("DELETED", _pod_on_gpu0(rv=2))
    idle = store.snapshot().devices[("node-1", U0)]
    assert idle.source == SOURCE_SLICE
    store.apply_pod("ADDED", _pod_on_gpu0(rv=3))
    again = store.snapshot().devices[("node-1", U0)]
    assert (again.source, again.status_version, again.message) == (SOURCE_POD, idle.status_version, "kubelet")


def test_a_terminal_pod_hands_the_device_back_to_the_slice(store: DeviceStateStore) -> None:
    store.apply_slice("ADDED", _slice({"gpu-0": [LOST]}))
    store.apply_claim("ADDED", claim("p-gpus", [("big", DRIVER, "node-1", "gpu-0")]))
    store.apply_pod("ADDED", _pod_on_gpu0(health="Healthy"))
    assert store.snapshot().devices[("node-1", U0)].source == SOURCE_POD
    store.apply_pod("MODIFIED", _pod_on_gpu0(rv=2, phase="Succeeded"))
    d = store.snapshot().devices[("node-1", U0)]
    assert (d.health, d.source) == ("Unhealthy", SOURCE_SLICE)


def test_an_idle_device_removed_from_its_slice_goes_away(store: DeviceStateStore) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_slice("MODIFIED", slice_("node-1-gpus", "node-1", {"gpu-0": U0}))
    assert list(store.snapshot().devices) == [("node-1", U0)]
    store.apply_slice("DELETED", slice_("node-1-gpus", "node-1", {"gpu-0": U0}))
    assert not store.snapshot().devices


def test_a_repeated_slice_changes_nothing(store: DeviceStateStore) -> None:
    store.apply_slice("ADDED", _slice({"gpu-1": [LOST]}))
    before = store.snapshot()
    store.apply_slice("MODIFIED", _slice({"gpu-1": [LOST]}))
    assert store.snapshot() is before
    assert store.stats.status_changes == 3


def test_node_mode_tracks_only_its_own_node(clock: ManualClock) -> None:
    store = DeviceStateStore(clock, node_name="node-1")
    store.apply_slice("ADDED", _slice())
    store.apply_slice("ADDED", _slice(node="node-2"))
    assert {k[0] for k in store.snapshot().devices} == {"node-1"}


def test_the_source_is_on_the_info_series(store: DeviceStateStore, clock: ManualClock) -> None:
    store.apply_slice("ADDED", _slice({"gpu-1": [XID]}))
    body = render_metrics(store.snapshot(), clock.now()).decode()
    info = [line for line in body.splitlines() if line.startswith("gpu_device_info{") and U1 in line]
    assert len(info) == 1 and 'source="resourceslice"' in info[0]
    assert f'gpu_device_health{{node="node-1",device="{U1}",status="Unhealthy"}} 1' in body


def test_the_directory_keeps_the_source_and_the_slice_evidence(tmp_path: Path, clock: ManualClock) -> None:
    path = str(tmp_path / "directory.sqlite")
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    store.apply_slice("ADDED", _slice({"gpu-1": [LOST]}))
    before = store.snapshot().devices[("node-1", U1)]
    directory.close()
    directory = Directory(path, clock=clock)
    restored = open_store(directory, clock).snapshot().devices[("node-1", U1)]
    assert restored == before
    assert restored.source == SOURCE_SLICE
    directory.close()


def test_the_directory_keeps_a_source_only_hand_back(tmp_path: Path, clock: ManualClock) -> None:
    path = str(tmp_path / "directory.sqlite")
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", claim("p-gpus", [("big", DRIVER, "node-1", "gpu-0")]))
    store.apply_pod("ADDED", _pod_on_gpu0())
    persist(store, directory, force=True)
    store.apply_pod("DELETED", _pod_on_gpu0(rv=2))
    before = store.snapshot().devices[("node-1", U0)]
    assert before.source == SOURCE_SLICE
    persist(store, directory, force=True)
    directory.close()
    directory = Directory(path, clock=clock)
    assert open_store(directory, clock).snapshot().devices[("node-1", U0)] == before
    directory.close()


_taint = st.builds(
    DriverTaint,
    key=st.sampled_from(
        ["gpu.nvidia.com/gpu-lost", "gpu.nvidia.com/xid", "gpu.nvidia.com/unmonitored", "x/y"]
    ),
    effect=st.sampled_from(["NoSchedule", "NoExecute", "None"]),
    value=st.text(max_size=4),
)


@given(st.lists(_taint, max_size=4))
def test_the_most_severe_taint_decides_in_any_order(taints: list[DriverTaint]) -> None:
    # A failure taint with effect None is the driver's warning (a non-fatal XID): not a failure.
    keys = {t.key for t in taints if t.effect != "None" or t.key == "gpu.nvidia.com/unmonitored"}
    health, _ = slice_health(tuple(taints))
    assert health == slice_health(tuple(reversed(taints)))[0]
    if keys & {"gpu.nvidia.com/gpu-lost", "gpu.nvidia.com/xid"}:
        assert health == "Unhealthy"
    elif "gpu.nvidia.com/unmonitored" in keys:
        assert health == "Unknown"
    else:
        assert health == "Healthy"


def _nvml_store(clock: ManualClock) -> DeviceStateStore:
    return DeviceStateStore(clock, node_name="node-1", nvml=True)


def test_node_mode_tracks_every_gpu_nvml_lists(clock: ManualClock) -> None:
    store = _nvml_store(clock)
    store.apply_nvml(
        [
            DeviceReading(uuid=U0, index=0, reachable=True),
            DeviceReading(uuid=U1, index=1, reachable=False, error="NVML_ERROR_GPU_IS_LOST"),
            DeviceReading(uuid=U2, index=2, reachable=False, error="NVML_ERROR_UNKNOWN"),
        ],
        [],
    )
    got = {k: (d.health, d.source) for k, d in store.snapshot().devices.items()}
    assert got == {
        ("node-1", U0): ("Healthy", SOURCE_NVML),
        ("node-1", U1): ("Unhealthy", SOURCE_NVML),
        ("node-1", U2): ("Unknown", SOURCE_NVML),
    }
    # The GPU answers again: a recovery NVML vouches for (a new status version).
    before = store.snapshot().devices[("node-1", U1)].status_version
    clock.advance(5)
    store.apply_nvml([DeviceReading(uuid=U1, index=1, reachable=True)], [])
    d = store.snapshot().devices[("node-1", U1)]
    assert (d.health, d.status_version) == ("Healthy", before + 1)


def test_a_device_plugin_pod_is_the_authority_then_nvml_speaks(clock: ManualClock) -> None:
    store = _nvml_store(clock)
    reading = DeviceReading(uuid=U0, index=0, reachable=True)
    store.apply_nvml([reading], [])
    dp = pod("p", container("main", ("nvidia.com/gpu", [resource(U0, "Unhealthy", "xid 79")])))
    store.apply_pod("ADDED", dp)
    assert store.snapshot().devices[("node-1", U0)].source == SOURCE_POD
    store.apply_nvml([reading], [])  # NVML never overrides a held device
    assert store.snapshot().devices[("node-1", U0)].health == "Unhealthy"
    store.apply_pod("DELETED", dp)
    d = store.snapshot().devices[("node-1", U0)]
    assert (d.health, d.source, d.allocations) == ("Healthy", SOURCE_NVML, ())


def test_a_slice_outranks_nvml_for_an_idle_device(clock: ManualClock) -> None:
    store = _nvml_store(clock)
    store.apply_slice("ADDED", _slice({"gpu-0": [XID]}))
    store.apply_nvml([DeviceReading(uuid=U0, index=0, reachable=True)], [])
    d = store.snapshot().devices[("node-1", U0)]
    assert (d.health, d.source) == ("Unhealthy", SOURCE_SLICE)


def test_nvml_never_clears_a_driver_taint_between_a_hand_back_and_the_next_snapshot(
    clock: ManualClock,
) -> None:
    """The failure persists on the device's own evidence: a fatal XID leaves the GPU reachable,
    and an NVML poll landing right after the last pod left (before any snapshot folded the
    hand-back) used to turn the tainted device Healthy, resolving its alert with no recovery."""
    store = _nvml_store(clock)
    reachable = DeviceReading(uuid=U0, index=0, reachable=True)
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", claim("p-gpus", [("big", DRIVER, "node-1", "gpu-0")]))
    store.apply_nvml([reachable], [])
    store.apply_pod("ADDED", _pod_on_gpu0(health="Unhealthy"))
    store.apply_slice("MODIFIED", _slice({"gpu-0": [XID]}))
    failed = store.snapshot().devices[("node-1", U0)]
    clock.advance(5)
    store.apply_pod("DELETED", _pod_on_gpu0(rv=2))
    store.apply_nvml([reachable], [])  # same batch as the deletion: no snapshot in between
    idle = store.snapshot().devices[("node-1", U0)]
    assert (idle.health, idle.source, idle.allocations) == ("Unhealthy", SOURCE_SLICE, ())
    assert idle.status_version == failed.status_version
    # Only the driver clearing its taint is a recovery; NVML polls in between change nothing.
    clock.advance(5)
    store.apply_nvml([reachable], [])
    assert store.snapshot().devices[("node-1", U0)].health == "Unhealthy"
    store.apply_slice("MODIFIED", _slice())
    recovered = store.snapshot().devices[("node-1", U0)]
    assert (recovered.health, recovered.source) == ("Healthy", SOURCE_SLICE)
