"""The checkpoint agent inside simulated workloads, and the work each job keeps or loses.

A pod annotated `gpuhealth.io/checkpoint: annotation` runs an agent that answers
`gpuhealth.io/checkpoint-requested: <key>` (written by the responder) by writing
`gpuhealth.io/checkpoint-committed: <key>` after the workload's commit delay, never, or by
writing `gpuhealth.io/checkpoint-failed: <key>`. With each commit it also writes when it
committed, `gpuhealth.io/last-checkpoint-time: <RFC 3339>` (docs/workloads.md, "Reporting the
last checkpoint"), from which the responder counts the work an eviction loses. The agent
writes the pod's metadata as an in-pod agent would through the API. Scenario workloads take
the delay from their `checkpoint.commitAfter`; API-created pods from the annotation
`sim.gpuhealth.io/checkpoint-after` (`20s`, `never` or `fail`; default 10 s).

A pod that declares the readiness gate `gpuhealth.io/serving` runs a workload that sets that
condition True once it serves (through pods/status, as the workload writes its commit), and
never again after: once the responder set it False to stop new requests before a checkpoint,
the pod stays out of its Services' endpoints until it ends.

Work is counted per job (scenario Jobs; API pods owned by a Job or labelled with its name): a
pod's work is the job's last committed work when it started plus the simulated seconds it has
run. A commit raises the job's committed work; a pod stopped before it succeeded loses what it
did since then (`work_lost_seconds`), and the job's next pod resumes from the commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuhealth.durations import DurationError, parse_duration
from gpuhealth.kube.meta import rfc3339
from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet.node_api import NodeApi
from simulator.fleet.objects import CHECKPOINT_ANNOTATION, SERVING_CONDITION
from simulator.fleet.state import SimPod
from simulator.fleet.timers import Timers
from simulator.model import CHECKPOINT_AFTER

REQUESTED = "gpuhealth.io/checkpoint-requested"
COMMITTED = "gpuhealth.io/checkpoint-committed"
FAILED = "gpuhealth.io/checkpoint-failed"
AFTER = "sim.gpuhealth.io/checkpoint-after"
LAST_CHECKPOINT = "gpuhealth.io/last-checkpoint-time"


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """How a pod's agent answers: `after` seconds to commit (None: never); `fails`: it fails instead."""

    after: float | None
    fails: bool


def agent_spec(pod: SimPod, annotations: dict[str, str]) -> AgentSpec | None:
    """The agent a pod runs, or None when it has none (or the annotation cannot be read)."""
    if annotations.get(CHECKPOINT_ANNOTATION) != "annotation":
        return None
    if not pod.api:
        return AgentSpec(pod.workload.checkpoint_after, pod.workload.checkpoint_fails)
    text = annotations.get(AFTER, "").strip()
    if not text:
        return AgentSpec(CHECKPOINT_AFTER, False)
    if text == "never":
        return AgentSpec(None, False)
    if text == "fail":
        return AgentSpec(0.0, True)
    try:
        return AgentSpec(parse_duration(text), False)
    except DurationError:
        return None  # documented: an unreadable delay means no agent (nothing is ever answered)


def job_key(pod: SimPod, meta: dict[str, Any]) -> str | None:
    """The job whose work a pod does, as namespace/name; None for pods that are not a job's."""
    if not pod.api:
        return f"{pod.namespace}/{pod.workload.name}" if pod.workload.kind == "Job" else None
    for ref in meta.get("ownerReferences") or ():
        if ref.get("kind") == "Job":
            return f"{pod.namespace}/{ref.get('name')}"
    labels = meta.get("labels") or {}
    name = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
    if name:
        return f"{pod.namespace}/{name}"
    if (meta.get("annotations") or {}).get(CHECKPOINT_ANNOTATION) == "annotation":
        return pod.key  # a bare pod that checkpoints is its own job
    return None


@dataclass(slots=True)
class JobWork:
    committed: float = 0.0
    """Simulated seconds of work the last committed checkpoint holds."""
    lost: float = 0.0
    checkpoints: int = 0
    failed: int = 0


@dataclass(slots=True)
class _Run:
    job: str
    resumed_from: float
    since: float
    """Simulated time the pod's containers started working."""
    spec: AgentSpec | None
    answering: str | None = None
    """The request key being answered."""
    commit_at: float | None = None
    token: int = 0


class CheckpointAgent:
    """The agents of every simulated workload (one object) and the per-job work ledger."""

    def __init__(self, api: NodeApi, timers: Timers) -> None:
        self._api = api
        self._timers = timers
        self._runs: dict[str, _Run] = {}
        self.jobs: dict[str, JobWork] = {}

    def started(self, pod: SimPod, meta: dict[str, Any], since: float | None = None) -> float:
        """The pod's containers start working; returns the work (seconds) it resumes from."""
        job = job_key(pod, meta)
        if job is None:
            return 0.0
        work = self.jobs.setdefault(job, JobWork())
        spec = agent_spec(pod, meta.get("annotations") or {})
        start = self._timers.now() if since is None else since
        self._runs[pod.key] = _Run(job, work.committed, start, spec)
        return work.committed

    def serving(self, pod: SimPod, obj: dict[str, Any]) -> None:
        """The pod's containers started: a workload behind the readiness gate says it serves."""
        gates = (obj.get("spec") or {}).get("readinessGates") or ()
        if not any(g.get("conditionType") == SERVING_CONDITION for g in gates):
            return
        now = format_timestamp(self._timers.wall())

        def fn(current: dict[str, Any]) -> dict[str, Any]:
            conditions = current.setdefault("status", {}).setdefault("conditions", [])
            if not any(c.get("type") == SERVING_CONDITION for c in conditions):
                conditions.append(
                    {
                        "type": SERVING_CONDITION,
                        "status": "True",
                        "reason": "Serving",
                        "lastTransitionTime": now,
                    }
                )
            return current

        try:
            self._api.mutate("pods", pod.name, pod.namespace, fn, subresource="status")
        except ApiError:
            return  # the pod is gone

    def _run(self, pod: SimPod, meta: dict[str, Any]) -> _Run | None:
        run = self._runs.get(pod.key)
        if run is None and not pod.api:
            # Scenario pods are registered when first seen: they worked since they started.
            elapsed = max(0.0, (self._timers.wall() - pod.started) * self._timers.speed)
            self.started(pod, meta, since=max(0.0, self._timers.now() - elapsed))
            run = self._runs.get(pod.key)
        return run

    def observe(self, pod: SimPod, obj: dict[str, Any]) -> None:
        """The pod object changed: answer a new checkpoint request."""
        meta = obj["metadata"]
        annotations = meta.get("annotations") or {}
        key = annotations.get(REQUESTED)
        if not key or annotations.get(COMMITTED) == key or annotations.get(FAILED) == key:
            return
        run = self._run(pod, meta)
        if run is None:
            run = _Run(pod.key, 0.0, self._timers.now(), agent_spec(pod, annotations))
            self._runs[pod.key] = run
        if run.spec is None or run.answering == key or run.spec.after is None:
            return
        run.answering = key
        run.token += 1
        run.commit_at = self._timers.now() + run.spec.after
        self._timers.at(run.commit_at, self._answer, pod, run, run.token)
        self._timers.wake()

    def commit_time(self, pod: SimPod) -> float | None:
        """When a requested checkpoint of the pod will be committed (its workload then exits on SIGTERM)."""
        run = self._runs.get(pod.key)
        if run is None or run.commit_at is None or run.spec is None or run.spec.fails:
            return None
        return run.commit_at

    def _answer(self, pod: SimPod, run: _Run, token: int) -> None:
        if self._runs.get(pod.key) is not run or run.token != token or run.spec is None:
            return
        key = run.answering
        run.commit_at = None
        annotation = FAILED if run.spec.fails else COMMITTED
        committed_at = rfc3339(self._timers.wall())

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            annotations = obj["metadata"].setdefault("annotations", {})
            annotations[annotation] = key
            if annotation == COMMITTED:
                annotations[LAST_CHECKPOINT] = committed_at
            return obj

        try:
            self._api.mutate("pods", pod.name, pod.namespace, fn)
        except ApiError:
            return  # the pod is gone: nothing was committed
        work = self.jobs.setdefault(run.job, JobWork())
        if run.spec.fails:
            work.failed += 1
            return
        work.committed = max(work.committed, run.resumed_from + self._timers.now() - run.since)
        work.checkpoints += 1

    def stopped(self, pod: SimPod, *, succeeded: bool) -> None:
        """The pod's containers stopped: unless they finished the job, the work since the commit is lost."""
        if self._run(pod, {}) is None:
            return
        run = self._runs.pop(pod.key)
        work = self.jobs.setdefault(run.job, JobWork())
        done = run.resumed_from + self._timers.now() - run.since
        if succeeded:
            work.committed = max(work.committed, done)
            return
        work.lost += max(0.0, done - work.committed)

    def status(self) -> dict[str, Any]:
        """Per job: committed and lost work (simulated seconds), checkpoints committed and failed."""
        return {
            job: {
                "checkpointedSeconds": round(w.committed, 3),
                "workLostSeconds": round(w.lost, 3),
                "checkpoints": w.checkpoints,
                "checkpointsFailed": w.failed,
            }
            for job, w in sorted(self.jobs.items())
        }
