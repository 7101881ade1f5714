"""DRA pods whose kubelet writes no health (`ResourceHealthStatus` off, a kubelet before 1.36).

Aspects covered: such a pod's containers carry no `allocatedResourcesStatus`, yet its
`status.resourceClaimStatuses` names the ResourceClaim its containers use
(`spec.containers[].resources.claims`); both parse paths read those holdings alike. The exporter
shows the pod on the claim's devices (the allocation the kubelet's report would give: container,
`claim:<podClaim>/<request>`, claim), on `gpu_device_allocation_info`, only while the claim's
`status.reservedFor` lists the pod's uid; the device's health stays its slice's (the pod reports
nothing). A kubelet that does write the status wins (no double holding); the claim deleted or its
reservation gone drops the holding; claim, slice and pod arriving in any order end the same; after a
restart the holding comes back from the directory, still report-less.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.decode import pod_from_dict
from exporter.directory import Directory, open_store
from exporter.exposition import render_metrics
from exporter.observer import persist
from exporter.parse import ExtendedAllocation, parse_pod, parse_pod_struct
from exporter.snapshot import SOURCE_POD, SOURCE_SLICE, Allocation
from exporter.state import DeviceStateStore
from gpuhealth.clock import ManualClock
from tests.exporter.fixtures.builders import DRIVER, claim, container, gpu_uuid, pod, resource, slice_

U0, U1 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1)
CLAIM = "train-0-gpus-x7k9p"
UID = "uid-team-a-train-0"
XID = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
HELD = Allocation("team-a", "train-0", "main", "claim:gpus/gpu", CLAIM)


def _slice(taints: dict[str, list[dict[str, str]]] | None = None) -> dict[str, Any]:
    return slice_("node-1-gpus", "node-1", {"gpu-0": U0, "gpu-1": U1}, taints=taints)


def _claim(reserved: bool = True) -> dict[str, Any]:
    return claim(CLAIM, [("gpu", DRIVER, "node-1", "gpu-1")], reserved_for=[UID] if reserved else None)


def _pod(rv: int = 1, phase: str = "Running", reported: str | None = None) -> dict[str, Any]:
    """A DRA pod using claim `gpus`, request `gpu`; `reported`: the health its kubelet writes
    (None: a kubelet that writes no allocatedResourcesStatus)."""
    groups = [("claim:gpus/gpu", [resource(f"{DRIVER}/node-1/gpu-1", reported)])] if reported else []
    obj = pod("train-0", container("main", *groups), rv=rv, phase=phase, claim_statuses={"gpus": CLAIM})
    obj["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "one-gpu"}]
    obj["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus", "request": "gpu"}]}
    return obj


def _held(store: DeviceStateStore, uuid: str = U1) -> tuple[Allocation, ...]:
    return store.snapshot().devices[("node-1", uuid)].allocations


def test_both_parse_paths_read_the_claims_the_containers_use() -> None:
    obj = _pod()
    obj["spec"]["containers"].append({"name": "side", "resources": {"claims": [{"name": "gpus"}]}})
    obj["spec"]["containers"].append({"name": "none", "resources": {"claims": [{"name": "unnamed"}]}})
    want = (
        ExtendedAllocation("main", "claim:gpus/gpu", CLAIM, "gpu"),
        ExtendedAllocation("side", "claim:gpus", CLAIM, ""),
    )
    by_dict = parse_pod(obj)
    decoded = pod_from_dict(obj)
    assert decoded is not None
    by_struct = parse_pod_struct(decoded)
    assert by_dict is not None and by_struct is not None
    assert by_dict.claimed == by_struct.claimed == want
    assert by_dict.entries == by_struct.entries == ()


def test_the_pod_shows_on_its_device_through_its_claim(store: DeviceStateStore, clock: ManualClock) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", _claim())
    store.apply_pod("ADDED", _pod())
    devices = store.snapshot().devices
    assert devices[("node-1", U1)].allocations == (HELD,)
    assert devices[("node-1", U0)].allocations == ()
    # The kubelet says nothing about the device: its slice stays its health source.
    assert (devices[("node-1", U1)].health, devices[("node-1", U1)].source) == ("Healthy", SOURCE_SLICE)
    text = render_metrics(store.snapshot(), clock.now()).decode()
    info = [line for line in text.splitlines() if line.startswith("gpu_device_allocation_info{")]
    assert len(info) == 1
    for label in (f'claim="{CLAIM}"', 'pod="train-0"', 'container="main"', 'resource="claim:gpus/gpu"'):
        assert label in info[0]


def test_the_allocation_is_the_one_a_kubelet_report_gives(clock: ManualClock) -> None:
    silent, reporting = DeviceStateStore(clock), DeviceStateStore(clock)
    for store, obj in ((silent, _pod()), (reporting, _pod(reported="Healthy"))):
        store.apply_slice("ADDED", _slice())
        store.apply_claim("ADDED", _claim())
        store.apply_pod("ADDED", obj)
    assert _held(silent) == _held(reporting) == (HELD,)
    assert _held(reporting) and reporting.snapshot().devices[("node-1", U1)].source == SOURCE_POD


def test_a_kubelet_that_writes_the_status_wins(store: DeviceStateStore) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", _claim())
    store.apply_pod("ADDED", _pod())
    store.apply_pod("MODIFIED", _pod(rv=2, reported="Unhealthy"))
    device = store.snapshot().devices[("node-1", U1)]
    assert (device.allocations, device.health, device.source) == ((HELD,), "Unhealthy", SOURCE_POD)
    store.apply_pod("MODIFIED", _pod(rv=3))  # the kubelet stops writing it (downgraded)
    assert _held(store) == (HELD,)


def test_only_while_the_claim_is_reserved_for_the_pod(store: DeviceStateStore) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", _claim(reserved=False))
    store.apply_pod("ADDED", _pod())
    assert _held(store) == ()
    store.apply_claim("MODIFIED", _claim())
    assert _held(store) == (HELD,)
    store.apply_claim("MODIFIED", _claim(reserved=False))
    assert _held(store) == ()
    store.apply_claim("MODIFIED", _claim())
    store.apply_claim("DELETED", _claim())
    device = store.snapshot().devices[("node-1", U1)]
    assert (device.allocations, device.health, device.source) == ((), "Healthy", SOURCE_SLICE)


def test_the_driver_taint_reaches_the_device_the_pod_holds(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", _claim())
    store.apply_pod("ADDED", _pod())
    before = store.snapshot().devices[("node-1", U1)]
    clock.advance(5)
    store.apply_slice("MODIFIED", _slice({"gpu-1": [XID]}))
    after = store.snapshot().devices[("node-1", U1)]
    assert (after.health, after.source, after.status_version, after.allocations) == (
        "Unhealthy",
        SOURCE_SLICE,
        before.status_version + 1,
        (HELD,),
    )


def test_a_finished_or_deleted_pod_lets_go(store: DeviceStateStore) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", _claim())
    store.apply_pod("ADDED", _pod())
    store.apply_pod("MODIFIED", _pod(rv=2, phase="Succeeded"))
    assert _held(store) == ()
    store.apply_pod("MODIFIED", _pod(rv=3))
    assert _held(store) == (HELD,)
    store.apply_pod("DELETED", _pod(rv=4))
    assert _held(store) == ()


_EVENTS = {
    "slice": lambda s: s.apply_slice("ADDED", _slice()),
    "claim": lambda s: s.apply_claim("ADDED", _claim()),
    "pod": lambda s: s.apply_pod("ADDED", _pod()),
}


@pytest.mark.parametrize("order", list(itertools.permutations(_EVENTS)))
def test_any_arrival_order_ends_holding_the_device(clock: ManualClock, order: tuple[str, ...]) -> None:
    store = DeviceStateStore(clock)
    for name in order:
        _EVENTS[name](store)
    assert _held(store) == (HELD,)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.sampled_from(["reserve", "unreserve", "delete-claim", "report", "silent", "finish", "delete-pod"]),
        max_size=8,
    )
)
def test_the_holding_follows_the_last_word_of_pod_and_claim(steps: list[str]) -> None:
    """After any sequence of pod and claim changes, the device is held exactly while the pod runs
    and its claim is known, and either its kubelet reports the claim or the claim is reserved for
    it: once, never twice (a report on an unknown claim stays `unresolved/...`)."""
    store = DeviceStateStore(ManualClock())
    store.apply_slice("ADDED", _slice())
    claim_state, pod_state = "reserve", "silent"
    store.apply_claim("ADDED", _claim())
    store.apply_pod("ADDED", _pod())
    for rv, step in enumerate(steps, start=2):
        if step in ("reserve", "unreserve", "delete-claim"):
            if step == "delete-claim":
                if claim_state != "gone":
                    store.apply_claim("DELETED", _claim())
            else:
                store.apply_claim("MODIFIED", _claim(reserved=step == "reserve"))
            claim_state = "gone" if step == "delete-claim" else step
        else:
            if step == "delete-pod":
                store.apply_pod("DELETED", _pod(rv=rv))
            elif step == "finish":
                store.apply_pod("MODIFIED", _pod(rv=rv, phase="Succeeded"))
            else:
                store.apply_pod("MODIFIED", _pod(rv=rv, reported="Healthy" if step == "report" else None))
            pod_state = step
            if step == "delete-pod":
                break
    running = pod_state in ("report", "silent")
    want = running and claim_state != "gone" and (pod_state == "report" or claim_state == "reserve")
    assert _held(store) == ((HELD,) if want else ())


def test_after_a_restart_the_holding_comes_back_report_less(tmp_path: Path, clock: ManualClock) -> None:
    path = str(tmp_path / "directory.sqlite")
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", _claim())
    store.apply_pod("ADDED", _pod())
    persist(store, directory, force=True)
    directory.close()
    directory = Directory(path, clock=clock)
    restored = open_store(directory, clock)
    assert _held(restored) == (HELD,)
    clock.advance(5)
    restored.apply_slice("ADDED", _slice({"gpu-1": [XID]}))
    restored.apply_claim("ADDED", _claim())
    restored.apply_pod("ADDED", _pod())
    device = restored.snapshot().devices[("node-1", U1)]
    assert (device.health, device.source, device.allocations) == ("Unhealthy", SOURCE_SLICE, (HELD,))
    directory.close()
