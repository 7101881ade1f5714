"""`gpuhealth demo`: a fault scenario through the whole pipeline on loopback, with a verdict.

Exit codes: 0 every automated action was warranted, 1 the run failed (a broken safety
invariant, or a part of the pipeline that could not start or died), 2 bad flags or input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from demo.pipeline import DemoSettings, default_workdir, run_demo
from gpuhealth.cliargs import EXIT_FAILED, CommandFailed, UsageError, command, positive_float
from gpuhealth.testing.loopback import LoopbackError
from rules.render import DEFAULT_CONFIG, ConfigError, load_config, scaled
from simulator.scenario import ScenarioError, resolve


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run a fault scenario through cluster, exporters, Prometheus and Alertmanager on loopback",
        description=(
            "Run a fault scenario on the simulated cluster through the exporters, a real Prometheus "
            "evaluating the shipped rules and a real Alertmanager with the shipped routing; narrate "
            "faults, health changes, alerts and webhook deliveries. Exit 1 when an automated action "
            "was not warranted by a fault (a broken safety invariant) or the pipeline failed to run; "
            "2 for bad flags or input."
        ),
    )
    parser.add_argument("--scenario", default="xid-and-unknown", help="built-in name or YAML file")
    parser.add_argument(
        "--speed",
        type=positive_float,
        default=DemoSettings.speed,
        help="simulated seconds per second (default: %(default)s)",
    )
    parser.add_argument("--rules-config", type=Path, default=DEFAULT_CONFIG, help="rules config to scale")
    parser.add_argument("--workdir", type=Path, help="keep configs and logs here (default: a temp dir)")
    command(parser, run)


def run(args: argparse.Namespace) -> int:
    try:
        scenario = resolve(args.scenario)
        rules = scaled(load_config(args.rules_config), args.speed)
    except ScenarioError as exc:
        raise UsageError(exc.message) from exc
    except ConfigError as exc:
        raise UsageError(f"rules at {args.speed:g}x: {exc}") from exc
    workdir = args.workdir or default_workdir()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--workdir {workdir}: {exc.strerror or exc}") from exc
    out = sys.stdout
    try:
        outcome = run_demo(scenario, rules, DemoSettings(speed=args.speed), workdir, out)
    except LoopbackError as exc:
        raise CommandFailed(str(exc)) from exc

    verdict = outcome.verdict
    print("\nsummary", file=out)
    print(
        f"  {outcome.faults_applied} faults applied over {outcome.simulated_seconds:.0f} simulated seconds; "
        f"{outcome.deliveries} webhook notifications",
        file=out,
    )
    for alertname, count in sorted(outcome.alerts_fired.items()):
        print(f"  alert {alertname}: fired for {count} target(s)", file=out)
    for where, action, alertname in verdict.acted:
        print(f"  responder asked to {action} {where} ({alertname}): warranted", file=out)
    for where, action in verdict.missed:
        print(f"  not seen: {action} {where} (warranted; the run may have ended first)", file=out)
    if verdict.violations:
        print("SAFETY INVARIANT BROKEN:", file=out)
        for line in verdict.violations:
            print(f"  {line}", file=out)
        return EXIT_FAILED
    print("safety: every automated action was warranted by a fault; none for short Unknowns,", file=out)
    print("application XIDs or unreachable nodes.", file=out)
    print(f"configs and logs: {workdir}", file=out, flush=True)
    return 0
