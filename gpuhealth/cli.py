"""What every command line of the product shares when it runs a command: `run_command`.

The `gpuhealth` command itself lives above every layer (`gpuhealth_cli.main`), since it
registers each part's subcommands; the kubectl plugin (`kubectl_gpuhealth.cli`) is another
command line. Both hand the parsed arguments to `run_command`, so they report a command's
`UsageError` (exit 2) or `CommandFailed` (exit 1) alike, as `<prog> <cmd>: error: ...`, the way
argparse reports its own usage errors.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from gpuhealth.cliargs import EXIT_FAILED, EXIT_USAGE, CommandFailed, UsageError, error_line


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
