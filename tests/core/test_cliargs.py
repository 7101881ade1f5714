"""The shared command-line pieces (gpuhealth.cliargs).

Aspects: each argparse type accepts what it names and turns everything else (NaN,
infinities, zero where it would spin, words, out-of-range ports) into argparse's usage
error, never another exception (fuzzed); `-o` speaks table|wide|json|yaml, with a command's
older spellings mapped on and left out of the help.
"""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.cliargs import (
    add_output_option,
    duration_seconds,
    finite_float,
    listen_address,
    port,
    positive_duration_seconds,
    positive_float,
)


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (finite_float, "-2.5", -2.5),
        (finite_float, "0", 0.0),
        (positive_float, "1e-3", 0.001),
        (duration_seconds, "0", 0.0),
        (duration_seconds, "1m30s", 90.0),
        (duration_seconds, "0.2", 0.2),
        (positive_duration_seconds, "500ms", 0.5),
        (port, "0", 0),
        (port, "65535", 65535),
        (listen_address, ":9842", ("0.0.0.0", 9842)),
    ],
)
def test_good_values(parse: object, text: str, value: object) -> None:
    assert parse(text) == value  # type: ignore[operator]


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (finite_float, "nan", "'nan' is not a finite number"),
        (finite_float, "-inf", "'-inf' is not a finite number"),
        (finite_float, "fast", "'fast' is not a number"),
        (positive_float, "0", "'0' must be above 0"),
        (positive_float, "-1", "'-1' must be above 0"),
        (positive_float, "inf", "not a finite number"),
        (duration_seconds, "nan", "not a"),
        (duration_seconds, "-5s", "not a duration"),
        (duration_seconds, "soon", "'soon' is not a duration"),
        (positive_duration_seconds, "0s", "'0s' must be longer than 0s"),
        (port, "65536", "'65536' is not a port (0-65535)"),
        (port, "-1", "is not a port"),
        (port, "http", "is not a port"),
        (listen_address, "nowhere", "'nowhere': no port; expected HOST:PORT"),
    ],
)
def test_bad_values_are_argparse_type_errors(parse: object, text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as error:
        parse(text)  # type: ignore[operator]
    assert message in str(error.value)


@given(st.text(max_size=20))
def test_any_text_is_a_value_or_an_argparse_type_error(text: str) -> None:
    for parse in (finite_float, positive_float, duration_seconds, positive_duration_seconds, port):
        try:
            value = parse(text)
        except argparse.ArgumentTypeError:
            continue
        assert math.isfinite(value)
        if parse in (positive_float, positive_duration_seconds):
            assert value > 0


def parser_with_output(**kwargs: dict[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuhealth things")
    add_output_option(parser, **kwargs)
    return parser


def test_output_vocabulary_and_older_spellings() -> None:
    parser = parser_with_output(aliases={"text": "table"})
    assert parser.parse_args([]).output == "table"
    for form in ("table", "wide", "json", "yaml"):
        assert parser.parse_args(["-o", form]).output == form
    assert parser.parse_args(["--output", "text"]).output == "table"
    assert "table, wide, json, yaml" in parser.format_help() and "text" not in parser.format_help()


def test_an_unknown_output_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parser_with_output().parse_args(["-o", "text"])  # no alias given: not accepted
    assert exit_info.value.code == 2
    assert "gpuhealth things: error: argument -o/--output: invalid choice: 'text'" in capsys.readouterr().err
