"""`gpuhealth rules render`: render the rule files and the Alertmanager config.

Owns only argument handling and the exit codes, each with one meaning:
0 rendered (or, with --check, up to date); 1 with --check, the files under --out are stale
(differ from a fresh render, or are missing); 2 nothing could be compared or written: the
configuration is unreadable or invalid, or --out cannot be read or written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuhealth.cliargs import EXIT_FAILED, EXIT_OK, UsageError, command, error_line
from rules.render import (
    DEFAULT_CONFIG,
    PACKAGE_DIR,
    ConfigError,
    compare_files,
    load_config,
    render,
    write_files,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    rules_parser = subparsers.add_parser("rules", help="Prometheus rules and Alertmanager routing")
    rules_sub = rules_parser.add_subparsers(dest="rules_command", metavar="SUBCOMMAND")
    rules_sub.required = True
    render_parser = rules_sub.add_parser(
        "render",
        help="render rules/prometheus/*.yaml and rules/alertmanager/alertmanager.yaml from the config",
        description=(
            "Render the Prometheus rule files and the Alertmanager config from the settings file. "
            "Exit codes: 0 rendered (with --check: up to date); 1 with --check: files under --out are "
            "stale; 2 the config could not be read or is invalid, or --out could not be read or written."
        ),
    )
    render_parser.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG, help=f"settings file (default: {DEFAULT_CONFIG})"
    )
    render_parser.add_argument(
        "--out",
        type=Path,
        default=PACKAGE_DIR,
        help="output directory: OUT/prometheus/ and OUT/alertmanager/ (default: the rules package)",
    )
    render_parser.add_argument(
        "--check",
        action="store_true",
        help=(
            "write nothing; exit 1 with a diff summary when files under --out are stale (differ from a "
            "fresh render), 2 when they cannot be read"
        ),
    )
    command(render_parser, run_render)


def run_render(args: argparse.Namespace) -> int:
    try:
        files = render(load_config(args.config))
    except ConfigError as exc:
        raise UsageError(f"invalid configuration: {exc}") from exc
    out_dir: Path = args.out
    if out_dir.exists() and not out_dir.is_dir():
        # Checked here: a file in its place would otherwise read as "every file missing", stale.
        raise UsageError(f"cannot use {out_dir}: not a directory")
    try:
        return _write_or_check(files, out_dir, args)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot use {out_dir}: {exc}") from exc


def _write_or_check(files: dict[str, str], out_dir: Path, args: argparse.Namespace) -> int:
    if args.check:
        problems = compare_files(files, out_dir)
        if problems:
            stale = (
                f"{len(problems)} file(s) under {out_dir} are stale: they differ from a fresh render of "
                f"{args.config}; run `gpuhealth rules render` and commit the result:"
            )
            print(error_line(args.prog, stale), file=sys.stderr)
            for problem in problems:
                print(problem, file=sys.stderr)
            return EXIT_FAILED
        print(f"{len(files)} file(s) under {out_dir} match a fresh render of {args.config}")
        return EXIT_OK
    for path in write_files(files, out_dir):
        print(f"wrote {path}")
    return EXIT_OK
