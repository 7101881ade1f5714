"""Graceful pod deletion and the workloads' checkpoint agents, stepped with a ManualClock.

Aspects: a DELETE of a running pod of a simulated node sets deletionTimestamp and
deletionGracePeriodSeconds (MODIFIED), the kubelet kills it at the end of the grace period
(exit 137) or when the workload exits on SIGTERM, frees its devices and removes it (DELETED);
gracePeriodSeconds 0 and unbound pods go at once; a shorter second DELETE brings the kill
forward; finalizers still hold the object; the checkpoint agent answers a request after its
delay, never, or with a failure, a workload exits on SIGTERM once its checkpoint is committed,
and work lost since the last commit is counted per job, a recreated pod resuming from it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gpuhealth.kube.meta import parse_rfc3339
from responder.reconcile.work_lost import work_lost
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.scenario import Fault
from tests.simulator.test_kubelet_pods import api_pod, create, events, get, running, scenario, settle


@pytest.fixture
async def dp() -> AsyncIterator[tuple[Fleet, Store]]:
    async for pair in running(scenario("device-plugin")):
        yield pair


def names(store: Store) -> set[str]:
    return {p["metadata"]["name"] for p in store.list("pods")[0]}


async def test_a_running_pod_is_terminating_for_its_grace_period_then_removed(
    dp: tuple[Fleet, Store],
) -> None:
    fleet, store = dp
    await create(store, api_pod("slow", gpus=2, annotations={"sim.gpuhealth.io/stop-after": "never"}))
    await fleet.advance(1)
    watch = store.watch("pods", resource_version=str(store.resource_version))
    deleted = store.delete("pods", "slow", "default")
    await settle()
    meta = deleted["metadata"]
    assert meta["deletionGracePeriodSeconds"] == 30 and meta["deletionTimestamp"]
    etype, entry = await watch.next_entry() or ("", None)
    assert etype == "MODIFIED" and entry is not None
    assert ("Killing", "Normal") in events(store, "slow")
    assert len(fleet.nodes["n-0"].free) == 0  # still running: devices held
    await fleet.advance(10)
    # Another change to the Terminating pod does not move its deadline.
    store.patch(
        "pods", "slow", "default", {"metadata": {"labels": {"x": "y"}}}, "application/merge-patch+json"
    )
    await settle()
    await fleet.advance(19)
    assert "slow" in names(store)
    await fleet.advance(1)
    await settle()
    assert "slow" not in names(store)
    seen = []
    while watch.pending():
        item = await watch.next_entry()
        assert item is not None
        seen.append(item[0])
    assert seen[-1] == "DELETED"
    assert len(fleet.nodes["n-0"].free) == 2
    watch.close()


async def test_force_and_unbound_deletes_are_immediate_and_finalizers_hold(dp: tuple[Fleet, Store]) -> None:
    fleet, store = dp
    await create(store, api_pod("forced", gpus=0, annotations={"sim.gpuhealth.io/stop-after": "never"}))
    await create(store, api_pod("unbound", node=None, gpus=0))
    body = api_pod("held", gpus=0, annotations={"sim.gpuhealth.io/stop-after": "never"})
    body["metadata"]["finalizers"] = ["example.com/hold"]
    await create(store, body)
    await fleet.advance(1)
    store.delete("pods", "forced", "default", grace_period_seconds=0)
    store.delete("pods", "unbound", "default")
    await settle()
    assert names(store) & {"forced", "unbound"} == set()
    store.delete("pods", "held", "default", grace_period_seconds=10)
    await settle()
    # A shorter grace period brings the kill forward; a longer one changes nothing.
    assert (
        store.delete("pods", "held", "default", grace_period_seconds=60)["metadata"][
            "deletionGracePeriodSeconds"
        ]
        == 10
    )
    store.delete("pods", "held", "default", grace_period_seconds=2)
    await settle()
    await fleet.advance(2)
    await settle()
    held = get(store, "held")  # killed, but the finalizer holds the object
    assert held["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    assert held["metadata"]["deletionGracePeriodSeconds"] == 0
    store.patch("pods", "held", "default", {"metadata": {"finalizers": None}}, "application/merge-patch+json")
    assert "held" not in names(store)


async def test_a_workload_exits_on_sigterm_once_its_checkpoint_is_committed(dp: tuple[Fleet, Store]) -> None:
    fleet, store = dp
    annotations = {
        "gpuhealth.io/checkpoint": "annotation",
        "sim.gpuhealth.io/checkpoint-after": "20s",
        "sim.gpuhealth.io/run-seconds": "100",
        "sim.gpuhealth.io/stop-after": "never",
    }
    labels = {"job-name": "train"}
    await create(store, api_pod("train-a", gpus=1, annotations=annotations, labels=labels))
    await fleet.advance(41)  # 40 s of work
    store.patch(
        "pods", "train-a", "default",
        {"metadata": {"annotations": {"gpuhealth.io/checkpoint-requested": "k1"}}},
        "application/merge-patch+json",
    )  # fmt: skip
    await settle()
    store.delete("pods", "train-a", "default")
    await settle()
    await fleet.advance(19)
    assert "train-a" in names(store)
    await fleet.advance(1)
    await settle()
    assert "train-a" not in names(store)  # exited at the commit, 10 s before its grace period ended
    job = fleet.status()["jobs"]["default/train"]
    assert job["checkpoints"] == 1 and job["checkpointedSeconds"] == 60.0
    assert job["workLostSeconds"] == 0.0

    # The job's next pod resumes from the commit: 40 s of its 100 s are left.
    await create(store, api_pod("train-b", gpus=1, annotations=annotations, labels=labels))
    await fleet.advance(30)
    store.delete("pods", "train-b", "default", grace_period_seconds=0)
    await settle()
    job = fleet.status()["jobs"]["default/train"]
    assert job["workLostSeconds"] == 29.0  # ran 29 s since it started at the commit
    await create(store, api_pod("train-c", gpus=1, annotations=annotations, labels=labels))
    await fleet.advance(41)
    assert get(store, "train-c")["status"]["phase"] == "Succeeded"


async def test_checkpoint_agents_that_never_commit_or_fail(dp: tuple[Fleet, Store]) -> None:
    fleet, store = dp
    for name, after in (("never", "never"), ("failing", "fail")):
        annotations = {"gpuhealth.io/checkpoint": "annotation", "sim.gpuhealth.io/checkpoint-after": after}
        await create(store, api_pod(name, gpus=0, annotations=annotations))
    await fleet.advance(1)
    for name in ("never", "failing"):
        store.patch(
            "pods", name, "default",
            {"metadata": {"annotations": {"gpuhealth.io/checkpoint-requested": "k9"}}},
            "application/merge-patch+json",
        )  # fmt: skip
    await settle()
    await fleet.advance(60)
    assert get(store, "failing")["metadata"]["annotations"]["gpuhealth.io/checkpoint-failed"] == "k9"
    never = get(store, "never")["metadata"]["annotations"]
    assert "gpuhealth.io/checkpoint-committed" not in never and "gpuhealth.io/checkpoint-failed" not in never


async def test_scenario_pods_terminate_gracefully_and_are_replaced(dp: tuple[Fleet, Store]) -> None:
    fleet, store = dp
    (old,) = store.list("pods")[0]
    name = old["metadata"]["name"]
    store.delete("pods", name, "default")
    await settle()
    # A scenario workload exits at once on SIGTERM: the pod is gone without waiting out the grace period.
    assert name not in names(store)
    assert ("Killing", "Normal") in events(store, name)
    await fleet.advance(6)
    (new,) = store.list("pods")[0]
    assert new["status"]["phase"] == "Running"


async def test_scenario_checkpoint_fields_drive_the_agent() -> None:
    data = scenario("device-plugin")
    data["workloads"] = [
        {"name": "train", "kind": "Job", "replicas": 1, "gpusPerPod": 1,
         "checkpoint": {"mode": "annotation", "commitAfter": "5s"}},
    ]  # fmt: skip
    async for fleet, store in running(data):
        (pod,) = store.list("pods")[0]
        await fleet.advance(10)
        store.patch(
            "pods", pod["metadata"]["name"], "default",
            {"metadata": {"annotations": {"gpuhealth.io/checkpoint-requested": "r1"}}},
            "application/merge-patch+json",
        )  # fmt: skip
        await settle()
        await fleet.advance(5)
        got = get(store, pod["metadata"]["name"])["metadata"]["annotations"]
        assert got["gpuhealth.io/checkpoint-committed"] == "r1"
        # With the commit, when it was committed: what the responder counts the work lost from.
        assert parse_rfc3339(got["gpuhealth.io/last-checkpoint-time"]) == pytest.approx(fleet.wall())
        assert fleet.status()["jobs"]["default/train"]["checkpoints"] == 1
        await fleet.advance(5)
        evicted = get(store, pod["metadata"]["name"])
        store.delete("pods", pod["metadata"]["name"], "default")
        await settle()
        assert fleet.status()["jobs"]["default/train"]["workLostSeconds"] == pytest.approx(5.0)
        # The responder's reading of the annotation agrees with the job's own ledger.
        lost = work_lost(evicted, fleet.wall())
        assert lost is not None and lost.since == "checkpoint"
        assert lost.seconds == pytest.approx(5.0)


async def test_a_pod_on_a_stopped_kubelet_stays_terminating_but_is_replaced() -> None:
    data = scenario("device-plugin")
    data["fleet"][0]["count"] = 2
    async for fleet, store in running(data):
        (old,) = store.list("pods")[0]
        name = old["metadata"]["name"]
        fleet.inject(Fault(at=fleet.now(), kind="kubelet-stop", node="n-0", duration=120.0))
        await fleet.advance(1)
        store.delete("pods", name, "default")
        await settle()
        await fleet.advance(6)
        pods = {p["metadata"]["name"]: p for p in store.list("pods")[0]}
        assert pods[name]["metadata"]["deletionTimestamp"]  # nobody stops it: Terminating
        (new,) = [p for n, p in pods.items() if n != name]
        assert new["spec"]["nodeName"] == "n-1" and new["status"]["phase"] == "Running"
        await fleet.advance(120)  # the kubelet is back: it stops the pod and removes it
        await settle()
        assert name not in names(store)


async def test_an_eviction_honours_its_delete_options_grace_period(dp: tuple[Fleet, Store]) -> None:
    fleet, store = dp
    await create(store, api_pod("evicted", gpus=0, annotations={"sim.gpuhealth.io/stop-after": "never"}))
    await fleet.advance(1)
    with pytest.raises(Exception, match="gracePeriodSeconds must be an integer"):
        store.evict("evicted", "default", {"deleteOptions": {"gracePeriodSeconds": "soon"}})
    store.evict("evicted", "default", {"deleteOptions": {"gracePeriodSeconds": 3}})
    await settle()
    assert get(store, "evicted")["metadata"]["deletionGracePeriodSeconds"] == 3
    await fleet.advance(3)
    await settle()
    assert "evicted" not in names(store)
