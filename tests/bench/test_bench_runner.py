"""`python -m bench` and the operator-cost benchmark's pure helpers.

Aspects: options after a benchmark's name (and the value after an option) go to that
benchmark, the next known name starts another; an option before any name, an unknown name
and options for a benchmark that takes none are refused with exit 2 and a message; the
scraper's event rate is per second between the first and the last scrape; /proc readings of
this very process parse.
"""

from __future__ import annotations

import os

import pytest

from bench.__main__ import _plan, main
from bench.bench_operator_cost import Scrape, cpu_seconds, memory_bytes, rate

AVAILABLE = ["bench_exporter_events", "bench_operator_cost", "bench_responder"]


def test_options_and_their_values_go_to_the_benchmark_named_before_them() -> None:
    argv = ["operator_cost", "--duration", "2m", "--warmup=5s", "exporter_events", "bench_responder"]
    assert _plan(argv, AVAILABLE) == [
        ("bench_operator_cost", ["--duration", "2m", "--warmup=5s"]),
        ("bench_exporter_events", []),
        ("bench_responder", []),
    ]


def test_no_name_runs_every_benchmark_without_options() -> None:
    assert _plan([], AVAILABLE) == [(name, []) for name in AVAILABLE]


def test_a_word_that_is_no_option_value_is_a_name() -> None:
    assert _plan(["exporter_events", "typo"], AVAILABLE) == [
        ("bench_exporter_events", []),
        ("bench_typo", []),
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--duration", "2m"], "option --duration before any benchmark name"),
        (["exporter_events", "typo"], "unknown benchmark(s): bench_typo"),
        (["exporter_events", "--rounds", "3"], "exporter_events takes no options (given --rounds 3)"),
    ],
)
def test_bad_command_lines_exit_2_saying_why(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_event_rate_is_per_second_between_the_first_and_last_scrape() -> None:
    scrapes = [
        Scrape(at=100.0, seconds=0.5, sent=10, size=100, events=1_000.0, leases=900.0),
        Scrape(at=115.0, seconds=0.5, sent=10, size=100, events=16_000.0, leases=15_900.0),
        Scrape(at=130.0, seconds=0.5, sent=10, size=100, events=31_000.0, leases=30_900.0),
    ]
    assert rate(scrapes, lambda s: s.events) == 1_000.0
    assert rate(scrapes, lambda s: s.leases) == 1_000.0
    assert rate(scrapes[:1], lambda s: s.events) == 0.0


def test_proc_readings_of_this_process_parse() -> None:
    rss, peak = memory_bytes(os.getpid())
    assert 0 < rss <= peak
    assert cpu_seconds(os.getpid()) > 0.0
