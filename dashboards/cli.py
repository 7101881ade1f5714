"""`gpuhealth dashboards render [--check] [--out DIR]` (also `python -m dashboards`).

Exit codes, one meaning each: 0 written, or with --check the files match a fresh generation;
1 with --check, files are stale or missing; 2 bad arguments, an unreadable rules config or an
unwritable --out.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gpuhealth.cliargs import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, command, error_line
from rules.render import DEFAULT_CONFIG, ConfigError

PROG = "gpuhealth dashboards render"
PACKAGE_DIR = Path(__file__).resolve().parent
"""Where the committed dashboards/<name>.json files live (deploy/ packages them from here)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", type=Path, default=PACKAGE_DIR, help="where the JSON files go (default: %(default)s)"
    )
    parser.add_argument(
        "--rules-config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="rules config whose `selectors` name the scrape jobs (default: %(default)s)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and show the differences when the files under --out are stale",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parent = subparsers.add_parser(
        "dashboards", help="Grafana dashboards (classic JSON for file provisioning)"
    )
    actions = parent.add_subparsers(dest="dashboards_command", metavar="COMMAND", required=True)
    parser = actions.add_parser(
        "render",
        help="generate dashboards/*.json from dashboards/definitions.py",
        description=(
            "Generate the Fleet, Device, Remediation and Pipeline health dashboards. Exit codes: 0 written "
            "(with --check: up to date); 1 with --check: stale; 2 bad config or unwritable --out."
        ),
    )
    add_arguments(parser)
    command(parser, run)


def run(args: argparse.Namespace) -> int:
    # Imported here: every `gpuhealth` command registers this parser, only this one needs the SDK.
    from dashboards import render, settings

    prog = getattr(args, "prog", PROG)
    try:
        jobs = settings.load(args.rules_config)
    except (ConfigError, OSError, ValueError) as exc:
        raise UsageError(f"cannot read the job names from {args.rules_config}: {exc}") from exc
    try:
        files = render.render(jobs)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    out: Path = args.out
    try:
        if args.check:
            problems = render.stale(files, out)
            if problems:
                print(
                    error_line(
                        prog,
                        f"{len(problems)} of {len(files)} dashboard file(s) under {out} are stale; "
                        "run `gpuhealth dashboards render` and commit them:",
                    ),
                    file=sys.stderr,
                )
                for problem in problems:
                    print(problem, file=sys.stderr)
                return EXIT_FAILED
            print(f"{len(files)} dashboard file(s) under {out} match a fresh generation")
            return EXIT_OK
        for path in render.write(files, out):
            print(f"wrote {path}")
    except OSError as exc:
        raise UsageError(f"cannot use {out}: {exc}") from exc
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m dashboards`: the same as `gpuhealth dashboards render`."""
    parser = argparse.ArgumentParser(prog="python -m dashboards", description="Generate dashboards/*.json.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.prog = parser.prog
    try:
        return run(args)
    except UsageError as exc:
        print(error_line(parser.prog, exc), file=sys.stderr)
        return EXIT_USAGE
