"""Metric family declarations (`gpuhealth.metrics`).

Aspects covered: the series names and text-format TYPE line each kind gives; a histogram's
`le` on its buckets only; declarations refused with the family named (bad names and
labels, a suffix the kind adds itself, a unit the name does not end with, multi-line HELP);
a catalog refuses a family or series name declared twice, also across catalogs joined with
`union`, and looks families up by name and by series name.
"""

from __future__ import annotations

import pytest

from gpuhealth.metrics import Catalog, MetricFamily

EVENTS = MetricFamily("x_events", "counter", "Events.", ("type",))
LATENCY = MetricFamily("x_latency_seconds", "histogram", "Latency.", ("route",), unit="seconds")
BUILD = MetricFamily("x_build", "info", "Build.", ("version",))
UP = MetricFamily("x_up", "gauge", "Up.")


def test_each_kind_exposes_its_series_names() -> None:
    assert EVENTS.sample_names == ("x_events_total",)
    assert LATENCY.sample_names == (
        "x_latency_seconds_bucket",
        "x_latency_seconds_sum",
        "x_latency_seconds_count",
    )
    assert BUILD.sample_names == ("x_build_info",)
    assert UP.sample_names == ("x_up",)
    assert [f.exposed_name for f in (EVENTS, LATENCY, BUILD, UP)] == [
        "x_events_total",
        "x_latency_seconds",
        "x_build_info",
        "x_up",
    ]
    assert [f.text_type for f in (EVENTS, LATENCY, BUILD, UP)] == ["counter", "histogram", "gauge", "gauge"]


def test_only_histogram_buckets_carry_le() -> None:
    assert LATENCY.sample_labels("x_latency_seconds_bucket") == {"route", "le"}
    assert LATENCY.sample_labels("x_latency_seconds_count") == {"route"}
    with pytest.raises(KeyError):
        EVENTS.sample_labels("x_events")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "x-y"}, "not a valid metric name"),
        ({"name": "x_total"}, "without its '_total' suffix"),
        ({"name": "x_info", "kind": "info"}, "without its '_info' suffix"),
        ({"kind": "summary"}, "kind must be one of"),
        ({"help": " "}, "one non-empty line"),
        ({"help": "two\nlines"}, "one non-empty line"),
        ({"labels": ("a", "a")}, "duplicate label names"),
        ({"labels": ("__name__",)}, "not a valid label name"),
        ({"labels": ("a:b",)}, "not a valid label name"),
        ({"kind": "histogram", "labels": ("le",)}, "the histogram's own bucket label"),
        ({"unit": "seconds"}, "must end with its unit _seconds"),
    ],
)
def test_bad_declarations_are_refused_naming_the_family(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"name": "x_thing", "kind": "counter", "help": "Things."}
    fields.update(kwargs)
    with pytest.raises(ValueError, match="metric family") as info:
        MetricFamily(**fields)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_a_catalog_looks_families_up_by_name_and_by_series() -> None:
    catalog = Catalog((EVENTS, LATENCY))
    assert len(catalog) == 2 and list(catalog) == [EVENTS, LATENCY]
    assert "x_events" in catalog and "x_events_total" not in catalog
    assert catalog["x_latency_seconds"] is LATENCY
    assert catalog.family_of("x_events_total") is EVENTS
    assert catalog.family_of("x_latency_seconds_bucket") is LATENCY
    assert catalog.family_of("x_events") is None
    assert catalog.sample_names == {"x_events_total", *LATENCY.sample_names}


def test_a_name_declared_twice_is_refused_also_across_catalogs() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        Catalog((UP, MetricFamily("x_up", "counter", "Again.")))
    clash = MetricFamily("x_events_total", "gauge", "A gauge spelt like the counter's series.")
    with pytest.raises(ValueError, match="belongs to both"):
        Catalog.union(Catalog((EVENTS,)), Catalog((clash,)))
    assert len(Catalog.union(Catalog((EVENTS,)), Catalog((UP,)))) == 2
