"""`gpuhealth rules render`: render the rule files and the Alertmanager config.

Owns only argument handling and the exit codes: 0 rendered (or up to date with --check),
1 committed files differ from a fresh render (--check), 2 the configuration is invalid.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
        help="write nothing; exit 1 with a diff summary when files under --out differ from a fresh render",
    )
    render_parser.set_defaults(func=run_render)


def run_render(args: argparse.Namespace) -> int:
    try:
        settings = load_config(args.config)
    except ConfigError as exc:
        print(f"gpuhealth rules render: invalid configuration: {exc}", file=sys.stderr)
        return 2
    files = render(settings)
    out_dir: Path = args.out
    try:
        return _write_or_check(files, out_dir, args)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"gpuhealth rules render: cannot use {out_dir}: {exc}", file=sys.stderr)
        return 1


def _write_or_check(files: dict[str, str], out_dir: Path, args: argparse.Namespace) -> int:
    if args.check:
        problems = compare_files(files, out_dir)
        if problems:
            print(
                f"gpuhealth rules render --check: {len(problems)} file(s) under {out_dir} differ from a "
                f"fresh render of {args.config}; run `gpuhealth rules render` and commit the result:",
                file=sys.stderr,
            )
            for problem in problems:
                print(problem, file=sys.stderr)
            return 1
        print(f"{len(files)} file(s) under {out_dir} match a fresh render of {args.config}")
        return 0
    for path in write_files(files, out_dir):
        print(f"wrote {path}")
    return 0
