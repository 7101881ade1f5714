"""The 10,000-node x 8-GPU fleet (`fleet-10k`): memory and listing through the official client.

Aspects: the fleet builds in-process and, after 210 simulated seconds of Lease renewals and
status syncs (the store's watch log full of events), the process stays under 2 GiB; the official
client lists all 15,000 pods and 10,000 nodes over HTTP. Figures are printed (run with -s).
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from gpuhealth.clock import ManualClock
from gpuhealth.kube.config import api_client
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.objects import DRA_PLUGIN_NAMESPACE
from simulator.scenario import resolve
from simulator.testing import running_cluster

pytestmark = pytest.mark.slow

GIB = 1024**3


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def test_fleet_10k_builds_and_runs_with_a_full_watch_log_under_2_gib() -> None:
    scenario = resolve("fleet-10k")
    clock = ManualClock()
    store = Store(clock)
    fleet = Fleet(scenario, store, clock)
    started = time.perf_counter()
    await fleet.start()
    built = time.perf_counter() - started
    rss_built = rss_bytes()
    assert len(fleet.nodes) == 10_000
    assert sum(len(n.gpus) for n in fleet.nodes.values()) == 80_000
    plugins = [p for p in fleet.pods.values() if p.namespace == DRA_PLUGIN_NAMESPACE]
    assert len(fleet.pods) - len(plugins) == 15_000  # the scenario's workloads
    assert len(plugins) == 5_000  # the DRA driver's kubelet plugin, one per DRA node
    started = time.perf_counter()
    await fleet.advance(210)  # 1,000 Lease renewals a second fill the 200,000-event watch log
    ran = time.perf_counter() - started
    rss_ran = rss_bytes()
    done, total = fleet.timeline_progress()
    print(
        f"\nfleet-10k: built in {built:.1f} s, RSS {rss_built / 2**20:.0f} MiB; "
        f"210 simulated s in {ran:.1f} s, RSS {rss_ran / 2**20:.0f} MiB, "
        f"resourceVersion {store.resource_version}, faults {done}/{total}"
    )
    assert done == total
    assert rss_ran < 2 * GIB


@pytest.mark.integration
def test_official_client_lists_every_pod_and_node_of_fleet_10k() -> None:
    started = time.perf_counter()
    with running_cluster("fleet-10k") as cluster:
        ready = time.perf_counter() - started
        core = client.CoreV1Api(api_client(str(cluster.kubeconfig_path)))
        started = time.perf_counter()
        pods = core.list_pod_for_all_namespaces()
        listed_pods = time.perf_counter() - started
        started = time.perf_counter()
        nodes = core.list_node()
        listed_nodes = time.perf_counter() - started
        print(
            f"\nfleet-10k over HTTP: serving after {ready:.1f} s; official client listed "
            f"{len(pods.items)} pods in {listed_pods:.1f} s and "
            f"{len(nodes.items)} nodes in {listed_nodes:.1f} s; "
            f"RSS (server and client) {rss_bytes() / 2**20:.0f} MiB"
        )
        workload = [p for p in pods.items if p.metadata.namespace != DRA_PLUGIN_NAMESPACE]
        assert len(workload) == 15_000 and len(pods.items) == 20_000  # and 5,000 DRA plugin pods
        assert len(nodes.items) == 10_000
        statuses = workload[0].status.container_statuses[0].allocated_resources_status
        assert statuses and statuses[0].resources
