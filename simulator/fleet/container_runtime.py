"""The node's container runtime for API pods: what a container does and how it exits.

The pod workers (`pod_runner`) own a pod's life and its status; this runs its containers: an
init container at a time before the containers (each to its end; one that fails fails the pod
under restartPolicy Never, else the pod backs off), and for each container its exit code: a
real process for the images the node runs for real (`programs`: DCGM's, gpuhealth's), a GPU
program's verdict (the CUDA sample: did every GPU it reached stay good through its run), or
the scripted code. A GPU's fate under a program (`gpu_failure`) is judged here once, for the
modelled program and for the real diagnostic's stand-in alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet import programs
from simulator.fleet.health import HEALTHY
from simulator.fleet.node_api import NodeApi
from simulator.fleet.state import SimNode
from simulator.fleet.timers import Timers
from simulator.model import APPLICATION_XIDS, Settings

Run = Any
"""A pod worker's run (`pod_runner._Run`): its spec, marks, sandbox, init progress."""


class ContainerRuntime:
    """Runs API pods' containers for every simulated node (one object, as the pod workers)."""

    def __init__(
        self,
        api: NodeApi,
        timers: Timers,
        settings: Settings,
        nodes: Mapping[str, SimNode],
        write: Callable[..., bool],
        event: Callable[..., None],
        step_at: Callable[..., None],
        *,
        current: Callable[[Run, int], bool],
        start: Callable[[Run, int], None],
        back_off: Callable[[Run, SimNode, int], None],
    ) -> None:
        """`current(run, token)`: the run is still the pod's and the step its latest; `start`:
        the pod worker's next start (the next init container, or the containers); `back_off`:
        the pod worker's restart after a failure."""
        self._api = api
        self._timers = timers
        self._settings = settings
        self._nodes = nodes
        self._write = write
        self._event = event
        self._step_at = step_at
        self._current = current
        self._start = start
        self._back_off = back_off

    def started(self, run: Run, node: SimNode, containers: tuple[dict[str, Any], ...]) -> None:
        """The containers were created and started (their images always present)."""
        for c in containers:
            image = c.get("image", "")
            pulled = f'Container image "{image}" already present on machine and can be accessed by the pod'
            self._event(run.obj, node, "Pulled", pulled, container=c["name"])
            self._event(run.obj, node, "Created", "Container created", container=c["name"])
            self._event(run.obj, node, "Started", "Container started", container=c["name"])

    def last_states(self, run: Run) -> dict[str, dict[str, Any]]:
        """Each container's state before its restart, as the pod's status last recorded it."""
        if not run.restarts:
            return {}
        try:
            obj = self._api.get("pods", run.sim.name, run.sim.namespace)
        except ApiError:
            return {}
        return {
            cs["name"]: cs.get("lastState") or {}
            for cs in (obj.get("status") or {}).get("containerStatuses") or ()
        }

    def exit_code(self, run: Run, node: SimNode, container: dict[str, Any]) -> int:
        """How the container's run ended: its process, its GPU program's verdict, or its script."""
        if programs.executed(container):
            return self._execute(run, node, container)
        if run.spec.program is not None:
            return program_code(run, node)
        return int(run.spec.exit_code)

    def start_init(self, run: Run, node: SimNode, wall: float) -> None:
        """The next init container runs (the pod stays Pending, not Initialized)."""
        index = run.init_done
        if not self._write(run.sim, init_running(run.spec, index, run.admitted, wall)):
            return
        self.started(run, node, (run.spec.init[index],))
        due = self._timers.now() + run.spec.init_seconds[index]
        self._step_at(due, self._init_exited, run, run.token)

    def _init_exited(self, run: Run, token: int) -> None:
        """An init container ended: the next one (or the containers) start, or the pod fails."""
        sim = run.sim
        if not self._current(run, token) or run.terminating:
            return
        node = self._nodes[sim.node]
        if not node.writes:
            self._step_at(
                self._timers.now() + self._settings.status_sync_interval, self._init_exited, run, token
            )
            return
        container = run.spec.init[run.init_done]
        code = self._execute(run, node, container) if programs.executed(container) else 0
        index, wall = run.init_done, self._timers.wall()
        if code != 0 and run.spec.restart_policy != "Never":
            self._back_off(run, node, code)
            return
        if not self._write(sim, init_terminated(run.spec, index, code, run.started_wall, wall)):
            return
        if code != 0:  # restartPolicy Never: the pod fails, its containers never start
            sim.terminated = True
            sim.waiting = False
            node.release(sim)
            node.last_sig = None
            self.close(run)
            return
        run.init_done += 1
        self._start(run, run.token)

    def _execute(self, run: Run, node: SimNode, container: dict[str, Any]) -> int:
        """Run the container's process for real, with the GPUs it reached as they fared."""
        if run.sandbox is None:
            run.sandbox = programs.Sandbox(run.obj.get("spec") or {})
        gpus = tuple(
            programs.Gpu(node.gpus[index].uuid, gpu_failure(run, node, index, reports, unhealthy))
            for index, reports, unhealthy in run.marks
        )
        return run.sandbox.run(container, gpus)

    def close(self, run: Run) -> None:
        """The pod is done: its folders go."""
        if run.sandbox is not None:
            run.sandbox.close()
            run.sandbox = None


def finished_state(code: int, started: str, finished: str, container_id: str) -> dict[str, Any]:
    return {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "startedAt": started,
        "finishedAt": finished,
        "containerID": container_id,
    }


def reached(run: Run) -> tuple[int, ...]:
    """The GPUs the pod's containers reach: allocated by the kubelet, or exposed by the runtime."""
    return tuple(sorted({s.gpu for s in run.sim.slots} | set(run.visible)))


def marks(run: Run, node: SimNode) -> tuple[tuple[int, int, bool], ...]:
    return tuple(
        (index, node.gpus[index].unhealthy_reports, node.gpus[index].reported != HEALTHY)
        for index in reached(run)
    )


def program_code(run: Run, node: SimNode) -> int:
    """A GPU program's verdict: 0 when every GPU it reached stayed Healthy and reachable
    through its run (judged by the device itself, not by what the kubelet last wrote); 1 when
    one failed under it (`gpu_failure`), or it reached none."""
    if not run.marks:
        return 1  # no GPU in the container: the program finds nothing to run on
    failed = any(gpu_failure(run, node, *mark) for mark in run.marks)
    return 1 if failed else 0


def gpu_failure(run: Run, node: SimNode, index: int, reports: int, unhealthy_at_start: bool) -> str | None:
    """Why a GPU program (the CUDA sample, DCGM's diagnostic) fails on the GPU since the
    container's start, worded as DCGM would; None when it would pass: lost, Unhealthy (even for
    a moment), a fatal XID, a failing DCGM health watch, a card that needs a reset."""
    gpu = node.gpus[index]
    if gpu.lost:
        return f"GPU {gpu.uuid} has fallen off the bus or is otherwise inaccessible"
    if unhealthy_at_start or gpu.reported != HEALTHY or gpu.unhealthy_reports != reports:
        return f"GPU {gpu.uuid} was reported unhealthy during the test"
    if gpu.needs_reset:
        return f"GPU {gpu.uuid} requires a reset"  # a state only a GPU reset clears
    if gpu.failed_watches:
        return f"GPU {gpu.uuid} fails DCGM health watches: {', '.join(map(str, gpu.failed_watches))}"
    for _, uuid, xid, at in node.xids:
        if uuid == gpu.uuid and xid not in APPLICATION_XIDS and at >= run.started_wall:
            return f"Detected XID {xid} on GPU {gpu.uuid}"
    return None


def _init_statuses(
    spec: Any, index: int, state: dict[str, Any], started: str, done: str
) -> list[dict[str, Any]]:
    """initContainerStatuses with init container `index` in `state`: those before it Completed
    (at `done`), those after it waiting PodInitializing."""
    out = []
    for n, c in enumerate(spec.init):
        if n < index:
            s: dict[str, Any] = {"terminated": finished_state(0, started, done, "")}
        elif n == index:
            s = state
        else:
            s = {"waiting": {"reason": "PodInitializing"}}
        out.append(
            {
                "name": c["name"], "state": s, "lastState": {}, "ready": n < index or "terminated" in s,
                "restartCount": 0, "image": c.get("image", ""), "imageID": "", "started": "running" in s,
            }
        )  # fmt: skip
    return out


def init_running(
    spec: Any, index: int, admitted: float, now: float
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    t_start, t_now = format_timestamp(admitted), format_timestamp(now)

    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        status = obj.setdefault("status", {})
        status["phase"] = "Pending"
        status["initContainerStatuses"] = _init_statuses(
            spec, index, {"running": {"startedAt": t_now}}, t_start, t_now
        )
        for cs in status.get("containerStatuses") or ():
            cs["state"] = {"waiting": {"reason": "PodInitializing"}}
        return obj

    return fn


def init_terminated(
    spec: Any, index: int, code: int, started: float, now: float
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Init container `index` exited with `code`; non-zero: the pod Failed (restartPolicy Never)."""
    t_start, t_now = format_timestamp(started), format_timestamp(now)

    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        status = obj.setdefault("status", {})
        state = {"terminated": finished_state(code, t_start, t_now, "")}
        status["initContainerStatuses"] = _init_statuses(spec, index, state, t_start, t_now)
        if code != 0:
            status["phase"] = "Failed"
            for cond in status.get("conditions") or ():
                if cond.get("type") == "Initialized":
                    cond.update(status="False", reason="PodFailed", lastTransitionTime=t_now)
        return obj

    return fn
