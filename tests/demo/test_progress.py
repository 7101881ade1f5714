"""Live progress of a demo run.

Aspects covered: plain output is one line per journal entry (deliveries to people aside),
each once, in the order the pipeline added them, however the refreshes fall (hypothesis); a
pipe gets plain lines, a terminal the status block; the status block counts devices by state,
firing alerts, quarantines by phase, migrations, evictions, the breaker and processes down;
the live block is redrawn at most once per interval (fake clock) and always on exit; a bad
interval is refused.
"""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from demo.journal import Kind
from demo.progress import Board, Progress, narrate, worth_a_line
from tests.support import journals


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_narrate_each_entry_once_as_the_journal_grows() -> None:
    story = journals.closed_loop()
    journal = journals.empty()
    out = io.StringIO()
    with Progress(out, journal) as progress:  # a StringIO is no terminal: plain lines
        for entry in story.entries[:5]:
            journal.add(entry)
        progress.refresh(31.0)
        progress.refresh(31.0)
        journal.add(story.entries[5])
        progress.refresh(45.0)
    lines = out.getvalue().splitlines()
    assert lines == [narrate(journal, e) for e in story.entries[:6]]
    assert lines[3] == "t+   30.0s  fault           xid gpu-dra-0/gpu-3 (xid=79)"
    assert "\x1b[" not in out.getvalue()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 8), max_size=30))
def test_plain_output_does_not_depend_on_when_refresh_is_called(chunks: list[int]) -> None:
    story = journals.closed_loop().entries
    journal = journals.empty()
    out = io.StringIO()
    with Progress(out, journal, live=False) as progress:
        taken = 0
        for size in chunks:
            journal.entries.extend(story[taken : taken + size])
            taken += size
            progress.refresh(0.0)
        journal.entries.extend(story[taken:])
    assert out.getvalue().splitlines() == [narrate(journal, e) for e in story if worth_a_line(e)]


def test_deliveries_to_people_get_no_line_of_their_own() -> None:
    journal = journals.closed_loop()
    pages = [e for e in journal.entries if e.kind is Kind.DELIVERY and e.what != "responder"]
    to_responder = [e for e in journal.entries if e.kind is Kind.DELIVERY and e.what == "responder"]
    assert pages and to_responder
    assert not any(worth_a_line(e) for e in pages)
    assert all(worth_a_line(e) for e in to_responder)


def test_board_counts_the_state_of_the_run() -> None:
    journal = journals.closed_loop()
    journal.record(460.0, Kind.BREAKER, "tripped", trigger="rate")
    journal.record(465.0, Kind.PROCESS, "killed", name="alertmanager-1")
    board = Board(journal)
    for entry in journal.entries[: journal.entries.index(journal.first(Kind.FAULT, what="recover"))]:
        board.apply(entry)
    mid = board.lines(200.0, 500.0)
    assert mid[0] == "closed-loop  t+200s of 500s at 20x  faults 4"
    assert mid[1] == "devices     Healthy 30  Unhealthy 1  Unknown 1"
    assert (
        mid[2] == "alerts      2 firing: GPUDeviceFatalXid gpu-dra-0/gpu-3, GPUDeviceUnknown gpu-dra-2/gpu-6"
    )
    assert mid[3] == "quarantines Quarantined 1"
    assert mid[4] == "migrations  succeeded 1  evictions 2"
    assert mid[5] == "breaker     closed"  # responder-0 was killed and started again
    board = Board(journal)
    for entry in journal.entries:
        board.apply(entry)
    end = board.lines(500.0)
    assert end[1] == "devices     Healthy 32  Unhealthy 0  Unknown 0"
    assert end[2] == "alerts      0 firing"
    assert end[3] == "quarantines Canary 1  Released 1"
    assert end[5] == "breaker     tripped   down: alertmanager-1"


def test_many_firing_alerts_are_cut_short() -> None:
    journal = journals.empty()
    for i, device in enumerate(list(journal.devices)[:5]):
        journal.record(float(i), Kind.ALERT_FIRING, "GPUDeviceUnhealthy", "n", device)
    board = Board(journal)
    for entry in journal.entries:
        board.apply(entry)
    assert board.lines(5.0)[2].endswith("(+2 more)")


def test_live_block_is_redrawn_at_most_once_per_interval_and_on_exit() -> None:
    story = journals.closed_loop().entries
    journal = journals.empty()
    out = io.StringIO()
    clock = FakeClock()
    with Progress(out, journal, live=True, min_interval=0.5, clock=clock) as progress:
        journal.entries.extend(story[:4])
        progress.refresh(30.0)  # the first refresh draws
        drawn = out.getvalue()
        assert "faults 1" in drawn and "xid gpu-dra-0/gpu-3 (xid=79)" in drawn
        journal.entries.extend(story[4:9])
        clock.now = 0.4
        progress.refresh(72.0)
        assert out.getvalue() == drawn  # within the interval: nothing drawn, lines kept
        clock.now = 0.9
        progress.refresh(72.0)
        assert "1 firing: GPUDeviceFatalXid" in out.getvalue()[len(drawn) :]
        assert "FIRING GPUDeviceFatalXid gpu-dra-0/gpu-3" in out.getvalue()
        journal.entries.extend(story[9:])
        before_exit = len(out.getvalue())
    tail = out.getvalue()[before_exit:]
    assert "quarantines Canary 1  Released 1" in tail  # exit draws the final state
    assert "migration succeeded" in tail


def test_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="min_interval -1"):
        Progress(io.StringIO(), journals.empty(), min_interval=-1)
