"""Run the whole closed loop on loopback and journal everything it does.

the cluster (`demo.clusters`: the simulated one in-process, or a real control plane built from
upstream with the scenario's nodes as its node agents) -> exporters (one per node, node mode,
NVML from the simulator; or one cluster-mode exporter for large fleets) -> real Prometheus
evaluating the shipped rules -> real Alertmanager with the shipped routing (one, or an HA pair
gossiping on loopback, both delivering) -> the responders' webhook front (`demo.front`, one URL
for the replicas, like a Service; the real kube-scheduler calls their extender through it too)
-> two `gpuhealth responder` replicas, enforcing, as child processes -> back into the cluster
(records, DeviceTaintRules, node annotations, evictions, probe and canary Jobs). On-call and
tenant receivers are recorded on loopback.

Time: the rules are the shipped ones with every duration divided by the speed
(`rules.render.scaled`), and so is the responders' configuration (`demo.staging`), so a
5-minute tolerance means 5 simulated minutes everywhere. The scenario's timeline is shifted by
a lead-in so the pipeline sees a healthy fleet before the first fault; the journal's times are
scenario seconds (negative during the lead-in).

Observation (`demo.observer` turns it into journal entries):
- the simulator's fleet events (faults applied, device health), stamped with their own
  simulated time;
- watches of the cluster's objects (records, rules, nodes, Jobs, Events, pods, the leader
  Lease, the breaker's ConfigMap) and its evictions, stamped with the fleet's time as they are
  seen (`demo.clusters` says how, per cluster);
- Prometheus' alerts, read every `poll_interval_seconds` (the journal's resolution);
- every webhook request the front receives and every delivery the recorder receives, stamped
  from their arrival time.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from demo import clusters, expectations, web_config
from demo import staging as staging_module
from demo.clusters import Observations, Target
from demo.front import Forward, Hook, Reply, Request, WebhookFront, forward_once
from demo.gate import HealthSourceGate
from demo.journal import Device, Entry, Journal, Kind, Recovery, sorted_entries
from demo.observer import Observer
from demo.progress import narrate, worth_a_line
from demo.report import recoveries, recovery_queries
from demo.safety import NodeEscalation, UnhealthyFlapping, UnknownBackoff, Verdict, judge
from demo.staging import Kill, ReleaseAsk, Staging, StagingError
from exporter.settings import NvmlSettings
from gpuhealth import fields
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.meta import rfc3339
from gpuhealth.kube.resources import NAMESPACE, Resource
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import (
    ALERTMANAGER_BINARY,
    LoopbackError,
    Prometheus,
    ScrapeJob,
    WebhookRecorder,
    free_port,
    http_ok,
    log_tail,
    require_binary,
    run_prometheus,
    wait_until,
)
from responder.records import QUARANTINES
from rules.render import Duration, render, unknown_tolerance_cap, write_files
from rules.render import Settings as RuleSettings
from simulator.dcgm_exporter import JOB as DCGM_JOB
from simulator.fleet.mig import partition_uuids
from simulator.fleet.objects import gpu_uuid
from simulator.model import DEVICE_PLUGIN, DRA_DRIVER, NVIDIA_DRIVER
from simulator.runner import WORKLOAD_METRICS_PATH, dcgm_metrics_path
from simulator.scenario import Scenario
from simulator.traffic import JOB as WORKLOADS_JOB

ROOT = Path(__file__).resolve().parents[1]
RESPONDER_CONFIG = ROOT / "deploy" / "responder-config.yaml"
CRD_FILE = ROOT / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
HOLDER_PRIORITY_FILE = ROOT / "deploy" / "base" / "holder-priorityclass.yaml"
PRIORITY_CLASS = Resource("scheduling.k8s.io", "v1", "priorityclasses", namespaced=False)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
RESPONDER_NAMESPACE = "gpuhealth-system"
RESPONDER_PATH = "/webhook"
TOKEN = "demo-responder-token"
CONTROL_PLANES = ("simulated", "real")
KUBERNETES_VERSIONS = ("1.37", "1.36")
EVALUATION_WALL_SECONDS = 1
"""Every rule group's evaluation interval here, whatever the speed: the scaled minute (3 s at
20x) would add whole evaluations of delay between the recording rules and the alerts on them."""


@dataclass(frozen=True)
class DemoSettings:
    """How a demo run is paced and shaped; each field checked when built."""

    speed: float = 20.0
    """Simulated seconds per wall second, for the cluster, the rules and the responders alike."""
    lead_in_seconds: float = 8.0
    """Wall seconds of a healthy fleet before the first fault (exporters start, Prometheus scrapes)."""
    settle_seconds: float | None = None
    """Simulated seconds to keep running after the last fault; None: the scenario's `demo.settle`."""
    node_exporters_max: int = 16
    """Up to this many nodes, one node-mode exporter per node (with NVML); beyond, one cluster-mode."""
    web_config: bool = False
    """Exporters and responders behind TLS and basic auth (`--web.config.file`), scraped and
    called so (`demo.web_config`)."""
    poll_interval_seconds: float = 0.2
    """Wall seconds between two reads of Prometheus' alerts (the alerts' journal resolution)."""
    control_plane: str = "simulated"
    """`simulated` (the in-process apiserver, fast) or `real` (etcd and the Kubernetes servers built
    from upstream, the fleet as their node agents; `demo.clusters`)."""
    kubernetes_version: str = "1.37"
    """With the real control plane: which pinned build runs (1.37, 1.36)."""

    def __post_init__(self) -> None:
        # Zero speed would never reach the end; NaN would make every deadline meaningless.
        fields.positive(self, "speed", "simulated seconds per wall second")
        fields.within(self, "lead_in_seconds", "wall seconds", 0.0)
        if self.settle_seconds is not None:
            fields.within(self, "settle_seconds", "simulated seconds", 0.0)
        fields.within(self, "node_exporters_max", "nodes", 0, whole=True)
        fields.positive(self, "poll_interval_seconds", "wall seconds")  # zero would spin the watch loop
        fields.one_of(self, "control_plane", CONTROL_PLANES)
        fields.one_of(self, "kubernetes_version", KUBERNETES_VERSIONS)


@dataclass
class Controls:
    """Seams for fault injection (the chaos command) and tests; every field optional.

    - `front_hook`: decides what the responders' webhook front forwards (`demo.front.Hook`):
      duplicate a delivery by forwarding it twice, reorder by forwarding an earlier one again.
    - `kills`: process kills in addition to the scenario's `demo.kills` (same meaning).
    - `on_started(run)`: called once every part is up, before the first fault, with the
      `Running` pipeline (its cluster handle for API faults, its processes, its journal).
    - `on_tick(run)`: called on every pass of the observation loop (about every
      `poll_interval_seconds`), from the pipeline's thread.
    """

    front_hook: Hook = forward_once
    kills: Sequence[Kill] = ()
    on_started: Callable[[Running], None] | None = None
    on_tick: Callable[[Running], None] | None = None


@dataclass
class Outcome:
    journal: Journal
    verdict: Verdict
    expectation_failures: list[str]
    workdir: Path
    journal_path: Path
    extender_replies: dict[int, int] = field(default_factory=dict)
    """HTTP status -> how many of the scheduler extender's calls the responders answered so (only the
    real kube-scheduler calls it in a run, through the front; 503 before any replica is up)."""


class Process:
    """A child process the pipeline may kill and start again (same argv, same port)."""

    def __init__(self, name: str, argv: list[str], log: Path, ready_url: str | None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.ready_url = ready_url
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        self.starts += 1

    def wait_ready(self, timeout: float = 60.0) -> None:
        url = self.ready_url
        if url is None:
            return

        def ready() -> bool:
            if not self.alive:
                code = self.proc.returncode if self.proc else None
                raise LoopbackError(f"{self.name} exited with {code}:\n{log_tail(self.log)}")
            return http_ok(url)

        wait_until(f"{self.name} to be ready", ready, timeout=timeout)

    def kill(self) -> None:
        """SIGKILL, like a node dying: no clean shutdown, no Lease released."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Running:
    """The pipeline while it runs: what `Controls` callbacks get."""

    cluster: Target
    prometheus: Prometheus
    front: WebhookFront
    processes: dict[str, Process]
    journal: Journal
    observer: Observer
    offset: float
    """The fleet's time at the scenario's zero (scenario time = the fleet's time minus this)."""
    workdir: Path
    restarts: list[tuple[float, str]] = field(default_factory=list)
    """(scenario seconds, process name) of restarts still due."""

    def now(self) -> float:
        """Scenario seconds now."""
        return self.cluster.now() - self.offset

    def kill(self, process: str, restart: float | None = None) -> str:
        """Kill `process` (a name, or responder-leader|responder-follower|exporter|alertmanager
        as in the `demo:` section) now; start it again `restart` scenario seconds later.
        Returns the name of the process killed ('' when none matched)."""
        name = self.resolve(process)
        target = self.processes.get(name)
        if target is None or not target.alive:
            self.observer.journal.record(self.now(), Kind.NOTE, "kill skipped", process=process, name=name)
            return ""
        role = ""
        if name.startswith("responder-"):
            role = "leader" if name == self.observer.leader else "follower"
        target.kill()
        self.observer.process(self.now(), "killed", name, role)
        if restart is not None:
            self.restarts.append((self.now() + restart, name))
        return name

    def resolve(self, process: str) -> str:
        responders = sorted(n for n in self.processes if n.startswith("responder-"))
        if process == "responder-leader":
            return self.observer.leader if self.observer.leader in self.processes else ""
        if process == "responder-follower":
            alive = [n for n in responders if n != self.observer.leader and self.processes[n].alive]
            return alive[0] if alive else ""
        if process == "exporter":
            exporters = sorted(n for n in self.processes if n.startswith("exporter-"))
            return exporters[0] if exporters else ""
        if process == "alertmanager":
            managers = sorted(n for n in self.processes if n.startswith("alertmanager-"))
            return managers[-1] if managers else ""
        return process

    def start_again(self, name: str) -> None:
        process = self.processes[name]
        process.start()
        self.observer.process(self.now(), "started", name)


def timeline_end(scenario: Scenario) -> float:
    """Simulated second at which the last fault of the timeline has played out."""
    ends = [f.at + (f.duration or 0.0) + (f.times or 0) * (f.period or 0.0) for f in scenario.timeline]
    return max(ends, default=0.0)


def shifted(scenario: Scenario, seconds: float) -> Scenario:
    timeline = tuple(dataclasses.replace(f, at=f.at + seconds) for f in scenario.timeline)
    return dataclasses.replace(scenario, timeline=timeline)


def expected_wall_seconds(scenario: Scenario, settings: DemoSettings, stage: Staging) -> float:
    """About how long a run takes in wall seconds: set-up, lead-in, the timeline and the settle."""
    settle = settings.settle_seconds if settings.settle_seconds is not None else stage.settle
    set_up = 15.0 + 2.0 * stage.responders
    last = max(timeline_end(scenario), stage.last_action)
    return set_up + settings.lead_in_seconds + (last + settle) / settings.speed


def responder_document(
    scenario: Scenario, speed: float, *, defaults: Path = RESPONDER_CONFIG
) -> dict[str, Any]:
    """The responders' `--config` for this run: the shipped defaults, the scenario's `responder:`
    overrides, scaled to `speed`; checked with the responder's own loader (StagingError naming
    the field when the overrides are not valid)."""
    from responder.config import ConfigError, apply
    from responder.settings import ResponderSettings

    base = yaml.safe_load(defaults.read_text())
    doc = staging_module.merged(base, scenario.responder)
    probe = ResponderSettings(token="-", identity="-", prometheus_url="http://127.0.0.1")
    try:
        apply(doc, probe, "responder")
    except ConfigError as exc:
        raise StagingError(str(exc).replace("responder: ", "responder.", 1)) from None
    scaled = staging_module.scaled_document(doc, speed)
    try:
        apply(scaled, probe, f"responder (at {speed:g}x)")
    except ConfigError as exc:
        raise StagingError(str(exc)) from None
    return scaled


def devices_of(scenario: Scenario) -> dict[str, Device]:
    return {
        gpu_uuid(node, i): Device(
            gpu_uuid(node, i), node, i, group.path, partition_uuids(gpu_uuid(node, i), group.mig)
        )
        for node, group in scenario.nodes.items()
        for i in range(group.gpus_per_node)
    }


def run_demo(
    scenario: Scenario,
    rules: RuleSettings,
    settings: DemoSettings,
    workdir: Path,
    out: TextIO,
    *,
    controls: Controls | None = None,
    on_entry: Callable[[Entry], None] | None = None,
) -> Outcome:
    """Run `scenario` through the whole loop; journal it; judge it.

    `rules` must already be scaled to `settings.speed`. `out` gets plain narration lines unless
    `on_entry` is given (called with each journal entry as it is recorded, from this thread:
    the live progress view). `controls` carries the fault-injection seams (`Controls`).
    Writes `journal.json`, the rendered configs and every process's log into `workdir`.
    Raises StagingError for a bad `demo:` or `responder:` section, ExpectationError for a bad
    `expect:` section (both before anything starts), LoopbackError when a part cannot start or
    dies. `Outcome.expectation_failures` lists the expectations the run did not meet.
    """
    controls = controls or Controls()
    stage = staging_module.staging(scenario.demo)
    expectations.parse(scenario.expect, scenario.source, nodes=scenario.nodes)
    document = responder_document(scenario, settings.speed)
    settle = settings.settle_seconds if settings.settle_seconds is not None else stage.settle
    lead_in = settings.lead_in_seconds * settings.speed
    kills = sorted([*stage.kills, *controls.kills], key=lambda k: k.at)
    last_kill = max((k.at + (k.restart or 0.0) for k in kills), default=0.0)
    end = max(timeline_end(scenario), last_kill, stage.last_action) + settle
    asks = [(ask, _device_asked(scenario, ask)) for ask in stage.release_requests]
    journal = Journal(
        scenario=scenario.name,
        description=scenario.description,
        speed=settings.speed,
        devices=devices_of(scenario),
        floor_seconds=_floor(rules, settings.speed),
        resolution_seconds=settings.poll_interval_seconds * settings.speed,
    )
    observer = Observer(journal)
    tell = on_entry or _plain_lines(out, journal)
    shown = 0

    def show_new() -> None:
        nonlocal shown
        for entry in journal.entries[shown:]:
            tell(entry)
        shown = len(journal.entries)

    config_path = workdir / "responder-config.yaml"
    config_path.write_text(yaml.safe_dump(document, sort_keys=False))
    token_file = workdir / "responder-token"
    token_file.write_text(TOKEN)
    seen = Observations()
    front_requests: queue.SimpleQueue[Request] = queue.SimpleQueue()

    with ExitStack() as stack:
        # A run that fails half-way still leaves what it saw, for whoever debugs it.
        stack.callback(lambda: None if journal.ended_at else _write_journal(journal, workdir))
        recorder = stack.enter_context(WebhookRecorder())
        extender_replies: Counter[int] = Counter()

        def hook(request: Request, forward: Forward) -> Reply:
            # The scheduler's extender calls go to a replica as they are: the fault-injection
            # hook is for Alertmanager's deliveries.
            if request.path == RESPONDER_PATH:
                return controls.front_hook(request, forward)
            reply = forward(request)
            extender_replies[reply[0]] += 1
            return reply

        front = stack.enter_context(WebhookFront(hook=hook, observe=front_requests.put))
        rule_files, alertmanager_config = _render_rules(rules, recorder, front, token_file, workdir)
        processes: dict[str, Process] = {}

        def stop_all() -> None:
            for process in processes.values():
                process.stop()

        stack.callback(stop_all)
        out.write(f"starting {stage.alertmanagers} Alertmanager(s) ...\n")
        for process in _alertmanagers(stage.alertmanagers, alertmanager_config, workdir):
            processes[process.name] = process
            process.start()
        for name in [n for n in processes if n.startswith("alertmanager-")]:
            processes[name].wait_ready()
        node_mode = (
            stage.exporter == "node"
            if stage.exporter is not None
            else len(scenario.nodes) <= settings.node_exporters_max
        )
        exporter_ports = {node: free_port() for node in scenario.nodes} if node_mode else {"": free_port()}
        responder_ports = [free_port() for _ in range(stage.responders)]
        web = web_config.write(workdir / "web") if settings.web_config else None
        scheme = "https" if web is not None else "http"
        secured = web.scrape_fields() if web is not None else {}
        # The cluster first: its node agents serve the workloads' own counters, a scrape job.
        target: Target = stack.enter_context(_target(scenario, settings, workdir, front))
        out.write(f"{target.description} up\n")
        out.flush()
        jobs = [
            *(
                ScrapeJob(
                    "gpuhealth-exporter",
                    [f"127.0.0.1:{port}"],
                    {"node": node} if node else {},
                    fields=secured,
                )
                for node, port in exporter_ports.items()
            ),
            ScrapeJob(
                "gpuhealth-responder", [f"127.0.0.1:{port}" for port in responder_ports], fields=secured
            ),
            ScrapeJob(
                WORKLOADS_JOB,
                [target.nvml_url.removeprefix("http://")],
                metrics_path=WORKLOAD_METRICS_PATH,
            ),
            # One dcgm-exporter per node whose group runs one, scraped as a site scrapes it: no
            # `node` target label, so the rules must find the node in its hostname label.
            *(
                ScrapeJob(
                    DCGM_JOB,
                    [target.nvml_url.removeprefix("http://")],
                    {"__metrics_path__": dcgm_metrics_path(node)},
                )
                for node, group in scenario.nodes.items()
                if group.dcgm_host_label is not None
            ),
        ]
        out.write("starting Prometheus with the shipped rules (durations divided by the speed) ...\n")
        prometheus_started = time.time()
        prometheus = stack.enter_context(
            run_prometheus(
                workdir / "prometheus",
                jobs,
                rule_files=rule_files,
                alertmanager_url=[
                    p.ready_url.removesuffix("/-/ready")
                    for n, p in processes.items()
                    if n.startswith("alertmanager-") and p.ready_url
                ],
            )
        )
        # The responders read health through a gate only when the scenario cuts it.
        gate = (
            stack.enter_context(HealthSourceGate(prometheus.base_url)) if stage.health_source_down else None
        )
        health_url = gate.url if gate is not None else prometheus.base_url
        _install_responder_api(target.kubeconfig_path)
        target.observe(seen)
        mode = (
            f"{len(exporter_ports)} node-mode exporters (NVML from the simulator)"
            if node_mode
            else "1 cluster-mode exporter"
        )
        out.write(f"starting {mode} and {stage.responders} responder replicas (enforcing) ...\n")
        out.flush()
        for node, port in exporter_ports.items():
            device_plugin = bool(node) and scenario.nodes[node].path == DEVICE_PLUGIN
            process = _exporter(
                target,
                node,
                port,
                workdir,
                settings.speed,
                device_plugin=device_plugin,
                slice_health=scenario.dra_driver() == NVIDIA_DRIVER,
                web=web,
            )
            processes[process.name] = process
            process.start()
        responder_urls = []
        for i, port in enumerate(responder_ports):
            name = f"responder-{i}"
            argv = [
                sys.executable, "-m", "gpuhealth", "--log-level", "INFO", "responder",
                "--kubeconfig", str(target.kubeconfig_path), "--listen", f"127.0.0.1:{port}",
                "--token-file", str(token_file), "--prometheus-url", health_url,
                "--config", str(config_path), "--identity", name,
                *(web.argv() if web is not None else ()),
            ]  # fmt: skip
            processes[name] = Process(
                name, argv, workdir / f"{name}.log", f"{scheme}://127.0.0.1:{port}/readyz"
            )
            processes[name].start()
            responder_urls.append(f"{scheme}://127.0.0.1:{port}")
        front.set_backends(responder_urls, context=web.client_context() if web is not None else None)
        for process in processes.values():
            process.wait_ready()
        offset = target.now() + lead_in
        target.inject(shifted(scenario, offset).timeline)
        running = Running(target, prometheus, front, processes, journal, observer, offset, workdir)
        for name in processes:
            observer.process(running.now(), "started", name)
        out.write(
            f"pipeline up: API {target.url}, Prometheus {prometheus.base_url}, "
            f"responders behind {front.url}{RESPONDER_PATH}\n"
        )
        out.flush()
        if controls.on_started is not None:
            controls.on_started(running)
        seen_deliveries = 0
        due_kills = list(kills)
        due_asks = list(asks)
        outages = list(stage.health_source_down)
        asking: list[tuple[subprocess.Popen[bytes], ReleaseAsk, str, str]] = []
        while True:
            mono, now = time.monotonic(), running.now()
            while not seen.fleet_events.empty():
                event = seen.fleet_events.get()
                observer.fleet_event(event, event.time - offset)
            while not seen.changes.empty():
                at, resource, etype, obj, devices = seen.changes.get()
                observer.change(at - offset, resource, etype, obj, devices)
            while not seen.evictions.empty():
                at, pod, node, uuids, job = seen.evictions.get()
                observer.evicted(at - offset, pod, node, uuids, job)
            while not front_requests.empty():
                request = front_requests.get()
                if request.path != RESPONDER_PATH:
                    continue  # the scheduler's extender calls, not deliveries
                try:
                    body = json.loads(request.body or b"{}")
                except ValueError:
                    body = None
                observer.delivery(_stamp(request.received_at, mono, now, settings.speed), "responder", body)
            deliveries = recorder.deliveries()
            for delivery in deliveries[seen_deliveries:]:
                at = _stamp(delivery.received_at, mono, now, settings.speed)
                observer.delivery(at, delivery.path.strip("/") or "?", delivery.body)
            seen_deliveries = len(deliveries)
            try:
                observer.alerts(now, prometheus.alerts("firing"))
            except LoopbackError as exc:
                journal.record(now, Kind.NOTE, "Prometheus did not answer", message=str(exc)[:200])
            while due_kills and due_kills[0].at <= now:
                kill = due_kills.pop(0)
                running.kill(kill.process, kill.restart)
            for due in [r for r in running.restarts if r[0] <= now]:
                running.restarts.remove(due)
                running.start_again(due[1])
            if gate is not None:
                down = any(o.at <= now < o.end for o in outages)
                if down == gate.is_open:
                    (gate.close if down else gate.open)()
                    journal.record(now, Kind.HEALTH_SOURCE, "down" if down else "up")
            while due_asks and due_asks[0][0].at <= now:
                ask, device = due_asks.pop(0)
                started = _ask_release(ask, device, observer, target.kubeconfig_path, now)
                if started is not None:
                    asking.append(started)
            for proc, ask, name, device in [a for a in asking if a[0].poll() is not None]:
                asking.remove((proc, ask, name, device))
                said = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
                if proc.returncode != 0:
                    observer.refused_by_command(
                        now,
                        name,
                        device,
                        f"person/{ask.actor}",
                        said.splitlines()[-1:][0] if said else f"exit {proc.returncode}",
                    )
            for name, process in processes.items():
                if process.proc is not None and process.proc.poll() not in (None, -signal.SIGKILL):
                    raise LoopbackError(
                        f"{name} exited with {process.proc.returncode}:\n{log_tail(process.log)}"
                    )
            target.check()
            if controls.on_tick is not None:
                controls.on_tick(running)
            show_new()
            if now >= end:
                break
            time.sleep(settings.poll_interval_seconds)
        journal.ended_at = running.now()
        ran = time.time() - prometheus_started
        journal.recoveries = _recoveries(prometheus, ran, settings.speed, journal)
        records = target.records()
        (workdir / "records.json").write_text(json.dumps(records, indent=1))
        for name, process in processes.items():
            if process.alive:
                process.stop()
                observer.process(running.now(), "exited", name)
        show_new()

    journal_path = _write_journal(journal, workdir)
    verdict = judge(
        journal,
        scenario,
        fatal_xids=rules.device.fatal_xids,
        health_watches=rules.dcgm.health_watches,
        tolerance=rules.device.unknown_tolerance.seconds * settings.speed,
        unhealthy_for=rules.device.unhealthy_for.seconds * settings.speed,
        grace=journal.floor_seconds + 20.0 * settings.speed,
        backoff=UnknownBackoff(
            factor=rules.device.unknown_tolerance_factor,
            floor=rules.device.unknown_tolerance_floor.seconds * settings.speed,
            repeat_window=rules.device.unknown_repeat_window.seconds * settings.speed,
            cap=unknown_tolerance_cap(rules.device).seconds * settings.speed,
            unit=settings.speed,
        ),
        flapping=UnhealthyFlapping(
            episodes=rules.device.unhealthy_flapping_episodes,
            window=rules.device.unhealthy_flapping_window.seconds * settings.speed,
            seen_from=EVALUATION_WALL_SECONDS * settings.speed,
        ),
        move_deadline=move_deadline_seconds(document, settings.speed) + journal.resolution_seconds,
        reaction=REACTION_WALL_SECONDS * settings.speed + journal.resolution_seconds,
        pass_seconds=PASS_WALL_SECONDS * settings.speed + journal.resolution_seconds,
        escalation=escalation_rule(document, settings.speed),
    )
    return Outcome(
        journal, verdict, expectations.check(scenario, journal), workdir, journal_path, dict(extender_replies)
    )


REACTION_WALL_SECONDS = 60.0
"""How long the responders may take to enforce a quarantine delivered to them, wall seconds (the
verdict's `reaction`): two of the reconciler's longest rechecks (`max_recheck_seconds`, 30 s,
which the demo does not scale), so an apiserver restart under chaos (about 20 s of real time)
or a retried write does not count as a lost quarantine."""
PASS_WALL_SECONDS = 5.0
"""How long a reconcile pass begun before the health source went down may still step, wall
seconds (the reconciler's recheck while checks or moves are in flight)."""
TERMINATION_SECONDS = 30.0
"""A moved pod's grace period once evicted (Kubernetes' default terminationGracePeriodSeconds)."""


def move_deadline_seconds(document: Mapping[str, Any], speed: float) -> float:
    """How long, in scenario seconds, a pod may stay on a quarantined device once its move
    started: the responders' checkpoint timeout (the `document` is scaled to `speed`), the
    evicted pod's grace period and a reconcile pass to see it go."""
    from responder.config import apply
    from responder.settings import ResponderSettings

    probe = ResponderSettings(token="-", identity="-", prometheus_url="http://127.0.0.1")
    timeout = apply(dict(document), probe, "responder").migrator.migration.checkpoint_timeout_seconds
    return timeout * speed + TERMINATION_SECONDS + PASS_WALL_SECONDS * speed


def escalation_rule(document: Mapping[str, Any], speed: float) -> NodeEscalation:
    """The responders' node escalation settings in scenario seconds (the `document` is scaled to
    `speed`): what the verdict judges a node taint by."""
    from responder.config import apply
    from responder.settings import ResponderSettings

    probe = ResponderSettings(token="-", identity="-", prometheus_url="http://127.0.0.1")
    e = apply(dict(document), probe, "responder").reconciler.escalation
    return NodeEscalation(
        cards=e.cards, window=e.window_seconds * speed, lost_cards=e.lost_cards, enabled=e.enabled
    )


def _device_asked(scenario: Scenario, ask: ReleaseAsk) -> str:
    """The uuid of the device a release request names; StagingError when the fleet lacks it."""
    group = scenario.nodes.get(ask.node)
    if group is None:
        raise StagingError(f"demo.releaseRequests: no node {ask.node!r} in the scenario's fleet")
    if ask.gpu >= group.gpus_per_node:
        raise StagingError(
            f"demo.releaseRequests: gpu {ask.gpu} is out of range "
            f"(node {ask.node} has {group.gpus_per_node} GPUs)"
        )
    return gpu_uuid(ask.node, ask.gpu)


def _ask_release(
    ask: ReleaseAsk, device: str, observer: Observer, kubeconfig: Path, now: float
) -> tuple[subprocess.Popen[bytes], ReleaseAsk, str, str] | None:
    """A person's release request, due now: through `gpuhealth quarantine release` (started, its
    answer read when it exits) or written straight into the record's spec (`via: patch`)."""
    name = observer.record_of(device)
    if not name:
        observer.journal.record(now, Kind.NOTE, "release request skipped", device=device, detail="no record")
        return None
    if ask.via == "patch":
        client = KubeClient(KubeTransport(api_client(str(kubeconfig))))
        try:
            request = {
                "actor": f"person/{ask.actor}",
                "reason": ask.reason,
                "requestedAt": rfc3339(time.time()),
            }
            client.patch(QUARANTINES, name, {"spec": {"releaseRequest": request}})
        finally:
            client.close()
        return None
    argv = [
        sys.executable, "-m", "gpuhealth", "quarantine", "release", name, "--kubeconfig", str(kubeconfig),
        "--actor", ask.actor, "--reason", ask.reason,
    ]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), ask, name, device


def _write_journal(journal: Journal, workdir: Path) -> Path:
    # Sources are drained in turn, so entries come a little out of order across them.
    journal.entries = sorted_entries(journal.entries)
    path = workdir / "journal.json"
    path.write_text(json.dumps(journal.to_dict(), indent=1))
    return path


def _recoveries(prometheus: Prometheus, window: float, speed: float, journal: Journal) -> list[Recovery]:
    """Migration recovery times by path over the run, from its Prometheus (none when it cannot say)."""
    answers: dict[str, dict[str, float]] = {}
    try:
        for name, expr in recovery_queries(window).items():
            answers[name] = {
                str(r["metric"].get("path", "")): float(r["value"][1]) for r in prometheus.query(expr)
            }
    except LoopbackError as exc:
        journal.record(journal.ended_at, Kind.NOTE, "Prometheus did not answer", message=str(exc)[:200])
        return []
    return recoveries(answers, speed)


def _stamp(received_at: float, mono: float, now: float, speed: float) -> float:
    """Scenario seconds of a monotonic arrival time, from (mono, now) read together."""
    return now - max(0.0, mono - received_at) * speed


def _floor(rules: RuleSettings, speed: float) -> float:
    """The fastest detection in simulated seconds, from the rules scaled to `speed`: scrape +
    evaluation (every wall second here) + the Unhealthy alert's `for:` + the responder route's
    group_wait."""
    wall = 1.0 + 1.0 + rules.device.unhealthy_for.seconds + rules.alertmanager.responder_group_wait.seconds
    return float(wall * speed)


def _render_rules(
    rules: RuleSettings, recorder: WebhookRecorder, front: WebhookFront, token_file: Path, workdir: Path
) -> tuple[list[Path], Path]:
    receivers = dataclasses.replace(
        rules.alertmanager,
        responder_url=f"{front.url}{RESPONDER_PATH}",
        responder_credentials_file=str(token_file.resolve()),
        oncall_page_url=f"{recorder.url}/page",
        oncall_ticket_url=f"{recorder.url}/ticket",
        tenant_default_url=f"{recorder.url}/tenant",
    )
    evaluation = Duration(EVALUATION_WALL_SECONDS)
    rendered = render(dataclasses.replace(rules, alertmanager=receivers, evaluation_interval=evaluation))
    written = write_files(rendered, workdir / "rules")
    rule_files = [p for p in written if p.parent.name == "prometheus"]
    (alertmanager_config,) = (p for p in written if p.parent.name == "alertmanager")
    return rule_files, alertmanager_config


def _alertmanagers(count: int, config: Path, workdir: Path) -> list[Process]:
    """One Alertmanager, or an HA pair gossiping on loopback. The pair's peer timeout is short,
    so both deliver at once, before either hears the other did: the responders see duplicates."""
    binary = require_binary(ALERTMANAGER_BINARY)
    ports = [free_port() for _ in range(count)]
    cluster_ports = [free_port() for _ in range(count)]
    out = []
    for i in range(count):
        directory = workdir / f"alertmanager-{i}"
        directory.mkdir(parents=True, exist_ok=True)
        argv = [
            binary,
            f"--config.file={config}",
            f"--storage.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{ports[i]}",
        ]
        if count == 1:
            argv.append("--cluster.listen-address=")
        else:
            argv += [
                f"--cluster.listen-address=127.0.0.1:{cluster_ports[i]}",
                f"--cluster.advertise-address=127.0.0.1:{cluster_ports[i]}",
                # 0.35 refuses 0; 1 ms is still far below the gossip interval, so both deliver.
                "--cluster.peer-timeout=1ms",
                "--cluster.settle-timeout=2s",
                "--cluster.gossip-interval=100ms",
                "--cluster.pushpull-interval=5s",
                *(f"--cluster.peer=127.0.0.1:{p}" for j, p in enumerate(cluster_ports) if j != i),
            ]
        out.append(
            Process(
                f"alertmanager-{i}",
                argv,
                directory / "alertmanager.log",
                f"http://127.0.0.1:{ports[i]}/-/ready",
            )
        )
    return out


NVML_POLL_SIMULATED_SECONDS = 10.0
"""How often, in simulated seconds, a node-mode exporter reads the simulator's NVML."""


def nvml_poll_seconds(speed: float) -> float:
    """The exporters' `--nvml-poll-seconds` (wall) at `speed`.

    A node-mode device's status age grows from its last NVML reading. At a 5 s poll a
    20x run reads 100 simulated seconds apart, next to the rules' 2-minute heartbeat limit, and
    30x is past it: healthy devices flicker stale, count as Unknown, and three flickers make
    GPUDeviceUnknownFlapping restrict devices nothing is wrong with.
    """
    return min(NvmlSettings.poll_seconds, NVML_POLL_SIMULATED_SECONDS / speed)


def _exporter(
    target: Target,
    node: str,
    port: int,
    workdir: Path,
    speed: float,
    *,
    device_plugin: bool = False,
    slice_health: bool = False,
    web: web_config.WebFiles | None = None,
) -> Process:
    """One exporter: node mode with the simulated node's NVML (and, on a device-plugin node, its
    kubelet's allocatable devices, the idle GPUs' evidence there), or cluster mode. `slice_health`:
    the fleet runs the NVIDIA DRA driver as it is, whose health is its slices' taints alone."""
    name = node or "cluster"
    argv = [
        sys.executable, "-m", "gpuhealth", "--log-level", "WARNING", "exporter",
        "--kubeconfig", str(target.kubeconfig_path), "--listen", f"127.0.0.1:{port}",
        "--directory", str(workdir / f"directory-{name}.sqlite"),
    ]  # fmt: skip
    if node:
        argv += ["--node", node, "--nvml", f"sim:{target.nvml_url}"]
        argv += ["--nvml-poll-seconds", f"{nvml_poll_seconds(speed):g}"]
        if device_plugin:
            argv += ["--pod-resources", f"sim:{target.nvml_url}"]
    if slice_health:
        argv += ["--slice-health-driver", DRA_DRIVER]
    if web is not None:
        argv += web.argv()
    scheme = "https" if web is not None else "http"
    return Process(
        f"exporter-{name}", argv, workdir / f"exporter-{name}.log", f"{scheme}://127.0.0.1:{port}/readyz"
    )


def _target(
    scenario: Scenario, settings: DemoSettings, workdir: Path, front: WebhookFront
) -> AbstractContextManager[Target]:
    """The cluster the run acts on (`DemoSettings.control_plane`)."""
    if settings.control_plane == "real":
        return clusters.real(
            scenario,
            settings.speed,
            kubernetes=settings.kubernetes_version,
            workdir=workdir / "controlplane",
            # Through the front, like a Service: whichever replica is alive answers the scheduler.
            extender_url=f"{front.url}/scheduler",
        )
    return clusters.simulated(
        scenario, settings.speed, extender_url=f"{front.url}/scheduler", workdir=workdir
    )


def _install_responder_api(kubeconfig: Path) -> None:
    """The DeviceQuarantine CRD, the responders' namespace and the holder pods' PriorityClass,
    as `kubectl apply` of `deploy/` would."""
    client = KubeClient(KubeTransport(api_client(str(kubeconfig))))
    try:
        client.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
        client.create(PRIORITY_CLASS, yaml.safe_load(HOLDER_PRIORITY_FILE.read_text()))
        client.create(
            NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RESPONDER_NAMESPACE}}
        )

        def served() -> bool:
            try:
                client.list(QUARANTINES)
            except NotFound:
                return False
            return True

        wait_until("the DeviceQuarantine CRD to be served", served, timeout=60)
    finally:
        client.close()


def _plain_lines(out: TextIO, journal: Journal) -> Callable[[Entry], None]:
    """Without a live view (tests, chaos runs, benches): one plain line per entry worth one."""

    def line(entry: Entry) -> None:
        if worth_a_line(entry):
            print(narrate(journal, entry), file=out, flush=True)

    return line


def default_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="gpuhealth-demo-"))


__all__ = [
    "Controls",
    "DemoSettings",
    "Outcome",
    "Running",
    "default_workdir",
    "expected_wall_seconds",
    "responder_document",
    "run_demo",
]
