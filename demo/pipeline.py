"""Run the whole pipeline on loopback and narrate it.

simulated cluster (in-process thread) -> exporters (one per node, node mode, NVML from the
simulator; or one cluster-mode exporter for large fleets) -> real Prometheus evaluating the
shipped rules -> real Alertmanager with the shipped routing -> webhook receivers (the
responder's endpoint, on-call, tenants) recorded on loopback.

The rules are the shipped ones with every duration divided by the speed (`rules.render.scaled`),
so a 5-minute tolerance means 5 simulated minutes. The scenario's timeline is shifted by a
lead-in so the pipeline sees a healthy fleet before the first fault.
"""

from __future__ import annotations

import dataclasses
import queue
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from demo.safety import Action, Verdict, judge, requested_actions
from gpuhealth import fields
from gpuhealth.testing.loopback import (
    LoopbackError,
    Prometheus,
    ScrapeJob,
    WebhookRecorder,
    child_process,
    free_port,
    http_ok,
    log_tail,
    run_alertmanager,
    run_prometheus,
    wait_until,
)
from rules.render import Duration, render, write_files
from rules.render import Settings as RuleSettings
from simulator.cli import format_event
from simulator.fleet import FleetEvent
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import Scenario
from simulator.testing import ClusterHandle, running_cluster

RESPONDER_PATH = "/webhook"
TOKEN = "demo-responder-token"


@dataclass(frozen=True)
class DemoSettings:
    """How a demo run is paced and shaped; each field checked when built."""

    speed: float = 20.0
    """Simulated seconds per wall second, for the cluster and the rules alike."""
    lead_in_seconds: float = 8.0
    """Wall seconds of a healthy fleet before the first fault (exporters start, Prometheus scrapes)."""
    settle_seconds: float = 180.0
    """Simulated seconds to keep running after the last fault has ended."""
    node_exporters_max: int = 16
    """Up to this many nodes, one node-mode exporter per node (with NVML); beyond, one cluster-mode."""
    poll_interval_seconds: float = 0.5
    """Wall seconds between looks at Prometheus alerts and webhook deliveries."""

    def __post_init__(self) -> None:
        # Zero speed would never reach the end; NaN would make every deadline meaningless.
        fields.positive(self, "speed", "simulated seconds per wall second")
        fields.within(self, "lead_in_seconds", "wall seconds", 0.0)
        fields.within(self, "settle_seconds", "simulated seconds", 0.0)
        fields.within(self, "node_exporters_max", "nodes", 0, whole=True)
        fields.positive(self, "poll_interval_seconds", "wall seconds")  # zero would spin the watch loop


@dataclass
class Outcome:
    verdict: Verdict
    alerts_fired: dict[str, int]
    deliveries: int
    faults_applied: int
    simulated_seconds: float


def timeline_end(scenario: Scenario) -> float:
    """Simulated second at which the last fault of the timeline has played out."""
    ends = [f.at + (f.duration or 0.0) + (f.times or 0) * (f.period or 0.0) for f in scenario.timeline]
    return max(ends, default=0.0)


def shifted(scenario: Scenario, seconds: float) -> Scenario:
    timeline = tuple(dataclasses.replace(f, at=f.at + seconds) for f in scenario.timeline)
    return dataclasses.replace(scenario, timeline=timeline)


class Narrator:
    """Progress lines, stamped with scenario time (the lead-in subtracted)."""

    def __init__(self, out: TextIO, offset: float) -> None:
        self.out = out
        self.offset = offset

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def at(self, simulated: float, kind: str, text: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        self.say(f"[t+{simulated - self.offset:7.1f}s {stamp}] {kind:<7} {text}")


def run_demo(
    scenario: Scenario, rules: RuleSettings, settings: DemoSettings, workdir: Path, out: TextIO
) -> Outcome:
    """Run `scenario` through the pipeline; narrate to `out`; judge the actions delivered."""
    lead_in = settings.lead_in_seconds * settings.speed
    run_scenario = shifted(scenario, lead_in)
    end = lead_in + timeline_end(scenario) + settings.settle_seconds
    narrator = Narrator(out, lead_in)
    uuid_of = {
        (node, i): gpu_uuid(node, i)
        for node, group in scenario.nodes.items()
        for i in range(group.gpus_per_node)
    }
    label_of = {uuid: f"{node}/gpu-{i}" for (node, i), uuid in uuid_of.items()}
    events: queue.SimpleQueue[FleetEvent] = queue.SimpleQueue()
    tolerance = rules.device.unknown_tolerance.seconds * settings.speed

    narrator.say(
        f"gpuhealth demo: scenario {scenario.name}: {len(scenario.nodes)} nodes, "
        f"{scenario.gpu_count()} GPUs, {len(scenario.timeline)} faults; {settings.speed:g}x; "
        f"about {end / settings.speed:.0f} s; files in {workdir}"
    )
    with ExitStack() as stack:
        recorder = stack.enter_context(WebhookRecorder())
        rule_files, alertmanager_config = _render_rules(rules, recorder, workdir)
        narrator.say(
            "the responder is a later part: its webhook is recorded here instead, so "
            "GPUHealthResponderDown fires as it should"
        )
        narrator.say("starting Alertmanager ...")
        alertmanager = stack.enter_context(run_alertmanager(workdir / "alertmanager", alertmanager_config))
        node_mode = len(scenario.nodes) <= settings.node_exporters_max
        exporter_ports = {node: free_port() for node in scenario.nodes} if node_mode else {"": free_port()}
        jobs = [
            ScrapeJob("gpuhealth-exporter", [f"127.0.0.1:{port}"], {"node": node} if node else {})
            for node, port in exporter_ports.items()
        ]
        narrator.say("starting Prometheus with the shipped rules (durations divided by the speed) ...")
        prometheus = stack.enter_context(
            run_prometheus(
                workdir / "prometheus", jobs, rule_files=rule_files, alertmanager_url=alertmanager.base_url
            )
        )
        narrator.say("starting the simulated cluster ...")
        cluster = stack.enter_context(running_cluster(run_scenario, speed=settings.speed))
        cluster.call(lambda c: c.fleet.listeners.append(events.put))
        mode = (
            f"{len(exporter_ports)} node-mode exporters (NVML from the simulator)"
            if node_mode
            else "1 cluster-mode exporter"
        )
        narrator.say(f"starting {mode} ...")
        for node, port in exporter_ports.items():
            stack.enter_context(_exporter(cluster, node, port, workdir))
        wait_until(
            "the exporters to be ready",
            lambda: all(http_ok(f"http://127.0.0.1:{port}/readyz") for port in exporter_ports.values()),
            timeout=60,
        )
        narrator.say(
            f"pipeline up: API {cluster.url}, Prometheus {prometheus.base_url}, "
            f"Alertmanager {alertmanager.base_url}"
        )
        actions, fired, delivered = _watch(
            cluster, prometheus, recorder, events, narrator, label_of, end, settings
        )
        status = cluster.status()

    verdict = judge(
        scenario,
        actions,
        uuid_of,
        fatal_xids=rules.device.fatal_xids,
        tolerance=tolerance,
        unhealthy_for=rules.device.unhealthy_for.seconds * settings.speed,
    )
    return Outcome(
        verdict=verdict,
        alerts_fired=fired,
        deliveries=delivered,
        faults_applied=status["timeline"]["applied"],
        simulated_seconds=status["simulatedSeconds"] - lead_in,
    )


def _render_rules(rules: RuleSettings, recorder: WebhookRecorder, workdir: Path) -> tuple[list[Path], Path]:
    token_file = workdir / "responder-token"
    token_file.write_text(TOKEN)
    receivers = dataclasses.replace(
        rules.alertmanager,
        responder_url=f"{recorder.url}{RESPONDER_PATH}",
        responder_credentials_file=str(token_file),
        oncall_page_url=f"{recorder.url}/page",
        oncall_ticket_url=f"{recorder.url}/ticket",
        tenant_default_url=f"{recorder.url}/tenant",
    )
    # Evaluate every second: the scaled minute (3 s at 20x) would add whole evaluations of
    # delay between the recording rules and the alerts built on them.
    rendered = render(dataclasses.replace(rules, alertmanager=receivers, evaluation_interval=Duration(1)))
    written = write_files(rendered, workdir / "rules")
    rule_files = [p for p in written if p.parent.name == "prometheus"]
    (alertmanager_config,) = (p for p in written if p.parent.name == "alertmanager")
    return rule_files, alertmanager_config


@contextmanager
def _exporter(cluster: ClusterHandle, node: str, port: int, workdir: Path) -> Iterator[None]:
    name = node or "cluster"
    argv = [
        sys.executable, "-m", "gpuhealth", "--log-level", "WARNING", "exporter",
        "--kubeconfig", str(cluster.kubeconfig_path), "--listen", f"127.0.0.1:{port}",
        "--directory", str(workdir / f"directory-{name}.sqlite"),
    ]  # fmt: skip
    if node:
        argv += ["--node", node, "--nvml", f"sim:{cluster.url}"]
    log = workdir / f"exporter-{name}.log"
    with child_process(argv, log) as proc:
        yield
        if proc.poll() not in (None, 0):
            raise LoopbackError(f"exporter {name} exited with {proc.returncode}:\n{log_tail(log)}")


def _watch(
    cluster: ClusterHandle,
    prometheus: Prometheus,
    recorder: WebhookRecorder,
    events: queue.SimpleQueue[FleetEvent],
    narrator: Narrator,
    label_of: dict[str, str],
    end: float,
    settings: DemoSettings,
) -> tuple[list[Action], dict[str, int], int]:
    firing: dict[tuple[str, str, str], dict[str, Any]] = {}
    fired: dict[str, int] = {}
    actions: list[Action] = []
    seen_deliveries = 0

    def name(labels: dict[str, str]) -> str:
        device = labels.get("device", "")
        where = label_of.get(device) or "/".join(x for x in (labels.get("node", ""), device) if x)
        return f"{where} ({device})" if device in label_of else where or "fleet"

    while True:
        now = cluster.simulated_seconds()
        while not events.empty():
            line = format_event(events.get(), offset=narrator.offset)
            if line:
                narrator.say(line)
        try:
            current = {
                (a["labels"]["alertname"], a["labels"].get("node", ""), a["labels"].get("device", "")): a
                for a in prometheus.alerts("firing")
            }
        except LoopbackError as exc:
            narrator.at(now, "warning", f"Prometheus did not answer: {exc}")
            current = firing
        for key in current.keys() - firing.keys():
            labels = current[key]["labels"]
            fired[key[0]] = fired.get(key[0], 0) + 1
            narrator.at(
                now,
                "alert",
                f"FIRING   {key[0]} {name(labels)} severity={labels.get('severity', '-')} "
                f"action={labels.get('action', '-')}",
            )
        for key in firing.keys() - current.keys():
            narrator.at(now, "alert", f"resolved {key[0]} {name(firing[key]['labels'])}")
        firing = current

        deliveries = recorder.deliveries()
        # Read after the deliveries: each of them had arrived by then (never before it).
        seen_at = cluster.simulated_seconds() - narrator.offset
        for delivery in deliveries[seen_deliveries:]:
            if delivery.path == RESPONDER_PATH:
                actions.extend(requested_actions(delivery.body, seen_at))
            for alert in delivery.body.get("alerts", []):
                labels = alert["labels"]
                receiver = delivery.path.strip("/") or "?"
                if delivery.path == RESPONDER_PATH:
                    narrator.at(
                        now,
                        "webhook",
                        f"responder <- {alert['status']} {labels.get('action')} {name(labels)} "
                        f"({labels['alertname']})",
                    )
                else:
                    narrator.at(
                        now,
                        "webhook",
                        f"{receiver:<9} <- {alert['status']} {labels['alertname']} {name(labels)}",
                    )
        seen_deliveries = len(deliveries)
        if now >= end:
            return actions, fired, seen_deliveries
        time.sleep(settings.poll_interval_seconds)


def default_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="gpuhealth-demo-"))
