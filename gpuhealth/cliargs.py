"""What every `gpuhealth` subcommand shares on the command line.

- argparse `type=` helpers (`finite_float`, `positive_float`, `duration_seconds`,
  `positive_duration_seconds`, `port`, `listen_address`), so a bad number is argparse's usage
  error (`gpuhealth <cmd>: error: argument --x: ...`, exit 2), never a traceback;
- one output vocabulary for commands that print records: `-o table|wide|json|yaml`;
- the exit codes, each with one meaning: 0 ok, 1 failure at run time (`CommandFailed`),
  2 usage or bad input (`UsageError`, and argparse's own errors). `gpuhealth.cli.run_command` prints
  either as `gpuhealth <cmd>: error: <message>`, the prefix argparse uses.

Entry-point layer: parsing only, nothing here touches the cluster or the network.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from gpuhealth.durations import DurationError, parse_duration
from gpuhealth.http import ListenError, parse_listen

EXIT_OK = 0
EXIT_FAILED = 1
"""The command ran and failed (or found what it checks for wrong): a broken invariant, a
port already taken, stale rendered files."""
EXIT_USAGE = 2
"""The command could not run as asked: a bad flag, an unreadable or invalid input file."""

OUTPUT_FORMATS = ("table", "wide", "json", "yaml")


class UsageError(Exception):
    """Bad input from the person at the keyboard (flags, files they named): exit 2."""


class CommandFailed(Exception):
    """The command started and failed at run time: exit 1."""


def command(parser: argparse.ArgumentParser, func: Callable[[argparse.Namespace], int]) -> None:
    """Make `func(args) -> exit code` what `parser`'s command runs; errors carry its name."""
    parser.set_defaults(func=func, prog=parser.prog)


def error_line(prog: str, message: object) -> str:
    """`gpuhealth <cmd>: error: <message>`, as argparse writes its own usage errors."""
    return f"{prog}: error: {message}"


# ----- argparse types ------------------------------------------------------------------


def finite_float(text: str) -> float:
    """A number that is neither NaN nor infinite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_float(text: str) -> float:
    """A finite number above zero (a speed, a rate: zero would never progress)."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return value


def duration_seconds(text: str) -> float:
    """Seconds in the one duration grammar (`gpuhealth.durations`): `90`, `90s`, `1m30s`, `500ms`."""
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_duration_seconds(text: str) -> float:
    """`duration_seconds` above zero, for periods: a zero poll period would spin its loop."""
    value = duration_seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than 0s")
    return value


def port(text: str) -> int:
    """A TCP port, 0-65535 (0 picks a free one)."""
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return int(text)


def listen_address(text: str) -> tuple[str, int]:
    """`gpuhealth.http.parse_listen` as an argparse type."""
    try:
        return parse_listen(text)
    except ListenError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ----- output --------------------------------------------------------------------------


def add_output_option(parser: argparse.ArgumentParser, *, aliases: dict[str, str] | None = None) -> None:
    """`-o/--output table|wide|json|yaml` (default table).

    `aliases` maps older spellings a command once accepted onto the vocabulary, so scripts
    written against them keep working without the help listing them.
    """
    known = dict(aliases or {})

    def output(text: str) -> str:
        return known.get(text, text)

    parser.add_argument(
        "-o",
        "--output",
        type=output,
        choices=OUTPUT_FORMATS,
        default="table",
        help="output format: %(choices)s (default: %(default)s)",
    )
