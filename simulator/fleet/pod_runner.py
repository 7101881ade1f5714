"""The kubelet's pod workers: every pod bound to a simulated node runs, and deleted pods stop gracefully.

Pods the scenario creates are started by the scheduler and the job controller; a pod created
through the API with `spec.nodeName` set (by a client, or bound by a scheduler) is run here,
as a kubelet runs what the API server assigns to its node:

- admission: CPU, memory and `nvidia.com/gpu` must fit what the node has left, else phase
  Failed with reason `OutOf<resource>` (`OutOfcpu`, `OutOfnvidia.com/gpu`); GPUs are allocated
  as the device manager does (any free device the plugin reports Healthy, nothing outside the
  kubelet consulted, no annotation read), except that beside a control plane the fleet does not
  own a scenario's initial pods, until its timeline starts, get the slots its layout gives them
  (`initial_layout`: the scenario's fixture, not a kubelet's behaviour); DRA devices come from
  the claims' `status.allocation`;
- the NVIDIA container runtime: a pod that gets no device from the device plugin or a claim
  reaches the GPUs its containers' `NVIDIA_VISIBLE_DEVICES` names (`visible_gpus`), as
  dcgm-exporter does; the kubelet knows nothing of it (no allocation, no
  `allocatedResourcesStatus`), so the device plugin may still hand the same GPU to another pod;
- start: status Pending (ContainerCreating), then Running with conditions, container
  statuses, IPs, QoS class and `allocatedResourcesStatus` (kept by the kubelet's status sync
  like every other pod's), with the events Pulled, Created and Started;
- a finite run (`sleep N` in the container's command or args, or the annotation
  `sim.gpuhealth.io/run-seconds`) ends with the exit code `sim.gpuhealth.io/exit-code` (default
  0): Succeeded or Failed, or a restart after a back-off (event BackOff) under `restartPolicy`
  Always / OnFailure;
- a GPU program (`GPU_PROGRAMS`: the CUDA sample `vectorAdd`) runs for its usual length unless
  told otherwise, and exits 0 when every device it reached (allocated or visible) stayed Healthy
  and reachable for its whole run, 1 otherwise (also when it reached none): the outcome follows
  the device the pod really got, whatever the pod was meant to test;
- containers of DCGM's image and of gpuhealth's run as real processes (`programs`): `dcgmi`
  answers only where the container started a `nv-hostengine`, and its diagnostic fails on a GPU
  that failed during the container's run as a GPU program's would; a DCGM program in any other
  image cannot start (StartError);
- init containers run one at a time before the containers, each to its end; one that fails
  fails the pod under restartPolicy Never (the containers never start), else it is restarted
  after a back-off;
- graceful deletion (any pod of a simulated node): event Killing, the workload exits (143, as
  SIGTERM leaves a process: the pod Failed, never Succeeded) when it has committed a requested
  checkpoint, after `sim.gpuhealth.io/stop-after` (default 0: at once; `never`: ignores
  SIGTERM) or is killed at the end of the grace period (exit 137); devices are freed and the
  pod is deleted with a grace period of 0.

Decisions (what a pod asks for, whether it fits) are pure functions in `pod_runner_spec`;
admission and the devices a pod gets are `pod_runner_admission`; the class runs the admitted pods
and stops deleted ones through the node agents' `NodeApi`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet import objects, programs
from simulator.fleet.checkpoint_agent import CheckpointAgent
from simulator.fleet.container_runtime import ContainerRuntime, finished_state, marks
from simulator.fleet.initial_layout import InitialLayout
from simulator.fleet.node_api import NodeApi, PodEntry
from simulator.fleet.pod_runner_admission import PodAdmission
from simulator.fleet.pod_runner_spec import Rejection, RunSpec, run_spec, scenario_spec
from simulator.fleet.state import DeviceDriver, PendingPod, SimNode, SimPod
from simulator.fleet.timers import Timers
from simulator.fleet.writes import PodStatusWriter, keep_others_conditions
from simulator.model import Settings

log = logging.getLogger(__name__)

START_SECONDS = 1.0
"""Simulated seconds from admission (ContainerCreating) to Running: image present, no pull."""
BACKOFF_SECONDS, BACKOFF_LIMIT = 10.0, 300.0
"""The kubelet's crash-loop back-off: 10 s, doubled per restart, at most 5 minutes."""
KILLED_EXIT_CODE = 137  # SIGKILL at the end of the grace period
TERMINATED_EXIT_CODE = 143
"""A workload that stops on SIGTERM exits as the signal's default action leaves it (128 + 15): a
Job's pod asked to stop did not complete its work, so the Job controller replaces it rather than
count a completion (docs/workloads.md)."""


# ---------------------------------------------------------------------------- the pod workers


@dataclass(slots=True)
class _Run:
    sim: SimPod
    obj: dict[str, Any]
    spec: RunSpec
    admitted: float
    """Wall time of admission (the pod's startTime)."""
    token: int = 0
    restarts: int = 0
    started_wall: float = 0.0
    terminating: bool = False
    grace: float = 0.0
    """Seconds of the grace period the kubelet is honouring (a later, shorter one replaces it)."""
    visible: tuple[int, ...] = ()
    """GPUs (indexes) the runtime exposes through `NVIDIA_VISIBLE_DEVICES`, beside any allocated."""
    marks: tuple[tuple[int, int, bool], ...] = ()
    """Per GPU the containers reach, at their last start: (index, its `unhealthy_reports`,
    whether it was Unhealthy then), what a GPU program's verdict compares against."""
    init_done: int = 0
    """Init containers that completed."""
    sandbox: programs.Sandbox | None = None
    """The pod's folders, once a container of it ran as a real process."""


class PodRunner:
    """The pod workers of every simulated kubelet (one object for all nodes, as `Kubelet`).

    Owns the API pods' `SimPod` records (adding them to `pods` and their node) and every pod's
    graceful stop; the kubelet's status sync keeps their device health as for any pod.
    """

    def __init__(
        self,
        api: NodeApi,
        settings: Settings,
        timers: Timers,
        nodes: Mapping[str, SimNode],
        pods: dict[str, SimPod],
        pending: Mapping[str, PendingPod],
        drivers: Mapping[str, DeviceDriver],
        pod_status: PodStatusWriter,
        agent: CheckpointAgent,
        allocated: Callable[[SimPod, SimNode], list[dict[str, Any]]],
        terminating: Callable[[SimPod], None],
        layout: InitialLayout | None = None,
    ) -> None:
        self._api = api
        self._settings = settings
        self._timers = timers
        self._nodes = nodes
        self._pods = pods
        self._pending = pending
        self._pod_status = pod_status
        self._agent = agent
        self._allocated = allocated
        self._terminating = terminating
        """Told when a pod gets its deletionTimestamp (controllers replace Terminating pods at once)."""
        self._runs: dict[str, _Run] = {}
        self._failing: set[str] = set()  # `fail`: each start fails its startup probe, backs off
        self._owed: dict[str, set[str]] = {}
        """Pods whose kubelet could not act (stopped, partitioned), by node: looked at again at its sync."""
        self._event_seq = itertools.count()
        self._runtime = ContainerRuntime(
            api, timers, settings, nodes, self._write, self._event, self._step_at,
            current=lambda run, token: token == run.token and self._runs.get(run.sim.key) is run,
            start=self._start, back_off=self._back_off,
        )  # fmt: skip
        self._admission = PodAdmission(api, timers, drivers, self._event, layout)

    # ------------------------------------------------------------------ what the API server asks

    def runs(self, pod_obj: dict[str, Any]) -> bool:
        """Whether a simulated kubelet runs the pod (bound to a simulated node): its DELETE is graceful."""
        return (pod_obj.get("spec") or {}).get("nodeName") in self._nodes

    def observe(self, etype: str, entry: PodEntry) -> None:
        """A pod was added or changed (the kubelet's pod watch)."""
        key = f"{entry.namespace}/{entry.name}"
        sim = self._pods.get(key)
        if sim is None:
            if key in self._pending:
                return
            fields = entry.fields or {}
            node = self._nodes.get(fields.get("spec.nodeName", ""))
            if node is None or fields.get("status.phase", "Pending") not in ("", "Pending"):
                return
            self._pod_seen(node, entry.load())
            return
        data = entry.data
        if b"deletionTimestamp" in data or b"checkpoint-requested" in data or b"readinessGates" in data:
            self._pod_changed(sim, entry.load())

    def created(self, node: SimNode, obj: dict[str, Any]) -> None:
        """A pod the node's own agents created bound to it (a DaemonSet's): run it, as one watched."""
        self._pod_seen(node, obj)

    def _pod_seen(self, node: SimNode, obj: dict[str, Any]) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if not node.writes:
            self._owed.setdefault(node.name, set()).add(key)
            return
        if obj["metadata"].get("deletionTimestamp"):
            self._remove(obj["metadata"]["namespace"], obj["metadata"]["name"])  # never started
            return
        self._admit(node, obj)

    def _pod_changed(self, sim: SimPod, obj: dict[str, Any]) -> None:
        if obj["metadata"].get("uid") not in (None, "", sim.uid) and sim.uid:
            return  # a different pod of the same name; its predecessor's DELETED is still to come
        if obj["metadata"].get("deletionTimestamp"):
            self._terminate(sim, obj)
        elif sim.ready and (obj.get("spec") or {}).get("readinessGates"):
            self._pod_status.gates_changed(sim, obj)
        self._agent.observe(sim, obj)

    def node_synced(self, node: SimNode) -> None:
        """The node's kubelet syncs (so it writes): do what it owed while it could not."""
        keys = self._owed.pop(node.name, None)
        for key in sorted(keys or ()):
            namespace, name = key.split("/", 1)
            try:
                obj = self._api.get("pods", name, namespace)
            except ApiError:
                continue
            sim = self._pods.get(key)
            if sim is None:
                if obj.get("spec", {}).get("nodeName") == node.name:
                    phase = (obj.get("status") or {}).get("phase", "Pending")
                    if phase in ("", "Pending"):
                        self._pod_seen(node, obj)
            elif obj["metadata"].get("deletionTimestamp"):
                self._terminate(sim, obj)
            else:
                run = self._runs.get(key)
                if run is not None and run.sim.waiting and not run.sim.terminated:
                    self._start(run, run.token)

    def fail(self, key: str, failing: bool) -> None:
        """The pod's containers fail their probes (restarted with back-off, never Ready) or work again."""
        (self._failing.add if failing else self._failing.discard)(key)
        run = self._runs.get(key)
        up = run is not None and not (run.sim.waiting or run.sim.terminated or run.terminating)
        if failing and run is not None and up and self._nodes[run.sim.node].writes:
            run.token += 1
            self._back_off(run, self._nodes[run.sim.node], 1)

    def resync(self, entries: list[PodEntry]) -> None:
        """After the watch fell behind: every pod looked at again."""
        for entry in entries:
            self.observe("MODIFIED", entry)

    def gone(self, sim: SimPod) -> None:
        """The pod is gone from the API (the kubelet forgot it)."""
        run = self._runs.pop(sim.key, None)
        if run is not None:
            run.token += 1
            self._runtime.close(run)
        if not sim.stopped:
            self._agent.stopped(sim, succeeded=sim.terminated)

    # ------------------------------------------------------------------ admission

    def _admit(self, node: SimNode, obj: dict[str, Any]) -> None:
        admitted = self._admission.admit(node, obj)
        if admitted is None:
            # Claims not allocated yet: the kubelet waits (ContainerCreating) and retries.
            self._owed.setdefault(node.name, set()).add(
                f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
            )
            return
        if isinstance(admitted, Rejection):
            self._admission.reject(node, obj, admitted)
            return
        sim = admitted.sim
        sim.waiting = True
        sim.ready = False
        wall = self._timers.wall()
        sim.started = wall
        run = _Run(sim, obj, admitted.spec, wall, visible=admitted.visible)
        self._runs[sim.key] = run
        self._pods[sim.key] = sim
        node.pods.append(sim)
        node.last_sig = None
        # Now, and again a status sync later if the API server refused it: an admission that
        # raised here left the pod admitted with its start never scheduled, for ever.
        self._retrying(self._admitted, run, run.token)()
        self._timers.wake()

    def _admitted(self, run: _Run, token: int) -> None:
        """The admission's write (Pending, ContainerCreating), then the start after START_SECONDS."""
        if token != run.token or self._runs.get(run.sim.key) is not run or run.terminating:
            return
        ip = objects.node_ip(self._nodes[run.sim.node].index)
        self._write(run.sim, lambda o: _creating(o, run.spec, run.admitted, ip))
        self._step_at(self._timers.now() + START_SECONDS, self._start, run, run.token)

    # ------------------------------------------------------------------ running

    def _start(self, run: _Run, token: int) -> None:
        sim = run.sim
        if token != run.token or self._runs.get(sim.key) is not run or run.terminating:
            return
        node = self._nodes[sim.node]
        if not node.writes:
            self._owed.setdefault(node.name, set()).add(sim.key)
            return
        if sim.key in self._failing:  # it starts, and fails its startup probe
            run.started_wall = self._timers.wall()
            return self._back_off(run, node, 1)
        wall = self._timers.wall()
        run.started_wall = wall
        run.marks = marks(run, node)
        if run.init_done < len(run.spec.init):
            return self._runtime.start_init(run, node, wall)
        claim_statuses = (run.obj.get("status") or {}).get("resourceClaimStatuses")
        status = objects.pod_status(
            pod_obj=run.obj,
            node_index=node.index,
            pod_index=sim.index,
            started=run.admitted,
            ready=True,
            allocated=self._allocated(sim, node),
            claim_statuses=claim_statuses,
            qos_class=run.spec.qos,
            ready_after=wall - run.admitted,
        )
        restarts, previous = run.restarts, self._runtime.last_states(run)
        for cs in status["containerStatuses"]:
            cs["restartCount"] = restarts
            cs["lastState"] = previous.get(cs["name"], {})
            cs["containerID"] = objects.container_id(run.obj, cs["name"], restarts)

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            obj["status"] = keep_others_conditions(obj, status, format_timestamp(wall))
            return obj

        if not self._write(sim, fn):
            return
        sim.waiting = False
        sim.ready = True
        node.last_sig = None
        self._runtime.started(run, node, run.spec.containers)
        self._agent.serving(sim, run.obj)
        resumed = self._agent.started(sim, run.obj["metadata"])
        if run.spec.run_seconds is not None:
            remaining = max(0.0, run.spec.run_seconds - resumed)
            self._step_at(self._timers.now() + remaining, self._exited, run, run.token)

    def _exited(self, run: _Run, token: int) -> None:
        """The containers' run ended: restart (with back-off) or finish, as restartPolicy says."""
        sim = run.sim
        if token != run.token or self._runs.get(sim.key) is not run or run.terminating:
            return
        node = self._nodes[sim.node]
        if not node.writes:
            self._step_at(self._timers.now() + self._settings.status_sync_interval, self._exited, run, token)
            return
        code = self._runtime.exit_code(run, node, run.spec.containers[0])
        self._agent.stopped(sim, succeeded=code == 0)
        policy = run.spec.restart_policy
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            self._back_off(run, node, code)
            return
        self._finish(run, node, code)

    def _back_off(self, run: _Run, node: SimNode, code: int) -> None:
        sim = run.sim
        delay = min(BACKOFF_LIMIT, BACKOFF_SECONDS * 2**run.restarts)
        pod_ref = f"{sim.name}_{sim.namespace}({sim.uid})"
        if not self._write(sim, _crash_loop(code, run.started_wall, self._timers.wall(), delay, pod_ref)):
            return
        sim.waiting = True
        sim.ready = False
        run.restarts += 1
        for c in run.spec.containers:
            message = f"Back-off restarting failed container {c['name']} in pod {pod_ref}"
            self._event(run.obj, node, "BackOff", message, warning=True, container=c["name"])
        self._step_at(self._timers.now() + delay, self._start, run, run.token)

    def _finish(self, run: _Run, node: SimNode, code: int) -> None:
        """The containers exited and stay down: Succeeded or Failed, devices freed."""
        sim = run.sim
        if self._write(sim, _terminated(code, run.started_wall, self._timers.wall(), deleted=False)):
            sim.terminated = True
            sim.waiting = False
            node.release(sim)
            node.last_sig = None
            self._runtime.close(run)

    # ------------------------------------------------------------------ graceful termination

    def _terminate(self, sim: SimPod, obj: dict[str, Any]) -> None:
        """The pod got a deletionTimestamp: stop its containers within the grace period."""
        node = self._nodes.get(sim.node)
        if node is None or sim.stopped:
            return
        self._terminating(sim)  # the controllers see it whether or not the kubelet can act
        if not node.writes:
            self._owed.setdefault(node.name, set()).add(sim.key)
            return
        if sim.terminated:
            self._remove(sim.namespace, sim.name)  # nothing runs: the kubelet deletes it at once
            return
        run = self._runs.get(sim.key)
        if run is None:  # a scenario pod: it runs its workload's containers
            spec = run_spec(obj) if sim.api else scenario_spec(run_spec(obj))
            run = _Run(sim, obj, spec, sim.started, started_wall=sim.started)
            self._runs[sim.key] = run
        now = self._timers.now()
        grace = float(obj["metadata"].get("deletionGracePeriodSeconds") or 0)
        if run.terminating:
            # Any later change of the pod comes here too; only a shorter grace period matters.
            if grace < run.grace:
                run.grace = grace
                self._step_at(now + grace, self._kill, run, run.token, KILLED_EXIT_CODE)
                self._timers.wake()
            return
        run.terminating = True
        run.grace = grace
        run.token += 1
        for c in run.spec.containers:
            self._event(obj, node, "Killing", f"Stopping container {c['name']}", container=c["name"])
        if sim.waiting:
            self._kill(run, run.token, 0 if run.restarts == 0 else run.spec.exit_code)
            return
        deadline = now + grace
        commit = self._agent.commit_time(sim)
        if commit is not None:
            exit_at = commit
        elif run.spec.stop_after is not None:
            exit_at = now + run.spec.stop_after
        else:
            exit_at = deadline
        code = TERMINATED_EXIT_CODE if exit_at < deadline else KILLED_EXIT_CODE
        exit_at = min(exit_at, deadline)
        if exit_at <= now:
            self._kill(run, run.token, code)
        else:
            self._step_at(exit_at, self._kill, run, run.token, code)
            self._timers.wake()

    def _kill(self, run: _Run, token: int, code: int) -> None:
        sim = run.sim
        if token != run.token or self._runs.get(sim.key) is not run or sim.stopped:
            return
        node = self._nodes[sim.node]
        if not node.writes:
            self._owed.setdefault(node.name, set()).add(sim.key)
            return
        # Deleted before it finished: whatever it did since its last checkpoint is lost.
        self._agent.stopped(sim, succeeded=False)
        self._write(
            sim, _terminated(code, run.started_wall or sim.started, self._timers.wall(), deleted=True)
        )
        sim.stopped = True
        node.release(sim)
        node.last_sig = None
        self._runtime.close(run)
        self._remove(sim.namespace, sim.name)

    def _remove(self, namespace: str, name: str) -> None:
        """The kubelet's final delete once the containers are gone (finalizers may still hold the pod)."""
        with contextlib.suppress(ApiError):
            self._api.delete("pods", name, namespace, grace_period_seconds=0)

    # ------------------------------------------------------------------ writes

    def _step_at(self, when: float, step: Callable[..., None], *args: Any) -> None:
        """Run a pod worker's `step(*args)` at simulated `when`, retried (`_retrying`)."""
        self._timers.at(when, self._retrying(step, *args))

    def _retrying(self, step: Callable[..., None], *args: Any) -> Callable[[], None]:
        """`step(*args)` such that a write the API server could not take (5xx, 429, unreachable:
        an apiserver restarting) runs it again a status sync later, as a real kubelet's pod worker
        syncs the pod again after an error; dropping it would leave the pod in ContainerCreating
        (or Running) for ever."""

        def attempt() -> None:
            try:
                step(*args)
            except ApiError as exc:
                if exc.code < 500 and exc.code != 429:
                    raise
                log.info("pod worker %s: %s; again in a status sync", getattr(step, "__name__", step), exc)
                self._timers.at(self._timers.now() + self._settings.status_sync_interval, attempt)

        attempt.__name__ = getattr(step, "__name__", "step")
        return attempt

    def _write(self, sim: SimPod, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
        return self._pod_status.mutate(sim, fn)

    def _event(
        self,
        obj: dict[str, Any],
        node: SimNode,
        reason: str,
        message: str,
        *,
        warning: bool = False,
        container: str | None = None,
    ) -> None:
        event = objects.event(
            pod_obj=obj, node_name=node.name, reason=reason, message=message, wall=self._timers.wall(),
            seq=next(self._event_seq), warning=warning, container=container,
        )  # fmt: skip
        # Events are best effort for a real kubelet too (a full or refusing API drops them).
        with contextlib.suppress(ApiError):
            self._api.create("events", event)


def _not_ready(ctype: str, ts: str, containers: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    names = ", ".join(c["name"] for c in containers)
    return {
        "type": ctype,
        "status": "False",
        "reason": "ContainersNotReady",
        "message": f"containers with unready status: [{names}]",
        "lastTransitionTime": ts,
    }


def _creating(obj: dict[str, Any], spec: RunSpec, admitted: float, host: str) -> dict[str, Any]:
    """The pod admitted on the node at `host`, its containers being created (phase Pending)."""
    ts = format_timestamp(admitted)
    has_init = bool((obj.get("spec") or {}).get("initContainers"))
    conditions = [
        {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": ts},
        {"type": "Initialized", "status": "False" if has_init else "True", "lastTransitionTime": ts},
        _not_ready("Ready", ts, spec.containers),
        _not_ready("ContainersReady", ts, spec.containers),
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts},
    ]
    obj["status"] = {
        **(obj.get("status") or {}),
        "phase": "Pending",
        "conditions": conditions,
        "hostIP": host,
        "hostIPs": [{"ip": host}],
        "startTime": ts,
        "qosClass": spec.qos,
        "containerStatuses": [
            {
                "name": c["name"],
                "state": {"waiting": {"reason": "ContainerCreating"}},
                "lastState": {},
                "ready": False,
                "restartCount": 0,
                "image": c.get("image", ""),
                "imageID": "",
                "started": False,
            }
            for c in spec.containers
        ],
    }
    return obj


def _crash_loop(
    code: int, started: float, now: float, delay: float, pod_ref: str
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Every container exited with `code` and waits `delay` seconds in CrashLoopBackOff; not Ready."""
    t_start, t_now = format_timestamp(started), format_timestamp(now)

    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        status = obj["status"]
        for cond in status.get("conditions", []):
            if cond.get("type") in ("Ready", "ContainersReady") and cond.get("status") != "False":
                cond.update(status="False", reason="ContainersNotReady", lastTransitionTime=t_now)
        for cs in status.get("containerStatuses", []):
            message = f"back-off {delay:g}s restarting failed container={cs['name']} pod={pod_ref}"
            cs["lastState"] = {"terminated": finished_state(code, t_start, t_now, cs.get("containerID", ""))}
            cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
            cs["ready"] = False
            cs["started"] = False
        return obj

    return fn


def _terminated(
    code: int, started: float, finished: float, *, deleted: bool
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Every container terminated with `code`; the pod Succeeded (all 0) or Failed."""
    t_start, t_end = format_timestamp(started), format_timestamp(finished)
    phase = "Succeeded" if code == 0 else "Failed"

    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        status = obj.setdefault("status", {})
        status["phase"] = phase
        reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        for cond in status.get("conditions", []):
            if cond.get("type") in ("Ready", "ContainersReady") and cond.get("status") != "False":
                cond.update(status="False", reason=reason, lastTransitionTime=t_end)
        for cs in status.get("containerStatuses", []):
            running = (cs.get("state") or {}).get("running") or {}
            cs["state"] = {
                "terminated": finished_state(
                    code, running.get("startedAt") or t_start, t_end, cs.get("containerID", "")
                )
            }
            cs["ready"] = False
            cs["started"] = False
        if deleted and code == KILLED_EXIT_CODE:
            for cs in status.get("containerStatuses", []):
                cs["state"]["terminated"]["reason"] = "Error"
        return obj

    return fn
