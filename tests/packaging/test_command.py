"""The `gpuhealth` command: help, version, a usage error for a missing subcommand, and
the one error style: a command's UsageError exits 2 and CommandFailed exits 1, each printed
as `gpuhealth <cmd>: error: ...`, the prefix argparse's own usage errors carry.

Registration: the product's subcommands always; a harness subcommand where its module
imports. One whose package is absent (the wheel, the image) or whose third-party dependency is
missing is left out of the help, named in its epilog, and typed anyway answers exit 2 with one
line saying what is missing and how a checkout installs it; a harness module that is broken
in any other way is not hidden.
"""

from __future__ import annotations

import argparse
import sys
import types

import pytest

from gpuhealth import __version__, cliargs
from gpuhealth.cliargs import CommandFailed, UsageError, positive_float
from gpuhealth_cli import main as command_line
from gpuhealth_cli.main import HARNESS, HarnessCommand, build_parser, main


def test_no_subcommand_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: gpuhealth" in capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_unknown_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["no-such-command"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def fake_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `gpuhealth fake` and `gpuhealth fake deeper` whose outcome the test chooses."""

    def outcome(args: argparse.Namespace) -> int:
        if args.raise_ == "usage":
            raise UsageError("--thing 'x': not a thing")
        if args.raise_ == "failed":
            raise CommandFailed("the thing broke")
        return 0

    def register(subparsers: argparse._SubParsersAction) -> None:
        fake = subparsers.add_parser("fake")
        fake.add_argument("--raise", dest="raise_", default=None)
        fake.add_argument("--rate", type=positive_float, default=1.0)
        cliargs.command(fake, outcome)
        deeper = fake.add_subparsers().add_parser("deeper")
        deeper.add_argument("--raise", dest="raise_", default=None)
        cliargs.command(deeper, outcome)

    module = types.ModuleType("fake_commands")
    module.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_commands", module)
    monkeypatch.setattr(command_line, "PRODUCT", (module,))
    monkeypatch.setattr(command_line, "HARNESS", ())


@pytest.mark.parametrize(
    ("argv", "code", "line"),
    [
        (["fake"], 0, ""),
        (["fake", "--raise", "usage"], 2, "gpuhealth fake: error: --thing 'x': not a thing\n"),
        (["fake", "--raise", "failed"], 1, "gpuhealth fake: error: the thing broke\n"),
        (["fake", "deeper", "--raise", "failed"], 1, "gpuhealth fake deeper: error: the thing broke\n"),
    ],
)
def test_command_errors_have_argparse_s_prefix_and_one_exit_code_each(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, line: str
) -> None:
    fake_commands(monkeypatch)
    assert main(argv) == code
    assert capsys.readouterr().err == line


def test_argparse_usage_errors_share_the_prefix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_commands(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main(["fake", "--rate", "nan"])
    assert exit_info.value.code == 2
    assert "gpuhealth fake: error: argument --rate: 'nan' is not a finite number" in capsys.readouterr().err


def test_a_checkout_registers_every_product_and_harness_command() -> None:
    listed = build_parser().format_help()
    product = ["exporter", "devices", "rules", "responder", "quarantine", "breaker"]
    for name in [*product, *(h.name for h in HARNESS)]:
        assert f"\n    {name} " in listed, name
    assert "Not in this installation" not in listed


def missing(name: str) -> types.FunctionType:
    def load() -> types.ModuleType:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    return load  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("absent", "message"),
    [
        (
            "simulator",
            "gpuhealth sim: error: not part of this installation: `gpuhealth sim` belongs to the test "
            "harness, which only a source checkout holds (run `make setup` there)\n",
        ),
        (
            "jsonpatch",
            "gpuhealth sim: error: needs the Python module 'jsonpatch', which this installation lacks: "
            "in the source checkout, install the harness's dependencies with `pip install -e '.[sim]'` "
            "(or `make setup`)\n",
        ),
    ],
    ids=["package-absent", "dependency-missing"],
)
def test_an_unavailable_harness_command_is_hidden_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], absent: str, message: str
) -> None:
    monkeypatch.setattr(
        command_line, "HARNESS", (HarnessCommand("sim", missing(absent), "simulator", "sim"),)
    )
    listed = build_parser().format_help()
    assert "\n    sim " not in listed and "\n    exporter " in listed
    assert "Not in this installation: sim (the test harness" in listed
    assert main(["sim", "--scenario", "quiet"]) == 2
    assert capsys.readouterr().err == message


def test_a_harness_module_broken_otherwise_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> types.ModuleType:
        raise ImportError("cannot import name 'Fleet' from 'simulator.fleet'")

    monkeypatch.setattr(command_line, "HARNESS", (HarnessCommand("sim", broken, "simulator", "sim"),))
    with pytest.raises(ImportError, match="Fleet"):
        build_parser()
