"""`gpuhealth COMMAND ...`: one parser, each part's subcommands, one way to report errors.

Each part contributes its own subcommands through `register(subparsers)`, which adds its
parsers and sets `func(args) -> int` on each (`gpuhealth.cliargs.command`); this module only
collects them and dispatches (`gpuhealth.cli.run_command` maps errors to exit codes).

- The product, always: `exporter` and `devices` (`exporter.cli`), `rules` (`rules.cli`),
  `responder`, `quarantine` and `breaker` (`responder.cli`), `backtest` (`backtest.cli`).
- The harness, where its package imports: `sim` (`simulator.cli`), `demo` (`demo.cli`),
  `chaos` (`demo.chaos`), `dashboards` (`dashboards.cli`). The wheel and the image do not hold
  these packages, so there they are left out of the help; typed anyway, each answers with one
  error line saying what is missing and how a checkout installs it (exit 2), never a
  traceback. A harness module that fails for any other reason than a missing module raises:
  a broken harness is a defect to see, not a command to hide.
- The harness's exporter sources, `--nvml sim:URL` and `--pod-resources sim:URL`, the same way
  (`gpuhealth_cli.sources`): offered where `simulator` imports, refused with the reason where not.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

from backtest import cli as backtest_cli
from exporter import cli as exporter_cli
from gpuhealth import __version__
from gpuhealth.cli import run_command
from gpuhealth.cliargs import UsageError, command
from gpuhealth_cli import sources as harness_sources
from responder import cli as responder_cli
from rules import cli as rules_cli

PRODUCT: tuple[ModuleType, ...] = (exporter_cli, rules_cli, responder_cli, backtest_cli)
"""The product's command modules, in the order their subcommands appear in the help."""


def _simulator() -> ModuleType:
    from simulator import cli

    return cli


def _demo() -> ModuleType:
    from demo import cli

    return cli


def _chaos() -> ModuleType:
    from demo import chaos

    return chaos


def _dashboards() -> ModuleType:
    from dashboards import cli

    return cli


@dataclass(frozen=True)
class HarnessCommand:
    """A subcommand of the test harness, registered only where its module imports."""

    name: str
    load: Callable[[], ModuleType]
    """Imports the module whose `register` adds the subcommand."""
    package: str
    """The top-level package that holds it (absent from the wheel)."""
    extra: str
    """The extra that installs its third-party dependencies."""


HARNESS = (
    HarnessCommand("sim", _simulator, "simulator", "sim"),
    HarnessCommand("demo", _demo, "demo", "sim"),
    HarnessCommand("chaos", _chaos, "demo", "sim"),
    HarnessCommand("dashboards", _dashboards, "dashboards", "dev"),
)


def unavailable_reason(harness: HarnessCommand, missing: str) -> str:
    """Why `gpuhealth <name>` cannot run where importing it found no module `missing`."""
    if missing.partition(".")[0] == harness.package:
        return (
            f"not part of this installation: `gpuhealth {harness.name}` belongs to the test harness, "
            f"which only a source checkout holds (run `make setup` there)"
        )
    return (
        f"needs the Python module {missing!r}, which this installation lacks: in the source checkout, "
        f"install the harness's dependencies with `pip install -e '.[{harness.extra}]'` (or `make setup`)"
    )


def _register_unavailable(subparsers: argparse._SubParsersAction, name: str, reason: str) -> None:
    # Not given `help=`, so the listing leaves it out. It takes every argument as it comes (no
    # option prefix, `--help` included) so that whatever follows the name, the answer is why.
    parser = subparsers.add_parser(name, prefix_chars="\0", add_help=False)
    parser.add_argument("arguments", nargs="*")

    def refuse(args: argparse.Namespace) -> int:
        raise UsageError(reason)

    command(parser, refuse)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuhealth",
        description="Failure governance for GPU devices on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"gpuhealth {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log verbosity (default: INFO)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    harness_sources.register()  # before the exporter's flags list their choices
    for module in PRODUCT:
        module.register(subparsers)
    absent: list[str] = []
    for harness in HARNESS:
        try:
            module = harness.load()
        except ModuleNotFoundError as exc:
            _register_unavailable(subparsers, harness.name, unavailable_reason(harness, exc.name or "?"))
            absent.append(harness.name)
            continue
        module.register(subparsers)
    if absent:
        parser.epilog = (
            f"Not in this installation: {', '.join(absent)} (the test harness: a source checkout "
            "set up with `make setup` has them)."
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return run_command(parser, args)


if __name__ == "__main__":
    sys.exit(main())
