"""The `gpuhealth` command.

Each part of the product contributes its own subcommands: a module listed in
`SUBCOMMAND_MODULES` exposes `register(subparsers)`, which adds its parsers and sets
`func(args) -> int` on each (`gpuhealth.cliargs.command`). The entry point only dispatches,
so parts stay independent, and reports a command's `UsageError` (exit 2) or `CommandFailed`
(exit 1) as `gpuhealth <cmd>: error: ...`, the way argparse reports its own usage errors.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from gpuhealth import __version__
from gpuhealth.cliargs import EXIT_FAILED, EXIT_USAGE, CommandFailed, UsageError, error_line

SUBCOMMAND_MODULES = (
    "simulator.cli",  # gpuhealth sim
    "exporter.cli",  # gpuhealth exporter, gpuhealth devices
    "rules.cli",  # gpuhealth rules
    "demo.cli",  # gpuhealth demo
    "demo.chaos",  # gpuhealth chaos
    "responder.cli",  # gpuhealth quarantine
    "dashboards.cli",  # gpuhealth dashboards render
)


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
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
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


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the command `args` selected and map its errors to exit codes and one error line.

    Shared by every command line of the product (`gpuhealth`, `kubectl gpuhealth`), so both
    answer a bad input, a failure at run time, Ctrl-C and a closed pipe the same way."""
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    prog = getattr(args, "prog", parser.prog)
    try:
        return int(func(args))
    except UsageError as exc:
        print(error_line(prog, exc), file=sys.stderr)
        return EXIT_USAGE
    except CommandFailed as exc:
        print(error_line(prog, exc), file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`gpuhealth devices replay | head`): stop quietly, as a
        # process that SIGPIPE ends would, and keep the interpreter's final flush from failing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
