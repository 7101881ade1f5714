"""Jobs created through the API, over a bare store with the job controller running.

Aspects: pods created up to parallelism, labelled and owned as the real controller does, unbound;
succeeded pods count toward completions and the Job completes (SuccessCriteriaMet, Complete,
completionTime, the Completed event when Events are served); failed pods are replaced after the
backoff and more than backoffLimit failures fail the Job (BackoffLimitExceeded) and delete its
active pods; the scenario's own Jobs (fleet-managed) are left alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from simulator.fleet.job_controller import TRACKING_FINALIZER, JobApiController
from simulator.fleet.objects import MANAGED_BY_FLEET
from tests.support.controllers import Controllers


@pytest.fixture
async def world() -> AsyncIterator[Controllers]:
    world = Controllers()
    world.start(JobApiController(world.store, world.timers, world.recorder, rand_suffix=world.suffix))
    yield world
    await world.stop()


def _job(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": "main", "image": "registry.example/train:1"}],
                    "restartPolicy": "Never",
                },
            },
            **spec,
        },
    }


def _status(world: Controllers, name: str) -> dict[str, Any]:
    return world.store.get("jobs.batch", name, "default").get("status") or {}


def _active(world: Controllers, name: str) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in world.pods(selector=f"job-name={name}")
        if p["status"].get("phase") not in ("Succeeded", "Failed")
    ]


async def test_a_job_runs_to_completion(world: Controllers) -> None:
    job = world.store.create("jobs.batch", _job("train", parallelism=2, completions=3))
    uid = job["metadata"]["uid"]
    await world.settle(lambda: len(_active(world, "train")) == 2)
    pod = world.pods()[0]
    assert pod["metadata"]["labels"] == {
        "app": "train",
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": "train",
        "controller-uid": uid,
        "job-name": "train",
    }
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
    assert "nodeName" not in pod["spec"]
    assert _status(world, "train")["startTime"]
    for name in _active(world, "train"):
        world.finish(name, "Succeeded")
    # Two succeeded, one more to go: only one new pod (completions bound parallelism).
    await world.settle(
        lambda: len(_active(world, "train")) == 1 and _status(world, "train").get("succeeded") == 2
    )
    world.finish(_active(world, "train")[0], "Succeeded")
    await world.settle(lambda: bool(_status(world, "train").get("completionTime")))
    status = _status(world, "train")
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [
        ("SuccessCriteriaMet", "True"),
        ("Complete", "True"),
    ]
    assert status["succeeded"] == 3 and "active" not in status


async def test_failures_back_off_and_fail_the_job(world: Controllers) -> None:
    world.store.create("jobs.batch", _job("flaky", backoffLimit=1))
    await world.settle(lambda: len(_active(world, "flaky")) == 1)
    world.finish(_active(world, "flaky")[0], "Failed")
    await world.settle(lambda: _status(world, "flaky").get("failed") == 1)
    assert _active(world, "flaky") == []  # the replacement waits the backoff
    await world.advance(11)
    await world.settle(lambda: len(_active(world, "flaky")) == 1)
    world.finish(_active(world, "flaky")[0], "Failed")
    await world.settle(
        lambda: any(c["type"] == "Failed" for c in _status(world, "flaky").get("conditions", []))
    )
    failed = next(c for c in _status(world, "flaky")["conditions"] if c["type"] == "Failed")
    assert (failed["reason"], failed["message"]) == (
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    )
    await world.advance(60)
    assert _active(world, "flaky") == []


async def test_fleet_managed_jobs_are_left_alone(world: Controllers) -> None:
    body = _job("scenario")
    body["metadata"]["annotations"] = {MANAGED_BY_FLEET: "true"}
    world.store.create("jobs.batch", body)
    world.store.create("jobs.batch", _job("api"))
    await world.settle(lambda: len(_active(world, "api")) == 1)
    assert world.pods(selector="job-name=scenario") == []
    assert _status(world, "scenario") == {}


async def test_a_pod_that_succeeded_counts_even_once_it_is_deleted(world: Controllers) -> None:
    # As the kubelet does: the pod terminates, then is deleted with a grace period of 0. The
    # tracking finalizer holds it until the controller has counted it, so the Job completes
    # instead of replacing a pod that did its work (what kube-controller-manager does).
    world.store.create("jobs.batch", _job("once", completions=1))
    await world.settle(lambda: len(_active(world, "once")) == 1)
    name = _active(world, "once")[0]
    assert world.store.get("pods", name, "default")["metadata"]["finalizers"] == [TRACKING_FINALIZER]
    world.finish(name, "Succeeded")
    world.store.delete("pods", name, "default", grace_period_seconds=0)
    await world.settle(lambda: bool(_status(world, "once").get("completionTime")))
    assert _status(world, "once")["succeeded"] == 1
    await world.settle(lambda: world.pods(selector="job-name=once") == [])  # finalizer let go
    await world.advance(60)
    assert world.pods(selector="job-name=once") == []  # never replaced


async def test_an_evicted_pod_under_an_ignore_policy_is_replaced_without_counting(
    world: Controllers,
) -> None:
    policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    world.store.create("jobs.batch", _job("moved", backoffLimit=0, podFailurePolicy=policy))
    await world.settle(lambda: len(_active(world, "moved")) == 1)
    first = _active(world, "moved")[0]

    def evicted(obj: dict[str, Any]) -> None:
        obj["status"] = {
            "phase": "Failed",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
        }

    world.store.mutate("pods", first, "default", evicted)
    world.store.delete("pods", first, "default", grace_period_seconds=0)
    # Replaced at once (no failure back-off), and the Job has not failed at backoffLimit 0.
    await world.settle(lambda: len(_active(world, "moved")) == 1 and _active(world, "moved")[0] != first)
    status = _status(world, "moved")
    assert "failed" not in status and not any(c["type"] == "Failed" for c in status.get("conditions", []))
