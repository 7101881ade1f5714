"""The HTML report of a demo run.

Aspects covered: the file parses as HTML and references nothing outside itself (no http(s)
src or href, no script, no stylesheet link, no url() in CSS), so it opens offline from a file
browser; it holds the verdict (passed, or each violation) and the latency table; one chart
per affected device, each with its health bands, alert bars, record phases and action
markers; every text from the journal is escaped; an empty run renders too; an unwritable
path raises OSError naming it; charts stay on their axis whatever the entries (hypothesis).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from demo.journal import Entry, Journal, Kind
from demo.report import (
    LEFT,
    RIGHT,
    WIDTH,
    affected_devices,
    recoveries,
    recovery_queries,
    render_html,
    time_frame,
    timeline_svg,
    write_html,
)
from demo.summary import summarize
from tests.support import journals
from tests.support.journals import XID_GPU, uuid


@dataclass(frozen=True)
class FakeVerdict:
    violations: tuple[str, ...] = ()


class Page(HTMLParser):
    """Collects what the tests look at; fails on mismatched tags."""

    VOID = frozenset({"meta", "br", "hr", "img", "input", "link", "line", "rect", "circle", "polygon"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.references: list[tuple[str, str, str]] = []
        self.tags: list[str] = []
        self.charts: list[str] = []
        self.open: list[str] = []
        self.text: list[str] = []
        self.verdict = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        values = dict(attrs)
        for name in ("src", "href", "xlink:href", "action", "data"):
            if values.get(name):
                self.references.append((tag, name, values[name] or ""))
        if tag == "svg" and values.get("class") == "timeline":
            self.charts.append(values.get("data-device") or "")
        if values.get("id") == "verdict":
            self.verdict = values.get("data-verdict") or ""
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            return
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1] if self.open else None}>"
        self.open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    assert page.open == ["html"] or page.open == [], page.open
    return page


def test_the_report_is_self_contained_html_with_verdict_latency_and_one_chart_per_device(
    tmp_path: Path,
) -> None:
    journal = journals.closed_loop()
    path = tmp_path / "report.html"
    write_html(path, journal, summarize(journal), FakeVerdict())
    html = path.read_text(encoding="utf-8")
    page = parse(html)
    external = [r for r in page.references if not r[2].startswith("#")]
    assert external == []
    assert "script" not in page.tags and "link" not in page.tags and "img" not in page.tags
    assert not re.search(r"url\(|@import|https?://", html)
    assert page.verdict == "pass"
    assert page.charts == affected_devices(journal)
    assert len(page.charts) == 4  # the XID, both Unknowns, the application XID
    text = " ".join(page.text)
    assert "Every safety invariant held" in text
    assert "GPUDeviceFatalXid" in text and "43.4" in text  # onset t+30 -> enforced t+73.4
    assert "Probing" in text and "Released" in text


def test_the_report_sets_each_verdict_beside_the_ground_truth_and_counts_gpu_hours_lost() -> None:
    journal = journals.closed_loop()
    healthy = uuid(("gpu-dra-1", 5))
    journal.record(200.0, Kind.PHASE, "Quarantined", "gpu-dra-1", healthy, reason="Unhealthy", record="dq-x")
    journal.record(290.0, Kind.PHASE, "Released", "gpu-dra-1", healthy, record="dq-x", verdict="confirmed")
    page = parse(render_html(journal, summarize(journal), FakeVerdict()))
    text = " ".join(page.text)
    assert "verdicts agree with the ground truth on 1 of 2 confirmed or unconfirmed quarantines" in text
    assert "confirmed (disagrees)" in text  # the healthy GPU's quarantine: no fault warranted it
    # 378 s + 73.5 s (the open restriction, to the end at 500) + 90 s, in hours.
    assert "GPU-hours lost to quarantine: 0.15" in text
    assert "0.10" in text  # the XID quarantine's own 378 s


def test_a_failed_verdict_lists_each_violation() -> None:
    journal = journals.closed_loop()
    verdict = FakeVerdict(
        ("eviction of research/train-0 caused by Unknown", "a second <rule> for gpu-dra-0/gpu-3")
    )
    page = parse(render_html(journal, summarize(journal), verdict))
    assert page.verdict == "fail"
    text = "".join(page.text)
    assert "eviction of research/train-0 caused by Unknown" in text
    assert "a second <rule> for gpu-dra-0/gpu-3" in text  # escaped in the source, read back as text


def test_every_text_from_the_journal_is_escaped() -> None:
    journal = journals.closed_loop()
    journal.scenario = "<script>alert('scenario')</script>"
    journal.description = 'desc "quoted" & <b>bold</b>'
    journal.record(
        100.0,
        Kind.TENANT_EVENT,
        "<img src=x onerror=alert(1)>",
        "gpu-dra-0",
        uuid(XID_GPU),
        pod="<svg onload=x>",
    )
    html = render_html(journal, summarize(journal), FakeVerdict(("<i>violation</i>",)))
    page = parse(html)
    assert (
        "script" not in page.tags and "img" not in page.tags and "i" not in page.tags and "b" not in page.tags
    )
    assert "&lt;script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # in the chart's tooltip too
    assert page.references == []


def test_chart_lanes_bands_and_markers() -> None:
    journal = journals.closed_loop()
    start, end = time_frame(journal)
    assert (start, end) == (0.0, 500.0)
    svg = str(timeline_svg(journal, uuid(XID_GPU), start, end))
    lanes = re.findall(r'<text class="lane"[^>]*>([^<]*)</text>', svg)
    assert lanes == ["health", "alert FatalXid", "record", "actions"]
    health = re.findall(r'<rect class="health"[^>]*fill="([^"]+)"><title>([^<]*)</title>', svg)
    assert [title for _, title in health] == [
        "Healthy from t+0.0s to t+30.5s",
        "Unhealthy from t+30.5s to t+241.0s",
        "Healthy from t+241.0s to t+500.0s",
    ]
    phases = re.findall(r'<rect class="record"[^>]*><title>(\w+) from', svg)
    assert phases == ["Quarantined", "Probing", "Canary", "Stabilizing", "Ramp", "Released"]
    assert "GPUDeviceFatalXid firing from t+72.0s to t+332.0s (action quarantine)" in svg
    for tip in ("fault: xid (xid=79)", "eviction: evicted research/train-0", "check: canary passed"):
        assert tip in svg, tip


def test_an_empty_run_renders() -> None:
    journal = journals.empty()
    page = parse(render_html(journal, summarize(journal), FakeVerdict()))
    assert page.charts == []
    assert "No device was affected." in " ".join(page.text)


def test_an_unwritable_path_raises(tmp_path: Path) -> None:
    journal = journals.empty()
    with pytest.raises(OSError):
        write_html(tmp_path / "missing" / "report.html", journal, summarize(journal), FakeVerdict())


_numbers = re.compile(r'\b(?:x|x1|x2|cx)="(-?[\d.]+)"')


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.builds(
            Entry,
            at=st.floats(-300, 3000, allow_nan=False),
            kind=st.sampled_from(list(Kind)),
            what=st.sampled_from(
                ["Unhealthy", "Unknown", "Healthy", "Quarantined", "GPUDeviceUnhealthy", "xid"]
            ),
            node=st.just("gpu-dra-0"),
            device=st.sampled_from([uuid(XID_GPU), uuid(("gpu-dra-0", 1))]),
        ),
        max_size=30,
    ),
    st.floats(0, 4000, allow_nan=False),
)
def test_charts_stay_on_their_axis(entries: list[Entry], ended_at: float) -> None:
    journal = journals.empty()
    journal.entries = entries
    journal.ended_at = ended_at
    start, end = time_frame(journal)
    for device in affected_devices(journal):
        svg = str(timeline_svg(journal, device, start, end))
        for value in _numbers.findall(svg):
            assert LEFT - 6 <= float(value) <= WIDTH - RIGHT + 0.05
    parse(render_html(journal, summarize(journal), FakeVerdict()))


def test_migration_recovery_times_come_from_the_runs_prometheus_in_scenario_seconds() -> None:
    # What recovery_queries would answer: two device-plugin moves (increase() extrapolates a
    # little) of 3 s and 5 s on the responders' wall clock, none on the DRA path, at speed 10.
    queries = recovery_queries(61.2)
    assert queries["moves"] == ("sum by (path) (increase(gpuhealth_migration_recovery_seconds_count[62s]))")
    assert "histogram_quantile(0.99, sum by (path, le)" in queries["p99"]
    answers = {
        "moves": {"device-plugin": 2.04, "dra": 0.0},
        "sum": {"device-plugin": 8.16, "dra": 0.0},
        "p50": {"device-plugin": 3.5, "dra": float("nan")},
        "p99": {"device-plugin": 4.95},
    }
    (row,) = recoveries(answers, speed=10.0)
    assert (row.path, row.moves) == ("device-plugin", 2)
    assert row.mean_seconds == pytest.approx(40.0)
    assert (row.p50_seconds, row.p99_seconds) == (pytest.approx(35.0), pytest.approx(49.5))
    assert recoveries({}, speed=10.0) == []

    journal = journals.closed_loop()
    journal.recoveries = [row]
    assert Journal.from_dict(journal.to_dict()).recoveries == [row]
    page = parse(render_html(journal, summarize(journal), FakeVerdict()))
    text = " ".join(page.text)
    assert "Migration recovery" in text and "device-plugin" in text
    assert "40.0 s" in text and "35.0 s" in text and "49.5 s" in text


def test_a_run_without_moves_says_so_instead_of_an_empty_table() -> None:
    journal = journals.closed_loop()
    assert journal.recoveries == []
    text = " ".join(parse(render_html(journal, summarize(journal), FakeVerdict())).text)
    assert "No moves: no job was moved off a device in this run." in text
