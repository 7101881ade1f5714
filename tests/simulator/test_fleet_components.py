"""The fleet's parts on their own: layering, simulated time, health reports, device filters, layout.

Aspects: `simulator.model` imports nothing from the simulator and parsing a scenario loads no
fleet; the component modules never import each other (only `simulator.fleet.fleet` wires
them); timers due at the same time run in the order set and `advance` runs each at its time;
a device plugin's report keeps no message while a DRA driver's does; the scheduler's device
filters (plugin health only, never the quarantine annotation; slice taints, DeviceTaintRules,
less those the claim request tolerates);
freed slots go back in allocation order; the first-fit layout never shares a slot and honours
path and node group; a fleet takes exactly one way to the API, and without a store it has no
simulated control plane.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.clock import ManualClock, SystemClock
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.health import HEALTHY, UNHEALTHY, Gpu, record_report
from simulator.fleet.node_api import StoreNodeApi
from simulator.fleet.placement import blocked_devices
from simulator.fleet.state import SimNode, SimPod
from simulator.fleet.timers import Timers
from simulator.model import (
    DEVICE_PLUGIN,
    DRA,
    NodeGroup,
    PlacementError,
    Scenario,
    Settings,
    Slot,
    Workload,
    eligible,
    node_slots,
    place_workloads,
)
from simulator.scenario import from_dict

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = (
    "kubelet",
    "device_plugin",
    "dra_driver",
    "scheduler",
    "job_controller",
    "node_lifecycle",
    "timeline",
)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


# ---------------------------------------------------------------------------- layering


def test_the_model_imports_nothing_from_the_simulator() -> None:
    imports = imported_modules(ROOT / "simulator" / "model.py")
    assert not {m for m in imports if m.split(".")[0] in ("simulator", "aiohttp", "yaml")}


def test_parsing_a_scenario_loads_no_fleet_and_no_api_server() -> None:
    code = (
        "import sys, simulator.scenario; print(sorted(m for m in sys.modules if m.startswith('simulator')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['simulator', 'simulator.model', 'simulator.scenario']"


@pytest.mark.parametrize("component", COMPONENTS)
def test_components_do_not_import_each_other(component: str) -> None:
    imports = imported_modules(ROOT / "simulator" / "fleet" / f"{component}.py")
    others = {f"simulator.fleet.{c}" for c in COMPONENTS if c != component} | {"simulator.fleet.fleet"}
    assert not imports & others
    assert "simulator.scenario" not in imports


# ---------------------------------------------------------------------------- simulated time


async def test_timers_due_together_run_in_the_order_set_and_advance_runs_each_at_its_time() -> None:
    clock = ManualClock()
    timers = Timers(clock, speed=2.0)
    seen: list[tuple[str, float]] = []
    for name, due in (("b", 4.0), ("a", 2.0), ("b2", 4.0), ("c", 9.0)):
        timers.at(due, lambda name=name: seen.append((name, timers.now())))
    await timers.advance(5.0)
    assert seen == [("a", 2.0), ("b", 4.0), ("b2", 4.0)]
    assert timers.now() == pytest.approx(5.0)
    assert timers.next_due() == 9.0
    await timers.advance(4.0)
    assert seen[-1] == ("c", pytest.approx(9.0))


async def test_a_failing_timer_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    timers = Timers(ManualClock())
    seen: list[int] = []

    def fail() -> None:
        raise RuntimeError("boom")

    timers.at(1.0, fail)
    timers.at(1.0, lambda: seen.append(1))
    await timers.advance(1.0)
    assert seen == [1]
    assert "boom" in caplog.text


async def test_advance_needs_a_manual_clock_and_speed_must_be_positive() -> None:
    with pytest.raises(TypeError):
        await Timers(SystemClock()).advance(1)
    with pytest.raises(ValueError, match="speed"):
        Timers(ManualClock(), speed=0)


# ---------------------------------------------------------------------------- health reports


def gpu(path: str = DEVICE_PLUGIN, index: int = 0) -> Gpu:
    return Gpu("n-0", index, f"GPU-{index}", path)


def test_a_device_plugin_report_keeps_no_message_but_a_new_message_is_still_news() -> None:
    g = gpu(DEVICE_PLUGIN)
    assert record_report(g, UNHEALTHY, "xid 79", keeps_message=False)
    assert (g.reported, g.message) == (UNHEALTHY, None)
    # The stored message is None, so the same report with a message counts as a change.
    assert record_report(g, UNHEALTHY, "xid 79", keeps_message=False)
    assert not record_report(g, UNHEALTHY, None, keeps_message=False)


def test_a_dra_report_keeps_its_message_and_a_repeat_is_not_news() -> None:
    g = gpu(DRA)
    assert record_report(g, UNHEALTHY, "xid 79", keeps_message=True)
    assert (g.reported, g.message) == (UNHEALTHY, "xid 79")
    assert not record_report(g, UNHEALTHY, "xid 79", keeps_message=True)
    assert record_report(g, HEALTHY, None, keeps_message=True)


# ---------------------------------------------------------------------------- device filters


def group(
    path: str = DEVICE_PLUGIN, gpus: int = 4, shared: int = 0, name: str = "n", count: int = 1
) -> NodeGroup:
    return NodeGroup(name, count, f"{name}-", gpus, path, shared, "H100", "80Gi", {})  # type: ignore[arg-type]


def sim_node(path: str) -> SimNode:
    g = group(path)
    node = SimNode("n-0", 0, g, [gpu(path, i) for i in range(g.gpus_per_node)])
    node.free = node_slots(g)
    return node


def test_device_plugin_filters_only_what_the_plugin_reports_unhealthy_and_a_broken_stream() -> None:
    node = sim_node(DEVICE_PLUGIN)
    node.gpus[1].reported = UNHEALTHY
    # Quarantined devices the plugin still reports Healthy are not the kubelet's business: the
    # annotation lives on the Node, which `blocked_devices` does not even take.
    assert blocked_devices(node, []) == {1}
    node.stream_ok = False
    assert blocked_devices(node, []) == {0, 1, 2, 3}


def test_dra_filters_slice_taints_and_matching_device_taint_rules_but_not_health() -> None:
    node = sim_node(DRA)
    node.gpus[0].reported = UNHEALTHY  # health alone does not keep the DRA scheduler away
    node.gpus[1].taints = [{"key": "gpu.nvidia.com/xid", "effect": "NoSchedule"}]

    def rule(effect: str, **selector: str) -> dict[str, Any]:
        return {"spec": {"deviceSelector": selector, "taint": {"key": "k", "effect": effect}}}

    rules = [
        rule("NoExecute", pool="n-0", device="gpu-2"),
        rule("NoSchedule", pool="other-node"),
        rule("PreferNoSchedule", device="gpu-3"),
        rule("NoSchedule", driver="other.driver"),
    ]
    assert blocked_devices(node, rules) == {1, 2}
    assert blocked_devices(node, [rule("NoSchedule", driver="gpu.nvidia.com")]) == {0, 1, 2, 3}


def test_dra_devices_whose_taints_the_claim_request_tolerates_are_usable() -> None:
    node = sim_node(DRA)

    def rule(key: str, device: str) -> dict[str, Any]:
        return {"spec": {"deviceSelector": {"device": device}, "taint": {"key": key, "effect": "NoSchedule"}}}

    rules = [rule("gpuhealth.io/canary", "gpu-1"), rule("gpuhealth.io/quarantine", "gpu-2")]
    canary_ok = [{"key": "gpuhealth.io/canary", "operator": "Exists", "effect": "NoSchedule"}]
    assert blocked_devices(node, rules) == {1, 2}
    assert blocked_devices(node, rules, canary_ok) == {2}  # the ramp opens, the quarantine does not
    node.gpus[3].taints = [{"key": "gpuhealth.io/canary", "effect": "NoSchedule"}]  # a slice taint too
    assert blocked_devices(node, rules, canary_ok) == {2}


def test_freed_slots_go_back_in_allocation_order() -> None:
    g = group(DEVICE_PLUGIN, gpus=2, shared=2)
    node = SimNode("n-0", 0, g, [gpu(DEVICE_PLUGIN, i) for i in range(2)])
    node.free = node_slots(g)
    assert node.free == [Slot(0, 0), Slot(1, 0), Slot(0, 1), Slot(1, 1)]  # replica-major
    workload = workload_of(gpus_per_pod=2)
    first = SimPod("a", "default", "n-0", workload, (Slot(0, 0), Slot(1, 0)))
    node.reserve(first.slots)
    assert [g.allocated for g in node.gpus] == [1, 1]
    node.release(first)
    assert node.free == node_slots(g)
    assert [g.allocated for g in node.gpus] == [0, 0]


# ---------------------------------------------------------------------------- first-fit layout


def workload_of(
    gpus_per_pod: int = 1, replicas: int = 1, path: str | None = None, node_group: str | None = None
) -> Workload:
    return Workload(
        "w", "default", "Deployment", replicas, gpus_per_pod, "none", "fixed", path,  # type: ignore[arg-type]
        node_group, False, "template", "request", None,
    )  # fmt: skip


@given(
    groups=st.lists(
        st.tuples(
            st.sampled_from([DEVICE_PLUGIN, DRA]), st.integers(1, 3), st.integers(1, 4), st.integers(0, 2)
        ),
        min_size=1,
        max_size=3,
    ),
    loads=st.lists(
        st.tuples(st.integers(1, 4), st.integers(0, 6), st.sampled_from([None, DEVICE_PLUGIN, DRA])),
        max_size=4,
    ),
)
def test_the_layout_never_shares_a_slot_and_honours_path_and_group(
    groups: list[tuple[str, int, int, int]], loads: list[tuple[int, int, str | None]]
) -> None:
    fleet = tuple(
        group(path, gpus, shared if path == DEVICE_PLUGIN else 0, name=f"g{i}", count=count)
        for i, (path, count, gpus, shared) in enumerate(groups)
    )
    workloads = tuple(workload_of(gpus_per_pod=g, replicas=r, path=p) for g, r, p in loads)
    nodes = {name: g for g in fleet for name in g.node_names()}
    scenario = Scenario("s", "", "<test>", Settings(), fleet, workloads, (), nodes)
    try:
        layout = place_workloads(scenario)
    except PlacementError as exc:
        assert 0 <= exc.index < len(workloads) and exc.reason
        return
    used = [(p.node, s) for p in layout for s in p.slots]
    assert len(used) == len(set(used))
    for p in layout:
        assert len(p.slots) == workloads[p.workload].gpus_per_pod
        assert eligible(workloads[p.workload], nodes[p.node])
        assert set(p.slots) <= set(node_slots(nodes[p.node]))
    assert len(layout) == sum(w.replicas for w in workloads)


# ---------------------------------------------------------------------------- the seam


def test_a_fleet_takes_exactly_one_way_to_the_api_and_has_no_control_plane_without_a_store() -> None:
    clock = ManualClock()
    scenario = from_dict({"fleet": [{"name": "n", "count": 1, "gpusPerNode": 2, "path": "dra"}]})
    store = Store(clock)
    with pytest.raises(ValueError, match="either the simulated control plane's store or the node_api"):
        Fleet(scenario, None, clock)
    with pytest.raises(ValueError, match="either the simulated control plane's store or the node_api"):
        Fleet(scenario, store, clock, node_api=StoreNodeApi(store))
    agents = Fleet(scenario, None, clock, node_api=StoreNodeApi(Store(clock)))
    assert not agents.simulated_control_plane
    with pytest.raises(RuntimeError, match="the simulated control plane is off"):
        agents.scheduler  # noqa: B018
    assert Fleet(scenario, store, clock).simulated_control_plane
