"""A DRA driver's health producer (its kubelet plugin pod) bounds how fresh its devices' reports are.

Aspects covered: while the node's plugin pod is Ready, a held DRA device's status age stays
small on Lease renewals; once it is not Ready, the age grows from the Ready condition's
lastTransitionTime however often the kubelet renews its Lease or rewrites the same Healthy
(lazy expiry), and `gpu_node_health_producer_up` says 0; Ready again, the age is small again.
A device-plugin device and an idle NVML GPU on the same node never depend on it; a node where
no producer was ever seen has no series and no bound (nodes without a DRA driver are never
flagged). A deleted plugin pod counts from its deletion, and a replacement that is not Ready
yet does not restart the count; a relist that no longer names it is a deletion; a pod not yet
bound to a node says nothing; a malformed one is counted. The setting's grammar and its
errors, and the command line's `--health-producer`.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from exporter.cli import health_producers, register, settings_from_args
from exporter.exposition import render_metrics
from exporter.settings import (
    DEFAULT_HEALTH_PRODUCERS,
    HealthProducer,
    ObserverSettings,
    parse_health_producer,
)
from exporter.snapshot import producer_down_since, status_age
from exporter.state import DeviceStateStore, producer_resource
from gpuhealth.cli import UsageError
from gpuhealth.clock import ManualClock
from gpuhealth.fields import SettingsError
from gpuhealth.kube.meta import rfc3339
from tests.exporter.fixtures.builders import (
    DRIVER,
    claim,
    container,
    gpu_uuid,
    lease,
    plugin_pod,
    pod,
    resource,
    slice_,
)

U0, U1 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1)
DP = gpu_uuid("node-2", 0)
PRODUCER = producer_resource(DRIVER)


def dra_workload(rv: int, health: str = "Healthy") -> dict[str, Any]:
    return pod(
        "w",
        container(
            "main", ("claim:gpus", [resource("k8s.gpu.nvidia.com/claim=claim-uid-w-gpus-gpu-0", health)])
        ),
        rv=rv,
        claim_statuses={"gpus": "w-gpus"},
    )


def dp_workload(rv: int) -> dict[str, Any]:
    return pod("d", container("main", ("nvidia.com/gpu", [resource(DP)])), node="node-2", rv=rv)


def ages(store: DeviceStateStore, now: float) -> dict[str, float]:
    snap = store.snapshot()
    return {
        d.device: status_age(d, snap.nodes.get(d.node), snap.nvml, now, producer_down_since(snap, d))
        for d in snap.devices.values()
    }


def up_lines(body: bytes) -> list[str]:
    return [line for line in body.decode().splitlines() if line.startswith("gpu_node_health_producer_up{")]


@pytest.fixture
def fleet(store: DeviceStateStore, clock: ManualClock) -> DeviceStateStore:
    """node-1: a DRA node (slice, claim, a pod on gpu-0, its plugin Ready); node-2: device plugin."""
    store.apply_slice("ADDED", slice_("node-1-gpus", "node-1", {"gpu-0": U0, "gpu-1": U1}))
    store.apply_claim("ADDED", claim("w-gpus", [("gpus", DRIVER, "node-1", "gpu-0")]))
    store.apply_event(PRODUCER, "ADDED", plugin_pod(True, clock.now()))
    for node in ("node-1", "node-2"):
        store.apply_lease("ADDED", lease(node, rfc3339(clock.now())))
    store.apply_pod("ADDED", dra_workload(1))
    store.apply_pod("ADDED", dp_workload(1))
    return store


def renew(store: DeviceStateStore, clock: ManualClock, seconds: float, rv: int) -> None:
    """`seconds` pass with the kubelets alive: Leases renewed, the same Healthy written again."""
    clock.advance(seconds)
    for node in ("node-1", "node-2"):
        store.apply_lease("MODIFIED", lease(node, rfc3339(clock.now())))
    store.apply_pod("MODIFIED", dra_workload(rv))


def test_a_plugin_that_is_not_ready_stops_confirming_its_drivers_devices(
    fleet: DeviceStateStore, clock: ManualClock
) -> None:
    renew(fleet, clock, 300, rv=2)
    assert ages(fleet, clock.now()) == {U0: 0.0, U1: 0.0, DP: 0.0}
    assert up_lines(render_metrics(fleet.snapshot(), clock.now())) == [
        'gpu_node_health_producer_up{node="node-1",driver="gpu.nvidia.com"} 1'
    ]
    # The plugin's probe fails at t0 (the kubelet writes Ready=False then); the health stream is
    # gone, yet the kubelet keeps renewing its Lease and writing the Healthy it last heard.
    t0 = clock.now() + 5
    clock.advance(10)
    fleet.apply_event(PRODUCER, "MODIFIED", plugin_pod(False, t0, rv=2))
    for step in range(3, 9):
        renew(fleet, clock, 30, rv=step)
    now = clock.now()
    got = ages(fleet, now)
    assert got[U0] == got[U1] == now - t0 == 185.0
    assert got[DP] == 0.0  # a device-plugin device has no DRA producer
    body = render_metrics(fleet.snapshot(), now)
    assert up_lines(body) == ['gpu_node_health_producer_up{node="node-1",driver="gpu.nvidia.com"} 0']
    assert f'gpu_device_status_age_seconds{{node="node-1",device="{U0}"}} 185' in body.decode()
    assert fleet.snapshot().devices[("node-1", U0)].health == "Healthy"  # the report itself is kept
    # Ready again: the plugin's stream confirms again from the next renewal.
    fleet.apply_event(PRODUCER, "MODIFIED", plugin_pod(True, now, rv=3))
    renew(fleet, clock, 10, rv=9)
    assert ages(fleet, clock.now()) == {U0: 0.0, U1: 0.0, DP: 0.0}
    assert fleet.snapshot().producers[("node-1", DRIVER)].down_since is None


def test_a_node_whose_producer_was_never_seen_is_never_flagged(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_slice("ADDED", slice_("node-1-gpus", "node-1", {"gpu-0": U0}))
    store.apply_lease("ADDED", lease("node-1", rfc3339(clock.now())))
    clock.advance(600)
    store.apply_lease("MODIFIED", lease("node-1", rfc3339(clock.now())))
    assert ages(store, clock.now()) == {U0: 0.0}
    assert up_lines(render_metrics(store.snapshot(), clock.now())) == []
    assert b"# TYPE gpu_node_health_producer_up gauge" in render_metrics(store.snapshot(), clock.now())


def test_a_deleted_plugin_counts_from_its_deletion_and_a_replacement_not_ready_keeps_the_count(
    fleet: DeviceStateStore, clock: ManualClock
) -> None:
    clock.advance(20)
    deleted_at = clock.now()
    fleet.apply_event(PRODUCER, "DELETED", plugin_pod(True, 0.0, rv=2))
    assert fleet.snapshot().producers[("node-1", DRIVER)].down_since == deleted_at
    clock.advance(30)
    # The DaemonSet's new pod starts: not Ready yet (its startup probe has not passed).
    fleet.apply_event(PRODUCER, "ADDED", plugin_pod(False, clock.now(), name="plugin-b", rv=3))
    assert fleet.snapshot().producers[("node-1", DRIVER)].down_since == deleted_at
    renew(fleet, clock, 100, rv=2)
    assert ages(fleet, clock.now())[U0] == 130.0
    fleet.apply_event(PRODUCER, "MODIFIED", plugin_pod(True, clock.now(), name="plugin-b", rv=4))
    assert fleet.snapshot().producers[("node-1", DRIVER)].ready


def test_a_relist_without_the_plugin_is_its_deletion(fleet: DeviceStateStore, clock: ManualClock) -> None:
    clock.advance(7)
    fleet.relist(PRODUCER, [])
    assert fleet.snapshot().producers[("node-1", DRIVER)].down_since == clock.now()
    fleet.relist(PRODUCER, [plugin_pod(True, clock.now(), rv=5)])
    assert fleet.snapshot().producers[("node-1", DRIVER)].ready


def test_an_unbound_plugin_pod_says_nothing_and_a_malformed_one_is_counted(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_event(PRODUCER, "ADDED", plugin_pod(False, clock.now(), node=None))
    store.apply_event(PRODUCER, "ADDED", {"metadata": {"name": 7}})
    assert store.snapshot().producers == {}
    assert store.stats.parse_errors["malformed_producer"] == 1
    # No Ready condition at all (just created): not Ready, counted from when it was seen.
    store.apply_event(PRODUCER, "ADDED", plugin_pod(None, 0.0))
    assert store.snapshot().producers[("node-1", DRIVER)].down_since == clock.now()


def test_the_setting_names_driver_namespace_and_selector() -> None:
    assert parse_health_producer("gpu.nvidia.com=ns/app=plugin,tier!=x") == HealthProducer(
        "gpu.nvidia.com", "ns", "app=plugin,tier!=x"
    )
    for bad, says in (
        ("gpu.nvidia.com", "expected DRIVER=NAMESPACE/LABEL-SELECTOR"),
        ("gpu.nvidia.com=ns", "expected DRIVER=NAMESPACE/LABEL-SELECTOR"),
        ("gpu.nvidia.com=ns/app in (a)", "is not a label requirement"),
    ):
        with pytest.raises(ValueError, match=says):
            parse_health_producer(bad)
    with pytest.raises(SettingsError, match="names a driver twice"):
        ObserverSettings(health_producers=(*DEFAULT_HEALTH_PRODUCERS, *DEFAULT_HEALTH_PRODUCERS))


def test_the_command_line_ships_the_nvidia_plugin_and_takes_others_or_none() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())

    def producers(*args: str) -> tuple[HealthProducer, ...]:
        return settings_from_args(parser.parse_args(["exporter", *args])).observer.health_producers

    assert producers() == DEFAULT_HEALTH_PRODUCERS
    assert producers("--health-producer", "none") == ()
    assert producers("--health-producer", "x.example.com=ns/app=p") == (
        HealthProducer("x.example.com", "ns", "app=p"),
    )
    with pytest.raises(UsageError, match="cannot be combined"):
        health_producers([None, HealthProducer("x", "ns", "a=b")])
    with pytest.raises(SystemExit):
        parser.parse_args(["exporter", "--health-producer", "nonsense"])
