"""The backtest's window, its pages, who held a device and node-cordon's cost (backtest.window,
backtest.pods, backtest.cordon).

Aspects: an end is `now`, a duration before it or RFC 3339 with an offset, and anything else is
refused with what is accepted; `--from` after `--to` is refused; the pages of any window hold at
most Prometheus' points each, lie on one grid, start at the window's start and read every point
of the window once; a pod holds a device from its first sample to a step after its last;
node-cordon withholds the node's working GPUs while any of its cards is broken, and evicts the
node's pods.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backtest.cordon import cordons
from backtest.pods import Holders
from backtest.window import MAX_POINTS, Window, WindowError, parse_time
from gpuhealth.kube.meta import rfc3339_seconds

NOW = 1_800_000_000.0


def test_an_end_is_now_a_duration_before_it_or_rfc3339_with_an_offset() -> None:
    assert parse_time("now", now=NOW) == NOW
    assert parse_time("-7d", now=NOW) == NOW - 7 * 86400
    assert parse_time("-1h30m", now=NOW) == NOW - 5400
    assert parse_time("2027-01-15T08:00:00Z", now=0.0) == NOW
    assert parse_time("2027-01-15T10:00:00+02:00", now=0.0) == NOW


@pytest.mark.parametrize(
    "text", ["", "yesterday", "-7", "-7x", "7d", "2027-01-15T08:00:00", "2027-01-15", "-"]
)
def test_anything_else_is_refused_with_what_is_accepted(text: str) -> None:
    with pytest.raises(WindowError, match=r"not a time|duration"):
        parse_time(text, now=NOW)


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=1, max_value=400 * 86400))
def test_relative_and_absolute_times_read_back(now: int, seconds: int) -> None:
    assert parse_time(f"-{seconds}s", now=float(now)) == now - seconds
    assert parse_time(rfc3339_seconds(float(now)), now=0.0) == now


def test_from_after_to_is_refused() -> None:
    with pytest.raises(WindowError, match="--from must be before --to"):
        Window(NOW, NOW - 60, 60.0)


@given(
    st.integers(min_value=1, max_value=10**6),
    st.sampled_from([15.0, 30.0, 60.0]),
    st.integers(min_value=1, max_value=50),
)
def test_pages_cover_the_window_on_one_grid_each_point_once(length: int, step: float, points: int) -> None:
    window = Window(NOW, NOW + length, step)
    pages = window.pages(points)
    assert pages[0][0] == window.start and pages[-1][1] <= window.end
    read: list[float] = []
    for start, end in pages:
        assert (end - start) / step + 1 <= points
        assert (start - window.start) / step == round((start - window.start) / step)
        read += [start + i * step for i in range(math.floor((end - start) / step) + 1)]
    expected = [window.start + i * step for i in range(math.floor(length / step) + 1)]
    assert read == expected


def test_a_month_at_one_point_a_minute_takes_four_pages() -> None:
    pages = Window(NOW, NOW + 30 * 86400, 60.0).pages()
    assert len(pages) == 4
    assert all((end - start) / 60.0 + 1 <= MAX_POINTS for start, end in pages)


def test_a_pod_holds_a_device_from_its_first_sample_to_a_step_after_its_last() -> None:
    labels = {"node": "n1", "device": "GPU-0", "namespace": "ml", "pod": "train-0", "container": "a"}
    other = {**labels, "container": "b"}
    holders = Holders([(labels, [NOW, NOW + 60]), (other, [NOW + 120])], 60.0)
    assert holders.on_device("n1", "GPU-0", NOW + 180) == ["ml/train-0"]
    assert holders.on_device("n1", "GPU-0", NOW + 181) == []
    assert holders.on_device("n1", "GPU-0", NOW - 1) == []
    assert holders.on_node("n1", NOW) == ["ml/train-0"]


def test_node_cordon_withholds_the_working_gpus_of_the_node_while_a_card_is_broken() -> None:
    broken = {
        ("n1", "GPU-0"): [(NOW, NOW + 600)],
        ("n1", "GPU-1"): [(NOW + 300, NOW + 900)],
        ("n2", "GPU-0"): [(NOW, NOW + 7200)],
    }
    found = cordons(broken, {"n1": 8}, lambda node, at: [f"{node}/pod"], end=NOW + 3600)
    by_node = {c.node: c for c in found}
    assert (by_node["n1"].start, by_node["n1"].end, by_node["n1"].gpus) == (NOW, NOW + 900, 8)
    assert by_node["n1"].healthy_gpu_seconds == 8 * 900 - 600 - 600
    assert by_node["n1"].pods == ("n1/pod",)
    # A node of unknown size counts the devices its alerts name; the window's end cuts the cordon.
    assert (by_node["n2"].gpus, by_node["n2"].end, by_node["n2"].healthy_gpu_seconds) == (1, NOW + 3600, 0.0)
