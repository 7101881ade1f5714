"""NVSentinel's janitor in the simulated cluster (simulator.fleet.janitor), in process.

Aspects: a scenario with `janitor:` serves the GPUReset CRD (cluster-scoped, its schema refusing
a request without a node or with a UUID that is not a card's); a request is InProgress at once
and, after the reset's simulated seconds, Complete True with GPUResetSucceeded and phase
Succeeded for a card whose fault a reset clears (the card no longer needs one), ResetJobFailed
and Failed for one it cannot fix, NodeNotFound for a node not in the fleet, each reported as a
fleet event (started, then its outcome); without `janitor:` the kind is not served; a janitor
beside a control plane the fleet does not own is refused by name.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import Store
from simulator.fleet import Fleet, GpuReset
from simulator.fleet.janitor import RESOURCE
from simulator.fleet.node_api import StoreNodeApi
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import from_dict

DATA: dict[str, Any] = {
    "fleet": [{"name": "n", "count": 1, "gpusPerNode": 3, "path": "dra"}],
    "janitor": {"resetSeconds": "20s"},
    "timeline": [
        {"at": "0s", "fault": "device-unhealthy", "device": {"node": "n-0", "gpu": gpu}, "reset": reset}
        for gpu, reset in ((0, "clears"), (1, "fails"))
    ],
}


def request(name: str, node: str, *uuids: str) -> dict[str, Any]:
    return {
        "apiVersion": "janitor.dgxc.nvidia.com/v1alpha1",
        "kind": "GPUReset",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "selector": {"uuids": list(uuids)}},
    }


@pytest.fixture
async def running() -> AsyncIterator[tuple[Fleet, Store, ManualClock, list[Any]]]:
    clock = ManualClock()
    store = Store(clock, seed=3)
    fleet = Fleet(from_dict(DATA), store, clock)
    events: list[Any] = []
    fleet.listeners.append(events.append)
    await fleet.start()
    runs = asyncio.gather(fleet.controllers.run())
    await fleet.advance(1)
    yield fleet, store, clock, events
    fleet.controllers.close()
    fleet.stop()
    await runs


async def settle(fleet: Fleet, seconds: float) -> None:
    for _ in range(5):
        await asyncio.sleep(0)
    await fleet.advance(seconds)
    for _ in range(5):
        await asyncio.sleep(0)


def outcome(store: Store, name: str) -> tuple[str, str, str]:
    status = store.get(RESOURCE, name).get("status") or {}
    complete = [c for c in status.get("conditions") or () if c.get("type") == "Complete"]
    return (
        status.get("phase", ""),
        complete[0]["status"] if complete else "",
        complete[0]["reason"] if complete else "",
    )


async def test_resets_clear_what_a_reset_clears_and_fail_on_the_rest(
    running: tuple[Fleet, Store, ManualClock, list[Any]],
) -> None:
    fleet, store, _, events = running
    assert fleet.gpu("n-0", 0).needs_reset and fleet.gpu("n-0", 1).needs_reset
    store.create(RESOURCE, request("r0", "n-0", gpu_uuid("n-0", 0)))
    store.create(RESOURCE, request("r1", "n-0", gpu_uuid("n-0", 1)))
    store.create(RESOURCE, request("r9", "n-9", gpu_uuid("n-9", 0)))
    await settle(fleet, 1)
    assert outcome(store, "r0") == ("InProgress", "", "")
    await settle(fleet, 25)
    assert outcome(store, "r0") == ("Succeeded", "True", "GPUResetSucceeded")
    assert outcome(store, "r1") == ("Failed", "True", "ResetJobFailed")
    assert outcome(store, "r9") == ("Failed", "True", "NodeNotFound")
    assert not fleet.gpu("n-0", 0).needs_reset
    assert fleet.gpu("n-0", 1).needs_reset
    resets = [(e.request, e.what) for e in events if isinstance(e, GpuReset)]
    assert resets.index(("r0", "started")) < resets.index(("r0", "succeeded"))
    assert ("r1", "failed") in resets and ("r9", "failed") in resets


async def test_the_crd_refuses_a_request_without_a_node_or_with_a_partitions_uuid(
    running: tuple[Fleet, Store, ManualClock, list[Any]],
) -> None:
    _, store, _, _ = running
    for bad in (
        request("x", "", gpu_uuid("n-0", 0)),
        request("y", "n-0", "MIG-4b1c9f2e-0f7a-5c2d-9e1b-3a6f8d0c2b71"),
    ):
        with pytest.raises(ApiError) as info:
            store.create(RESOURCE, bad)
        assert info.value.code == 422


def test_without_a_janitor_no_reset_is_served_and_beside_another_control_plane_none_runs() -> None:
    clock = ManualClock()
    store = Store(clock)
    Fleet(from_dict({**DATA, "janitor": None}), store, clock)
    with pytest.raises(ApiError):
        store.create(RESOURCE, request("r0", "n-0", gpu_uuid("n-0", 0)))
    with pytest.raises(
        ValueError, match="janitor: the simulated janitor runs only on the simulated control plane"
    ):
        Fleet(from_dict(DATA), None, clock, node_api=StoreNodeApi(Store(clock)))
