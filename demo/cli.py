"""`gpuhealth demo`: a fault scenario through the whole closed loop on loopback, with a verdict.

    gpuhealth demo [--scenario NAME|FILE] [--speed X] [--report PATH] [--workdir DIR]
                   [--rules-config FILE]

Exit codes: 0 every safety invariant held and the scenario's expectations were met; 1 the
run failed (a broken invariant, a failed expectation, or a part of the pipeline that could
not start or died); 2 bad flags or input (a scenario, its `demo:` or `responder:` section, a
speed the rules cannot follow).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple, TextIO

from demo.expectations import parse as parse_expectations
from demo.floors import alert_floors
from demo.journal import Entry, Journal
from demo.pipeline import (
    CONTROL_PLANES,
    KUBERNETES_VERSIONS,
    DemoSettings,
    Outcome,
    default_workdir,
    devices_of,
    expected_wall_seconds,
    run_demo,
    timeline_end,
)
from demo.progress import Progress
from demo.report import write_html
from demo.staging import Staging, StagingError, staging
from demo.summary import summarize, write_text
from gpuhealth.cliargs import EXIT_FAILED, CommandFailed, UsageError, command, positive_float
from gpuhealth.testing.loopback import LoopbackError
from rules.render import DEFAULT_CONFIG, ConfigError, load_config, scaled
from rules.render import Settings as RuleSettings
from simulator.scenario import Scenario, ScenarioError, resolve

DEFAULT_SCENARIO = "closed-loop"
DEFAULT_SPEED = DemoSettings.speed


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run a fault scenario through the whole closed loop on loopback (cluster to responders)",
        description=(
            "Run a fault scenario on the simulated cluster through the exporters, a real Prometheus "
            "evaluating the shipped rules, a real Alertmanager with the shipped routing and two "
            "responder replicas, enforcing; narrate what happens, then summarize it. Exit 1 when a "
            "safety invariant broke, the scenario's expectations failed or the pipeline failed to "
            "run; 2 for bad flags or input."
        ),
    )
    parser.add_argument(
        "--scenario", default=DEFAULT_SCENARIO, help="built-in name or YAML file (default: %(default)s)"
    )
    parser.add_argument(
        "--speed",
        type=positive_float,
        default=None,
        help=f"simulated seconds per second (default: the scenario's demo.speed, else {DEFAULT_SPEED:g})",
    )
    parser.add_argument(
        "--control-plane",
        choices=CONTROL_PLANES,
        default="simulated",
        help=(
            "the cluster to run on: the in-process simulated apiserver (fast, the default), or a real "
            "etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from upstream "
            "(tools/upstream) with the scenario's nodes as their node agents"
        ),
    )
    parser.add_argument(
        "--kubernetes-version",
        choices=KUBERNETES_VERSIONS,
        default=None,
        help="with --control-plane real: which pinned build runs (default: 1.37)",
    )
    parser.add_argument(
        "--web-config",
        action="store_true",
        help="exporters and responders behind TLS and basic auth, scraped so (docs/web-config.md)",
    )
    parser.add_argument("--report", type=Path, help="write a self-contained HTML report here")
    parser.add_argument("--rules-config", type=Path, default=DEFAULT_CONFIG, help="rules config to scale")
    parser.add_argument(
        "--workdir", type=Path, help="keep configs, logs and journal.json here (default: a temp dir)"
    )
    command(parser, run)


class Prepared(NamedTuple):
    """What a command running scenarios through the pipeline reads from its flags."""

    scenario: Scenario
    stage: Staging
    speed: float
    rules: RuleSettings
    """The rules config scaled to `speed`."""
    workdir: Path


def prepare(args: argparse.Namespace) -> Prepared:
    """`--scenario`, its `demo:` section, `--speed` (else the scenario's, else the default),
    `--rules-config` and `--workdir` (created), each bad one a UsageError naming it."""
    try:
        scenario = resolve(args.scenario)
        stage = staging(scenario.demo)
        # A misspelt device in `expect:` fails here (exit 2), not after the whole run.
        parse_expectations(scenario.expect, scenario.source, nodes=scenario.nodes)
    except ScenarioError as exc:
        raise UsageError(exc.message) from exc
    except StagingError as exc:
        raise UsageError(f"{args.scenario}: {exc}") from exc
    speed = args.speed or stage.speed or DEFAULT_SPEED
    try:
        rules = scaled(load_config(args.rules_config), speed)
    except ConfigError as exc:
        raise UsageError(f"rules at {speed:g}x: {exc}") from exc
    workdir = args.workdir or default_workdir()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--workdir {workdir}: {exc.strerror or exc}") from exc
    return Prepared(scenario, stage, speed, rules, workdir)


def run(args: argparse.Namespace) -> int:
    scenario, stage, speed, rules, workdir = prepare(args)
    if args.report is not None and not args.report.parent.is_dir():
        raise UsageError(f"--report {args.report}: no such directory {args.report.parent}")
    if args.control_plane == "simulated" and args.kubernetes_version is not None:
        raise UsageError("--kubernetes-version applies to --control-plane real")
    settings = DemoSettings(
        speed=speed,
        control_plane=args.control_plane,
        kubernetes_version=args.kubernetes_version or DemoSettings.kubernetes_version,
        web_config=args.web_config,
    )
    out = sys.stdout
    wall = expected_wall_seconds(scenario, settings, stage)
    print(
        f"gpuhealth demo: scenario {scenario.name}: {len(scenario.nodes)} nodes, "
        f"{scenario.gpu_count()} GPUs, "
        f"{len(scenario.timeline)} faults, {stage.responders} responder replicas, "
        f"{stage.alertmanagers} Alertmanager(s); {_cluster_words(settings)}; {speed:g}x; "
        f"{'TLS and basic auth on; ' if settings.web_config else ''}"
        f"this takes about {wall / 60:.1f} minutes "
        f"({wall:.0f} s); files in {workdir}",
        file=out,
        flush=True,
    )
    # The live view reads its own copy of the journal, fed entry by entry as the run records them.
    view = Journal(scenario.name, scenario.description, speed, devices_of(scenario))
    settle = stage.settle if settings.settle_seconds is None else settings.settle_seconds
    until = timeline_end(scenario) + settle
    try:
        with Progress(out, view, until=until) as progress:

            def seen(entry: Entry) -> None:
                view.add(entry)
                progress.refresh(entry.at)

            outcome = run_demo(scenario, rules, settings, workdir, out, on_entry=seen)
    except StagingError as exc:
        raise UsageError(f"{args.scenario}: {exc}") from exc
    except LoopbackError as exc:
        raise CommandFailed(str(exc)) from exc
    _summarize(outcome, rules, speed, out, args.report)
    failed = bool(outcome.verdict.violations or outcome.expectation_failures)
    return EXIT_FAILED if failed else 0


def _cluster_words(settings: DemoSettings) -> str:
    if settings.control_plane == "real":
        return f"real control plane, Kubernetes {settings.kubernetes_version}"
    return "simulated cluster"


def _summarize(outcome: Outcome, rules: RuleSettings, speed: float, out: TextIO, report: Path | None) -> None:
    """The summary (latencies against each alert's own floor), the verdict and the report."""
    journal, verdict = outcome.journal, outcome.verdict
    summary = summarize(journal, floors=alert_floors(rules, speed))
    write_text(summary, verdict, out)
    if report is not None:
        try:
            write_html(report, journal, summary, verdict)
        except OSError as exc:
            raise CommandFailed(f"--report {report}: {exc.strerror or exc}") from exc
        print(f"report: {report}", file=out)
    for failure in outcome.expectation_failures:
        print(f"EXPECTATION FAILED: {failure}", file=out)
    print(f"journal: {outcome.journal_path}; configs and logs: {outcome.workdir}", file=out, flush=True)
