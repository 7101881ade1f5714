"""A whole simulated cluster in one object: store, HTTP API, fleet and timeline.

`SimulatedCluster` is an async context manager that builds the in-process `Store`, serves it
over HTTP with the API server's `create_app` plus the simulator's own routes, writes a
kubeconfig, builds the fleet and runs its timeline:

- `GET /simulator/v1/status`: simulated time, speed, timeline progress, faults applied;
- `GET /simulator/v1/nodes/{node}/nvml?since=<seq>`: a node's fake NVML readings and XIDs;
- `GET /simulator/v1/nodes/{node}/pod-resources`: its kubelet's allocatable devices, as the
  protobuf the pod-resources API answers (`simulator.pod_resources`); `.../pod-resources/list`:
  the devices its running pods were given (the API's `List`);
- `GET /simulator/v1/nodes/{node}/dcgm-exporter/metrics`: the node's dcgm-exporter, as it writes
  its series (`simulator.dcgm_exporter`; 404 where the node's group runs none);
- `GET /simulator/v1/workloads/metrics`: the workloads' own request and error counters per pod
  (`simulator.traffic`), for Prometheus to scrape as a site scrapes its serving stack;
- `POST /simulator/v1/faults`: inject one timeline entry (JSON), validated like a file;
- `GET|PUT|DELETE /simulator/v1/api-faults`: the API faults the apiserver injects
  (`simulator.apiserver.faults`: read them and their counts, replace them, turn them off);
- `POST /simulator/v1/clock/step`: step the cluster's wall clock forward (`{"seconds": 30}`).

With a `ManualClock` the fleet does not run by itself: tests step it with `fleet.advance()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import orjson
from aiohttp import web

from gpuhealth.clock import Clock, ManualClock, SteppableClock
from gpuhealth.http import parse_listen
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.transport import KubeTransport
from simulator.apiserver.app import FAULTS, create_app
from simulator.apiserver.faults import FaultConfigError, FaultInjector, configure_from_json
from simulator.apiserver.kubeconfig import write_kubeconfig
from simulator.apiserver.store import Store
from simulator.apiserver.versions import KubernetesVersion
from simulator.dcgm_exporter import CONTENT_TYPE as DCGM_CONTENT_TYPE
from simulator.dcgm_exporter import node_exposition
from simulator.fleet import Fleet
from simulator.fleet.api_workloads import create_workloads
from simulator.fleet.extender_client import load_scheduler_config
from simulator.fleet.node_api_http import HttpNodeApi
from simulator.nvml import nvml_document
from simulator.pod_resources import CONTENT_TYPE as POD_RESOURCES_TYPE
from simulator.pod_resources import allocatable_message, list_message
from simulator.scenario import Scenario, ScenarioError, parse_fault_json, resolve
from simulator.traffic import CONTENT_TYPE, Traffic

log = logging.getLogger(__name__)

FLEET_KEY = web.AppKey("gpuhealth_sim_fleet", Fleet)
TOKEN_KEY = web.AppKey("gpuhealth_sim_fault_token", str)
TRAFFIC_KEY = web.AppKey("gpuhealth_sim_traffic", Traffic)
WORKLOAD_METRICS_PATH = "/simulator/v1/workloads/metrics"
"""Where the simulated workloads' request and error counters are scraped (`simulator.traffic`)."""


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _status_error(code: int, reason: str, message: str) -> web.Response:
    return _json(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        },
        status=code,
    )


async def _status(request: web.Request) -> web.Response:
    return _json(request.app[FLEET_KEY].status())


async def _nvml(request: web.Request) -> web.Response:
    fleet = request.app[FLEET_KEY]
    node = request.match_info["node"]
    since_text = request.query.get("since", "0")
    try:
        since = int(since_text)
    except ValueError:
        return _status_error(400, "BadRequest", f"since={since_text!r} is not an integer")
    if node not in fleet.nodes:
        return _status_error(404, "NotFound", f'nodes "{node}" not found in the simulated fleet')
    return _json(nvml_document(fleet, node, since))


async def _pod_resources(request: web.Request) -> web.Response:
    fleet = request.app[FLEET_KEY]
    node = request.match_info["node"]
    if node not in fleet.nodes:
        return _status_error(404, "NotFound", f'nodes "{node}" not found in the simulated fleet')
    answer = list_message if request.match_info.get("method") == "list" else allocatable_message
    return web.Response(body=answer(fleet, node), content_type=POD_RESOURCES_TYPE)


def dcgm_metrics_path(node: str) -> str:
    """The path of the simulated dcgm-exporter's `/metrics` on `node` (`simulator.dcgm_exporter`)."""
    return f"/simulator/v1/nodes/{node}/dcgm-exporter/metrics"


async def _dcgm_metrics(request: web.Request) -> web.Response:
    fleet = request.app[FLEET_KEY]
    node = request.match_info["node"]
    if node not in fleet.nodes:
        return _status_error(404, "NotFound", f'nodes "{node}" not found in the simulated fleet')
    text = node_exposition(fleet, node)
    if text is None:
        return _status_error(
            404, "NotFound", f"node {node} runs no dcgm-exporter (its group sets no dcgmExporter)"
        )
    return web.Response(text=text, headers={"Content-Type": DCGM_CONTENT_TYPE})


async def _workload_metrics(request: web.Request) -> web.Response:
    return web.Response(text=request.app[TRAFFIC_KEY].exposition(), headers={"Content-Type": CONTENT_TYPE})


def _authorized(request: web.Request) -> bool:
    token = request.app.get(TOKEN_KEY)
    if not token:
        return True
    given = request.headers.get("Authorization", "")
    return given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip(), token)


async def _inject(request: web.Request) -> web.Response:
    fleet = request.app[FLEET_KEY]
    if not _authorized(request):
        return _status_error(401, "Unauthorized", "Unauthorized")
    body = await request.read()
    try:
        fault = parse_fault_json(body, fleet.scenario, now=fleet.now())
    except ScenarioError as exc:
        return _status_error(400, "BadRequest", exc.message)
    fleet.inject(fault)
    return _json({"accepted": fault.to_json(), "simulatedSeconds": round(fleet.now(), 3)}, status=201)


async def _api_faults(request: web.Request) -> web.Response:
    injector = request.app[FAULTS]
    if request.method != "GET":
        if not _authorized(request):
            return _status_error(401, "Unauthorized", "Unauthorized")
        if request.method == "DELETE":
            injector.clear()
        else:
            try:
                configure_from_json(injector, await request.read())
            except FaultConfigError as exc:
                return _status_error(400, "BadRequest", str(exc))
    return _json(injector.to_json())


async def _step_clock(request: web.Request) -> web.Response:
    if not _authorized(request):
        return _status_error(401, "Unauthorized", "Unauthorized")
    clock = request.app[FLEET_KEY].clock
    if not isinstance(clock, SteppableClock):
        return _status_error(
            409, "Conflict", f"this cluster runs on a {type(clock).__name__}, which cannot be stepped"
        )
    try:
        seconds = orjson.loads(await request.read())["seconds"]
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(seconds)
        clock.step(float(seconds))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return _status_error(400, "BadRequest", f'expected {{"seconds": N}} with N > 0, got {exc!s}')
    return _json({"offsetSeconds": clock.offset})


def add_routes(app: web.Application, fleet: Fleet, *, token: str | None = None) -> None:
    """The simulator's own routes, on the API server's app (before it starts).

    With a token, injecting faults needs it (as API writes do); the read-only status, NVML and
    pod-resources routes stay open, like a node-local NVML library and kubelet socket.
    """
    app[FLEET_KEY] = fleet
    app[TRAFFIC_KEY] = Traffic(fleet)
    if token:
        app[TOKEN_KEY] = token
    app.router.add_get("/simulator/v1/status", _status)
    app.router.add_get("/simulator/v1/nodes/{node}/nvml", _nvml)
    app.router.add_get("/simulator/v1/nodes/{node}/pod-resources", _pod_resources)
    app.router.add_get("/simulator/v1/nodes/{node}/pod-resources/{method:list}", _pod_resources)
    app.router.add_get(dcgm_metrics_path("{node}"), _dcgm_metrics)
    app.router.add_get(WORKLOAD_METRICS_PATH, _workload_metrics)
    app.router.add_post("/simulator/v1/faults", _inject)
    for method in ("GET", "PUT", "DELETE"):
        app.router.add_route(method, "/simulator/v1/api-faults", _api_faults)
    app.router.add_post("/simulator/v1/clock/step", _step_clock)


async def _serve(app: web.Application, listen: tuple[str, int]) -> tuple[web.AppRunner, str]:
    """Serve `app` on `listen` (port 0: any free one); the runner and the URL it answers on."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    host, port = listen
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    if sockets:
        port = sockets[0].getsockname()[1]
    url_host = f"[{host}]" if ":" in host else host
    return runner, f"http://{url_host}:{port}"


async def _stop(fleet: Fleet, tasks: list[asyncio.Task[None]], runner: web.AppRunner | None) -> None:
    """Stop the fleet, end its tasks (emptying `tasks`) and the HTTP server."""
    fleet.stop()
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    tasks.clear()
    if runner is not None:
        await runner.cleanup()


_S = TypeVar("_S", "SimulatedCluster", "NodeAgents")


async def _entered(started: _S) -> _S:
    """`async with`'s entry: start, and stop whatever started when starting fails."""
    try:
        await started.start()
    except BaseException:
        await started.stop()
        raise
    return started


def _check_speed(speed: float) -> None:
    if not 0 < speed < float("inf"):  # also refuses NaN
        raise ValueError(f"speed must be a finite number greater than zero, not {speed!r}")


def _bound_and_running(pod: dict[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


class SimulatedCluster:
    """Store + HTTP API + fleet + timeline, started and stopped together."""

    def __init__(
        self,
        scenario: str | Path | dict[str, Any] | Scenario,
        *,
        speed: float = 1.0,
        clock: Clock | None = None,
        listen: str = "127.0.0.1:0",
        token: str | None = None,
        kubeconfig_out: str | Path | None = None,
        kubernetes_version: KubernetesVersion | None = None,
        scheduler_config: str | Path | None = None,
        remote_nodes: bool = False,
    ) -> None:
        """`remote_nodes`: serve the simulated control plane alone; the scenario's nodes are node
        agents elsewhere (`NodeAgents`, over HTTP), its workloads the API objects they create."""
        _check_speed(speed)
        self.scenario = resolve(scenario)
        self.speed = speed
        # Steppable, so a chaos run can make the cluster's clock jump (`/simulator/v1/clock/step`).
        self.clock: Clock = clock or SteppableClock()
        self._listen = parse_listen(listen)
        self._token = token
        self._kubeconfig_out = Path(kubeconfig_out) if kubeconfig_out else None
        self._tmpdir: str | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._url: str | None = None
        self._kubeconfig: Path | None = None
        self.store = Store(
            self.clock, seed=self.scenario.settings.seed, kubernetes_version=kubernetes_version
        )
        # A KubeSchedulerConfiguration's extenders (SchedulerConfigError names a bad file's field).
        extenders = load_scheduler_config(scheduler_config) if scheduler_config else ()
        # The control plane alone: no nodes, pods or faults of its own (they are the agents').
        own = self.scenario
        if remote_nodes:
            own = dataclasses.replace(own, fleet=(), workloads=(), timeline=(), nodes={})
        self.fleet = Fleet(own, self.store, self.clock, speed=speed, extenders=extenders)
        if remote_nodes:
            # A real apiserver deletes every pod bound to a node gracefully: its kubelet ends it.
            self.store.pod_runs = _bound_and_running
        self.api_faults = FaultInjector(seed=self.scenario.settings.seed)
        """The API faults the apiserver injects (none until configured)."""

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the simulated cluster is not started")
        return self._url

    @property
    def kubeconfig_path(self) -> Path:
        if self._kubeconfig is None:
            raise RuntimeError("the simulated cluster is not started")
        return self._kubeconfig

    async def start(self) -> None:
        await self.fleet.start()
        app = create_app(self.store, token=self._token, faults=self.api_faults)
        add_routes(app, self.fleet, token=self._token)
        self._runner, self._url = await _serve(app, self._listen)
        if self._kubeconfig_out is None:
            self._tmpdir = tempfile.mkdtemp(prefix="gpuhealth-sim-")
            self._kubeconfig = Path(self._tmpdir) / "kubeconfig"
        else:
            self._kubeconfig = self._kubeconfig_out
            self._kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        write_kubeconfig(self._kubeconfig, self._url, token=self._token)
        # Deletions are events, not time: followed even when a ManualClock steps the fleet.
        self._tasks.append(asyncio.create_task(self.fleet.follow_deletions(), name="gpuhealth-sim-deletions"))
        self._tasks.append(asyncio.create_task(self.fleet.scheduler.follow(), name="gpuhealth-sim-scheduler"))
        if not isinstance(self.clock, ManualClock):
            self._tasks.append(asyncio.create_task(self.fleet.run(), name="gpuhealth-sim-fleet"))

    async def stop(self) -> None:
        await _stop(self.fleet, self._tasks, self._runner)
        self._runner = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    async def __aenter__(self) -> SimulatedCluster:
        return await _entered(self)

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class NodeAgents:
    """The scenario's fleet as node agents of the control plane a kubeconfig names, over HTTP only.

    Its kubelets register the Nodes and renew their Leases, its DRA drivers publish
    ResourceSlices and the DeviceClass, its pod workers run the pods bound to its nodes; the
    scenario's workloads are created as Jobs and Deployments (`api_workloads`) for that control
    plane's controllers and scheduler to run; the timeline's faults act on the agents' GPUs.
    With `listen` it serves the simulator's own routes (status, NVML, faults) for its fleet.
    """

    def __init__(
        self,
        scenario: str | Path | dict[str, Any] | Scenario,
        kubeconfig: str | Path,
        *,
        speed: float = 1.0,
        clock: Clock | None = None,
        listen: str | None = None,
        token: str | None = None,
        create_workloads: bool = True,
    ) -> None:
        _check_speed(speed)
        self.scenario = resolve(scenario)
        self.clock: Clock = clock or SteppableClock()
        self._kubeconfig = str(kubeconfig)
        self._listen = parse_listen(listen) if listen else None
        self._token = token
        self._create_workloads = create_workloads
        self.api = HttpNodeApi(self.client)
        self.fleet = Fleet(self.scenario, None, self.clock, speed=speed, node_api=self.api)
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.url: str | None = None
        """The simulator routes' URL, when `listen` was given."""

    def client(self) -> KubeClient:
        """A new client of the control plane (one per watch: each holds its connection)."""
        return KubeClient(KubeTransport(api_client(self._kubeconfig)))

    async def start(self) -> None:
        await self.fleet.start()
        if self._create_workloads:
            client = self.client()
            try:
                create_workloads(client, self.scenario)
            finally:
                client.close()
        if self._listen is not None:
            app = web.Application()
            add_routes(app, self.fleet, token=self._token)
            self._runner, self.url = await _serve(app, self._listen)
        self._tasks.append(asyncio.create_task(self.fleet.follow_deletions(), name="gpuhealth-sim-pods"))
        if not isinstance(self.clock, ManualClock):
            self._tasks.append(asyncio.create_task(self.fleet.run(), name="gpuhealth-sim-agents"))

    async def stop(self) -> None:
        await _stop(self.fleet, self._tasks, self._runner)
        self._runner = None

    async def __aenter__(self) -> NodeAgents:
        return await _entered(self)

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
