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

import yaml

from gpuhealth.cliargs import EXIT_FAILED, EXIT_OK, UsageError, command, error_line
from rules.manifests import (
    ManifestError,
    alertmanager_config,
    in_cluster,
    prometheus_rule,
    scrape_config,
)
from rules.render import (
    DEFAULT_CONFIG,
    PACKAGE_DIR,
    ConfigError,
    Settings,
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
        default=None,
        help=(
            "output directory: OUT/prometheus/ and OUT/alertmanager/ (default: the rules package); "
            "with --format prometheusrule, standard output unless given"
        ),
    )
    render_parser.add_argument(
        "--format",
        choices=FORMATS,
        default="files",
        help=(
            "files: the rule files and the Alertmanager config as they are; prometheusrule: a "
            "PrometheusRule and an AlertmanagerConfig for the cluster (the responder at its Service, "
            "its token from the gpuhealth-responder-token Secret), to patch over the installed ones; "
            "helm-values: the same rules and routing as values of the chart (prometheusRule.groups, "
            "alertmanagerConfig.spec), for `helm upgrade -f`; "
            "no-operator: OUT/rules/*.yaml, OUT/alertmanager.yaml and OUT/prometheus-scrape.yaml for "
            "Prometheus and Alertmanager without the operator, with the same in-cluster addresses"
        ),
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


FORMATS = ("files", "prometheusrule", "helm-values", "no-operator")
HEADER = "# Rendered by `gpuhealth rules render --format {format}` from {config}.\n"


def cluster_files(settings: Settings, fmt: str, config: Path) -> dict[str, str]:
    """The files of `--format prometheusrule` or `no-operator` from `settings`, by relative path."""
    settings = in_cluster(settings)
    rendered = render(settings)
    header = HEADER.format(format=fmt, config=config)
    rule_files = {
        p.removeprefix("prometheus/"): t for p, t in rendered.items() if p.startswith("prometheus/")
    }
    alertmanager = rendered["alertmanager/alertmanager.yaml"]
    if fmt == "helm-values":
        rule = yaml.safe_load(prometheus_rule(rule_files))
        routing = yaml.safe_load(alertmanager_config(alertmanager))
        values = {
            "prometheusRule": {"groups": rule["spec"]["groups"]},
            "alertmanagerConfig": {"spec": routing["spec"]},
        }
        return {
            "values.yaml": header + yaml.safe_dump(values, sort_keys=False, width=110, allow_unicode=True)
        }
    if fmt == "prometheusrule":
        return {
            "prometheusrule.yaml": prometheus_rule(rule_files, header),
            "alertmanagerconfig.yaml": alertmanager_config(alertmanager, header),
        }
    files = {f"rules/{name}": text for name, text in rule_files.items()}
    files["alertmanager.yaml"] = alertmanager
    files["prometheus-scrape.yaml"] = scrape_config(settings, header)
    return files


def run_render(args: argparse.Namespace) -> int:
    try:
        settings = load_config(args.config)
        if args.format == "files":
            files = render(settings)
        else:
            files = cluster_files(settings, args.format, args.config)
    except (ConfigError, ManifestError) as exc:
        raise UsageError(f"invalid configuration: {exc}") from exc
    if args.out is None and args.format in ("prometheusrule", "helm-values") and not args.check:
        sys.stdout.write("---\n".join(files[name] for name in sorted(files, reverse=True)))
        return EXIT_OK
    if args.out is None and args.format == "no-operator":
        raise UsageError("--format no-operator writes several files: name the directory with --out")
    if args.out is None and args.format != "files":
        raise UsageError(f"--check with --format {args.format} compares the files under --out: name it")
    out_dir: Path = PACKAGE_DIR if args.out is None else args.out
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
