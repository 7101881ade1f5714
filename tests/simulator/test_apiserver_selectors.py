"""Unit tests of label and field selectors (pure functions).

Aspects: every label operator matches and rejects as Kubernetes does; parsing the rendered form
of any selector gives the same selector back (hypothesis); malformed selectors are 400;
field selectors with escapes round-trip; unsupported fields are refused; metav1.LabelSelector
objects convert; selectable field extraction renders values as the API compares them.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.apiserver.errors import ApiError
from simulator.apiserver.selectors import (
    FieldRequirement,
    FieldSelector,
    LabelSelector,
    Requirement,
    extract_fields,
    parse_field_selector,
    parse_label_selector,
    selector_from_label_selector_object,
)

LABELS = {"app": "infer", "gpu": "8", "example.com/tier": "canary"}


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("app=infer", True),
        ("app=train", False),
        ("app==infer", True),
        ("app!=infer", False),
        ("missing!=x", True),
        ("app in (infer,train)", True),
        ("app in (train)", False),
        ("app notin (train)", True),
        ("missing notin (train)", True),
        ("app notin (infer)", False),
        ("example.com/tier", True),
        ("missing", False),
        ("!missing", True),
        ("!app", False),
        ("gpu>4", True),
        ("gpu<4", False),
        ("app=infer, gpu , !missing", True),
        ("", True),
    ],
)
def test_label_operators(text: str, matches: bool) -> None:
    assert parse_label_selector(text).matches(LABELS) is matches


@pytest.mark.parametrize(
    "text",
    [
        "app in (a",
        "app in ()",
        "a=b)",
        "app in ((a))",
        ",",
        "app=b,,c=d",
        "-bad=1",
        "app=in valid",
        "gpu>x",
        "a/b/c=1",
    ],
)
def test_malformed_label_selectors_are_400(text: str) -> None:
    with pytest.raises(ApiError) as exc:
        parse_label_selector(text)
    assert exc.value.code == 400


_name = st.from_regex(r"[a-z0-9]([a-z0-9._-]{0,10}[a-z0-9])?", fullmatch=True)
_key = st.one_of(
    _name, st.builds(lambda p, n: f"{p}.io/{n}", st.from_regex(r"[a-z]{1,8}", fullmatch=True), _name)
)
_value = st.one_of(st.just(""), _name)
_requirement = st.one_of(
    st.builds(lambda k, op, v: Requirement(k, op, (v,)), _key, st.sampled_from(["=", "==", "!="]), _value),
    st.builds(
        lambda k, op, vs: Requirement(k, op, tuple(sorted(vs))),
        _key,
        st.sampled_from(["in", "notin"]),
        st.sets(_name, min_size=1, max_size=3),
    ),
    st.builds(lambda k, op: Requirement(k, op), _key, st.sampled_from(["exists", "!"])),
    st.builds(
        lambda k, op, n: Requirement(k, op, (str(n),)),
        _key,
        st.sampled_from(["gt", "lt"]),
        st.integers(-99, 99),
    ),
)


@given(st.lists(_requirement, max_size=5))
def test_label_selector_round_trips(reqs: list[Requirement]) -> None:
    selector = LabelSelector(tuple(reqs))
    assert parse_label_selector(str(selector)) == selector


@given(st.lists(_requirement, max_size=4), st.dictionaries(_key, _name, max_size=4))
def test_selector_is_the_conjunction_of_its_requirements(
    reqs: list[Requirement], labels: dict[str, str]
) -> None:
    assert LabelSelector(tuple(reqs)).matches(labels) == all(r.matches(labels) for r in reqs)


@given(
    st.lists(
        st.builds(
            FieldRequirement,
            st.sampled_from(["metadata.name", "spec.nodeName", "status.phase"]),
            st.sampled_from(["=", "!="]),
            st.text(alphabet="ab,=\\ -", max_size=6),
        ),
        max_size=4,
    )
)
def test_field_selector_round_trips_with_escapes(reqs: list[FieldRequirement]) -> None:
    selector = FieldSelector(tuple(reqs))
    assert parse_field_selector(str(selector)) == selector


def test_field_selector_semantics() -> None:
    fields = {"spec.nodeName": "n1", "status.phase": "Running"}
    assert parse_field_selector("spec.nodeName=n1,status.phase!=Failed").matches(fields)
    assert not parse_field_selector("spec.nodeName==n2").matches(fields)
    assert parse_field_selector("metadata.name=").matches(fields)  # absent fields compare as ""
    assert parse_field_selector(r"metadata.name=a\,b").requirements[0].value == "a,b"


@pytest.mark.parametrize("text", ["spec.nodeName", "=x", r"a=b\q", "a=b=c"])
def test_malformed_field_selectors_are_400(text: str) -> None:
    with pytest.raises(ApiError) as exc:
        parse_field_selector(text)
    assert exc.value.code == 400


def test_unsupported_field_is_refused() -> None:
    with pytest.raises(ApiError) as exc:
        parse_field_selector("spec.image=x", ["metadata.name"])
    assert exc.value.code == 400 and "field label not supported" in exc.value.message


def test_label_selector_objects() -> None:
    selector = selector_from_label_selector_object(
        {
            "matchLabels": {"app": "infer"},
            "matchExpressions": [
                {"key": "gpu", "operator": "In", "values": ["8", "4"]},
                {"key": "missing", "operator": "DoesNotExist"},
            ],
        }
    )
    assert selector.matches(LABELS)
    assert not selector.matches({**LABELS, "missing": "now"})
    assert selector_from_label_selector_object({}).matches({})  # empty selector selects everything
    with pytest.raises(ApiError):
        selector_from_label_selector_object({"matchExpressions": [{"key": "a", "operator": "Near"}]})


def test_extract_fields() -> None:
    obj = {"spec": {"nodeName": "n1", "unschedulable": True}, "status": {"phase": "Running"}}
    fields = extract_fields(obj, ["spec.nodeName", "spec.unschedulable", "status.phase", "status.podIP"])
    assert fields == {"spec.nodeName": "n1", "spec.unschedulable": "true", "status.phase": "Running"}
