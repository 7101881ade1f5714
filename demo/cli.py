"""`gpuhealth demo`: a fault scenario through the whole pipeline on loopback, with a verdict."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from demo.pipeline import DemoSettings, default_workdir, run_demo
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
            "faults, health changes, alerts and webhook deliveries; exit 1 when an automated action "
            "was not warranted by a fault (a broken safety invariant)."
        ),
    )
    parser.add_argument("--scenario", default="xid-and-unknown", help="built-in name or YAML file")
    parser.add_argument(
        "--speed", type=float, default=DemoSettings.speed, help="simulated seconds per second"
    )
    parser.add_argument("--rules-config", type=Path, default=DEFAULT_CONFIG, help="rules config to scale")
    parser.add_argument("--workdir", type=Path, help="keep configs and logs here (default: a temp dir)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.speed <= 0:
        print("gpuhealth demo: --speed must be above 0", file=sys.stderr)
        return 2
    try:
        scenario = resolve(args.scenario)
        rules = scaled(load_config(args.rules_config), args.speed)
    except ScenarioError as exc:
        print(f"gpuhealth demo: {exc.message}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"gpuhealth demo: rules at {args.speed:g}x: {exc}", file=sys.stderr)
        return 2
    workdir = args.workdir or default_workdir()
    workdir.mkdir(parents=True, exist_ok=True)
    out = sys.stdout
    try:
        outcome = run_demo(scenario, rules, DemoSettings(speed=args.speed), workdir, out)
    except LoopbackError as exc:
        print(f"gpuhealth demo: {exc}", file=sys.stderr)
        return 2

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
        return 1
    print("safety: every automated action was warranted by a fault; none for short Unknowns,", file=out)
    print("application XIDs or unreachable nodes.", file=out)
    print(f"configs and logs: {workdir}", file=out, flush=True)
    return 0
