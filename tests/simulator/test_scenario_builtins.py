"""The built-in scenarios run as their descriptions say (ManualClock, no sleeping).

Aspects: every small built-in runs its whole timeline without a failing timer; in
`xid-and-unknown` the short Unknown clears before a 5-minute tolerance while the long one
outlasts it, and the application XID changes nothing; in `node-partition` the partitioned
node's Lease stops and its pods keep a stale Healthy until the partition heals; every
built-in states its expected outcome (`expect:`) and the section is valid for its own fleet.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from demo.expectations import parse
from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import DeviceHealthChanged, Fleet, FleetEvent
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import builtin_names, resolve


async def run(name: str) -> tuple[Fleet, Store, list[FleetEvent]]:
    clock = ManualClock()
    store = Store(clock)
    fleet = Fleet(resolve(name), store, clock)
    events: list[FleetEvent] = []
    fleet.listeners.append(events.append)
    await fleet.start()
    return fleet, store, events


def health_of(store: Store, node: str, gpu: int) -> set[str]:
    """Health of `node`'s GPU `gpu` in every pod that holds it (resourceIDs end in -gpu-<i> on DRA)."""
    pods, _ = store.list("pods", field_selector=f"spec.nodeName={node}")
    uuid = gpu_uuid(node, gpu)
    out = set()
    for pod in pods:
        for entry in pod["status"]["containerStatuses"][0].get("allocatedResourcesStatus", []):
            for r in entry["resources"]:
                if r["resourceID"].endswith(f"-gpu-{gpu}") or r["resourceID"].startswith(uuid):
                    out.add(r["health"])
    return out


@pytest.mark.parametrize("name", [n for n in builtin_names() if n != "fleet-10k"])
async def test_builtin_runs_its_whole_timeline(name: str, caplog: pytest.LogCaptureFixture) -> None:
    fleet, _, _ = await run(name)
    last = max((f.at for f in fleet.scenario.timeline), default=0.0)
    with caplog.at_level(logging.ERROR):
        await fleet.advance(last + 60)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert fleet.timeline_progress() == (len(fleet.scenario.timeline), len(fleet.scenario.timeline))


async def test_xid_and_unknown_short_unknown_clears_long_one_outlasts_five_minutes() -> None:
    fleet, store, events = await run("xid-and-unknown")
    await fleet.advance(30)
    assert health_of(store, "gpu-dp-1", 0) == {"Healthy"}  # XID 13 is an application error
    await fleet.advance(100)  # t=130
    assert health_of(store, "gpu-dra-1", 1) == {"Healthy"}  # Unknown from ~60 s to 120 s
    assert health_of(store, "gpu-dra-1", 6) == {"Unknown"}
    await fleet.advance(320)  # t=450: still Unknown, more than 5 minutes after it started
    assert health_of(store, "gpu-dra-1", 6) == {"Unknown"}
    changes = [(e.node, e.device, e.old, e.new) for e in events if isinstance(e, DeviceHealthChanged)]
    assert ("gpu-dra-1", "gpu-1", "Healthy", "Unknown") in changes
    assert ("gpu-dra-1", "gpu-1", "Unknown", "Healthy") in changes
    unknown_at = next(e.time for e in events if isinstance(e, DeviceHealthChanged) and e.device == "gpu-6")
    assert 40 + 30 <= unknown_at <= 40 + 30 + 10  # timeout, then at most one sync period
    await fleet.advance(100)  # t=550: reports resumed after 7 minutes
    assert health_of(store, "gpu-dra-1", 6) == {"Healthy"}


async def test_node_partition_lease_stops_and_pods_keep_a_stale_healthy() -> None:
    fleet, store, _ = await run("node-partition")

    def renew_time(node: str) -> Any:
        return store.get("leases.coordination.k8s.io", node, "kube-node-lease")["spec"]["renewTime"]

    await fleet.advance(25)
    frozen = renew_time("gpu-dra-1")
    await fleet.advance(60)  # t=85: the device went Unhealthy at 40 s, under the partition
    assert renew_time("gpu-dra-1") == frozen
    assert renew_time("gpu-dra-0") > frozen
    assert fleet.gpu("gpu-dra-1", 2).reported == "Unhealthy"
    assert health_of(store, "gpu-dra-1", 2) == {"Healthy"}
    await fleet.advance(240)  # t=325: healed at 320 s (a 5-minute partition from 20 s)
    assert renew_time("gpu-dra-1") > frozen
    assert health_of(store, "gpu-dra-1", 2) == {"Unhealthy"}


@pytest.mark.parametrize("name", builtin_names())
def test_builtin_states_a_valid_expected_outcome(name: str) -> None:
    scenario = resolve(name)
    # Checked against the fleet: a misspelt node or GPU fails here, not after a long run.
    expectations = parse(scenario.expect, scenario.source, nodes=scenario.nodes)
    assert not expectations.empty(), f"{name} has no expect: section"
