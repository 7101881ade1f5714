"""The reconciler under injected API faults (tests.support.faulty_transport), on a running cluster.

Aspects: passes through a seeded mix of 500/503/409/429/timeouts and writes whose responses
were lost converge, once the faults stop, to the end a fault-free pass reaches (every record
Quarantined, one DeviceTaintRule per DRA record, the node annotation listing exactly the
device-plugin devices, nothing stuck); a pass never raises; a fault in one record's writes
leaves the other records' progress in that same pass; the records' watch that wakes the
passes survives dropped streams and 410s (each new record is quarantined by a pass it woke).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gpuhealth.clock import ManualClock
from gpuhealth.kube.backoff import WatchBackoff
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.resources import NAMESPACE, NODE, POD
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import wait_until
from responder.enforce.hold import device_ids
from responder.enforce.hold_plan import HOLDER_LABEL
from responder.enforce.node_annotation import DEVICE_PLUGIN, NODE_ANNOTATION
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import discover
from responder.reconcile.breaker_store import BreakerStore
from responder.reconcile.events import EVENT, KubeEvents
from responder.reconcile.health import StaticHealth
from responder.reconcile.policy import Health
from responder.reconcile.reconciler import Reconciler
from responder.records import HELD, QUARANTINES, Phase
from simulator.fleet.objects import gpu_uuid
from simulator.testing import running_cluster
from tests.responder.test_reconciler_simulated import CRD_FILE, CRDS, NS, SCENARIO, SETTINGS, World
from tests.support.faulty_transport import WATCH_ONLY, Fault, FaultyTransport
from tests.support.holds import wiring

pytestmark = pytest.mark.integration

REQUEST_FAULTS = [f for f in Fault if f not in WATCH_ONLY]
DEVICES = [("dp-0", 0, False), ("dp-1", 1, False), ("dra-0", 2, True), ("dra-0", 3, True)]


@pytest.fixture
def world() -> Iterator[World]:
    with running_cluster(SCENARIO, speed=10) as cluster:
        client = KubeClient(KubeTransport(api_client(str(cluster.kubeconfig_path))))
        client.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
        client.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait_until("the CRD served", lambda: client.list(QUARANTINES) is not None, timeout=20)
        health = StaticHealth()
        for node in ("dra-0", "dp-0", "dp-1"):
            for i in range(4):
                device = f"gpu.nvidia.com/{node}/gpu-{i}" if node == "dra-0" else gpu_uuid(node, i)
                health.set(node, device, Health.HEALTHY, 0.0)
        w = World(client, ManualClock(), health, None, cluster.kubeconfig_path, cluster)  # type: ignore[arg-type]
        try:
            yield w
        finally:
            client.close()


def faulted_reconciler(w: World, client: KubeClient) -> Reconciler:
    return Reconciler(
        client,
        health=w.health,
        **wiring(client, Enforcer(client, discover(w.client))),
        events=KubeEvents(client),
        breaker_store=BreakerStore(client, NS),
        settings=SETTINGS,
        clock=w.clock,
        registry=CollectorRegistry(),
    )


def assert_converged(w: World, names: list[str]) -> dict[str, int]:
    """The end a fault-free pass reaches; returns the Events per (record, reason) for the report."""
    assert {n: w.record(n).status.phase for n in names} == dict.fromkeys(names, Phase.QUARANTINED)
    rules_resource = discover(w.client)
    assert rules_resource is not None
    owners = Counter(
        ref["uid"]
        for rule in w.client.list(rules_resource).items
        for ref in rule["metadata"]["ownerReferences"]
    )
    dra = [n for n, (_, _, is_dra) in zip(names, DEVICES, strict=True) if is_dra]
    assert owners == Counter({w.record(n).uid: 1 for n in dra}), "a DeviceTaintRule doubled or missing"
    for node in ("dp-0", "dp-1"):
        listed = json.loads(w.client.get(NODE, node)["metadata"]["annotations"][NODE_ANNOTATION])
        expected = [gpu_uuid(n, i) for n, i, is_dra in DEVICES if n == node and not is_dra]
        assert sorted(listed) == sorted(expected), f"{node}: annotation {listed}"
    events = Counter(
        f"{e['involvedObject']['name']}/{e['reason']}"
        for e in w.client.list(EVENT, namespace="default").items
    )
    return dict(events)


@pytest.mark.parametrize("seed", [11, 12])
def test_faulted_passes_converge_to_the_clean_end(world: World, seed: int) -> None:
    w = world
    names = [w.add(node, i, dra=dra) for node, i, dra in DEVICES]
    faults = FaultyTransport(
        KubeTransport(api_client(str(w.kubeconfig))), seed=seed, rate=0.3, kinds=REQUEST_FAULTS
    )
    client = KubeClient(faults)
    try:
        reconciler = faulted_reconciler(w, client)
        for _ in range(10):
            reconciler.reconcile_once()  # never raises, whatever the API answers
            w.clock.advance(2)
        faults.enabled = False

        def converged() -> bool:
            reconciler.reconcile_once()
            w.clock.advance(2)
            records = [w.record(n) for n in names]
            held = [r.status.condition(HELD) for r in records if r.spec.path == DEVICE_PLUGIN]
            # Quarantined, and each device-plugin card held by a holder pod (the kubelet starts
            # them in wall time: passes until it has).
            return all(r.status.phase == Phase.QUARANTINED for r in records) and all(
                c is not None and c.reason == "Held" for c in held
            )

        wait_until("every record quarantined and every device-plugin card held", converged, timeout=30)
        # Once converged, a clean pass finds nothing to do: nothing is stuck half-done.
        report = reconciler.reconcile_once()
        assert report.outcomes == dict.fromkeys(names, "unchanged")
        # Lost responses to holder creates leave no stray holder: one per device-plugin card.
        holders = w.client.list(POD, namespace=NS, label_selector=HOLDER_LABEL).items
        assert sorted(device_ids(p) for p in holders) == sorted(
            (gpu_uuid(n, i),) for n, i, dra in DEVICES if not dra
        )
    finally:
        client.close()
    events = assert_converged(w, names)
    doubled_events = sum(c - 1 for c in events.values() if c > 1)
    print(
        f"\nreconciler seed {seed}: faults injected {dict(sorted(faults.counts().items()))}; "
        f"duplicate actions 0; lost quarantines 0; doubled Events (notices) {doubled_events}"
    )
    assert faults.injected and doubled_events == 0


def test_a_fault_in_one_record_never_stops_the_pass(world: World) -> None:
    w = world
    names = [w.add(node, i, dra=dra) for node, i, dra in DEVICES]
    victim = names[2]  # a DRA record: its rule create and its own writes fail
    faults = FaultyTransport(
        KubeTransport(api_client(str(w.kubeconfig))),
        rate=1.0,
        kinds=[Fault.SERVER_ERROR],
        match=lambda method, path, _params: method != "GET" and victim in path,
    )
    client = KubeClient(faults)
    try:
        report = faulted_reconciler(w, client).reconcile_once()
        assert set(report.outcomes) == set(names) and not report.skipped
        others = [n for n in names if n != victim]
        assert {n: w.record(n).status.phase for n in others} == dict.fromkeys(others, Phase.QUARANTINED)
        assert w.record(victim).status.phase == Phase.PENDING
        faults.enabled = False
        faulted_reconciler(w, client).reconcile_once()
    finally:
        client.close()
    assert_converged(w, names)


async def test_the_watch_that_wakes_the_passes_survives_drops_and_410s(world: World) -> None:
    w = world
    watches = FaultyTransport(
        KubeTransport(api_client(str(w.kubeconfig))),
        script=[Fault.DROP_WATCH, Fault.GONE, Fault.DROP_WATCH, Fault.GONE],
        match=lambda _method, _path, params: ("watch", "true") in list(params),
    )
    watch_client = KubeClient(watches)
    client = KubeClient(KubeTransport(api_client(str(w.kubeconfig))))
    # Passes come only on a watched change or after an hour: each quarantine below is the watch's.
    reconciler = Reconciler(
        client,
        health=w.health,
        **wiring(client, Enforcer(client, discover(client))),
        events=KubeEvents(client),
        breaker_store=BreakerStore(client, NS),
        settings=replace(
            SETTINGS,
            max_recheck_seconds=3600,
            watch_backoff=WatchBackoff(initial_seconds=0.1, max_seconds=0.5),
        ),
        clock=w.clock,
        registry=CollectorRegistry(),
        watch_client=watch_client,
    )
    running = asyncio.create_task(reconciler.run())
    names: list[str] = []
    try:
        for node, i, dra in DEVICES:
            names.append(await asyncio.to_thread(w.add, node, i, dra=dra))

            def quarantined(name: str = names[-1]) -> bool:
                return w.record(name).status.phase == Phase.QUARANTINED

            await asyncio.to_thread(wait_until, f"{names[-1]} quarantined", quarantined, timeout=30)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        watch_client.close()
        client.close()
    counts = watches.counts()
    print(f"\nwatch: faults injected {dict(sorted(counts.items()))}; lost quarantines 0")
    assert counts[Fault.DROP_WATCH.value] >= 1 and counts[Fault.GONE.value] >= 1
    assert_converged(w, names)


def test_a_notice_waits_for_the_record_write_so_a_failed_write_never_doubles_it(world: World) -> None:
    w = world
    name = w.add("dra-0", 1, dra=True)
    faults = FaultyTransport(
        KubeTransport(api_client(str(w.kubeconfig))),
        script=[Fault.UNAVAILABLE],
        match=lambda method, path, _params: method == "PUT" and path.endswith(f"{name}/status"),
    )
    client = KubeClient(faults)
    try:
        reconciler = faulted_reconciler(w, client)
        assert reconciler.reconcile_once().outcomes == {name: "error"}  # enforced, record not written
        assert reconciler.reconcile_once().outcomes == {name: "written"}
    finally:
        client.close()
    assert faults.counts() == {Fault.UNAVAILABLE.value: 1}
    assert w.record(name).status.phase == Phase.QUARANTINED
    assert [r for r, _ in w.events(name)].count("Quarantined") == 1
