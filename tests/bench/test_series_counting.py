"""The series benchmark's counting helpers (`bench.series`).

Aspects: a text exposition's series are its samples keyed by name and labels (a histogram's
buckets, sum and count apart; HELP and TYPE lines are none); a series belongs to a device when
it carries `device`, to a node when it carries only `node`, else it is fixed; the churn between
two scrapes counts the series only in the first (ended) and only in the second (started), so a
pod label that changes on one series is one of each; per-unit shares of nothing are 0.
"""

from __future__ import annotations

from bench.series import Churn, churn, count_by_name_and_scope, count_by_scope, per_unit, scope_of, series_of

SCRAPE = """\
# HELP gpu_device_health Health.
# TYPE gpu_device_health gauge
gpu_device_health{node="n1",device="g0",status="Healthy"} 1
gpu_device_health{node="n1",device="g0",status="Unknown"} 0
gpu_device_allocation_info{node="n1",device="g0",namespace="t",pod="a",container="c",resource="r",claim=""} 1
gpu_node_kubelet_lease_age_seconds{node="n1"} 3
# HELP w Writes.
# TYPE w histogram
w_bucket{le="0.1"} 1
w_bucket{le="+Inf"} 2
w_sum 0.3
w_count 2
"""


def test_every_sample_is_one_series_and_comment_lines_are_none() -> None:
    series = series_of(SCRAPE)
    assert len(series) == 8
    assert ("gpu_node_kubelet_lease_age_seconds", frozenset({("node", "n1")})) in series
    assert ("w_bucket", frozenset({("le", "+Inf")})) in series


def test_series_are_sorted_by_what_they_grow_with() -> None:
    assert scope_of({"node": "n1", "device": "g0", "pod": "a"}) == "device"
    assert scope_of([("node", "n1"), ("driver", "d")]) == "node"
    assert scope_of({"le": "0.1"}) == "fixed"
    assert count_by_scope(series_of(SCRAPE)) == {"device": 3, "node": 1, "fixed": 4}
    by_name = count_by_name_and_scope(series_of(SCRAPE))
    assert by_name[("gpu_device_health", "device")] == 2
    assert by_name[("w_bucket", "fixed")] == 2


def test_a_changed_pod_label_ends_one_series_and_starts_another() -> None:
    before = series_of(SCRAPE)
    after = series_of(SCRAPE.replace('pod="a"', 'pod="b"').replace("} 3", "} 4"))
    assert churn(before, after) == Churn(ended=1, started=1)
    assert churn(before, before) == Churn(ended=0, started=0)


def test_a_share_of_nothing_is_zero() -> None:
    assert per_unit(12, 8) == 1.5
    assert per_unit(3, 0) == 0.0
