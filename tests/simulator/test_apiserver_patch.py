"""Unit tests of PATCH semantics (pure functions).

Aspects: RFC 7386 merge-patch laws (hypothesis): an empty patch changes nothing, applying a
patch twice equals applying it once, inputs are never mutated, a patch's non-null leaves end up
in the result; strategic merge by merge key, `$patch: delete` and `replace`, set-like
finalizers, replaced plain lists; JSON patch errors are 400 or 422; unknown media types 415.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.apiserver.errors import ApiError
from simulator.apiserver.patch import apply_patch, json_patch, merge_patch, strategic_merge_patch

_scalars = st.one_of(st.booleans(), st.integers(-5, 5), st.text(alphabet="ab", max_size=2))
_keys = st.sampled_from(["a", "b", "c", "d"])
_docs = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=3),
    max_leaves=10,
)
_objects = st.dictionaries(_keys, _docs, max_size=4)
_patches = st.recursive(
    st.none() | _scalars,
    lambda children: (
        st.lists(children.filter(lambda v: v is not None), max_size=2)
        | st.dictionaries(_keys, children, max_size=3)
    ),
    max_leaves=8,
)
_patch_objects = st.dictionaries(_keys, _patches, max_size=4)


@given(_objects)
def test_merge_patch_with_empty_patch_is_identity(doc: dict[str, Any]) -> None:
    assert merge_patch(doc, {}) == doc


@given(_objects, _patch_objects)
def test_merge_patch_is_idempotent_and_pure(doc: dict[str, Any], patch: dict[str, Any]) -> None:
    doc_before, patch_before = copy.deepcopy(doc), copy.deepcopy(patch)
    once = merge_patch(doc, patch)
    assert merge_patch(once, patch) == once
    assert doc == doc_before and patch == patch_before


def _leaves(patch: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(patch, dict):
        return [leaf for k, v in patch.items() for leaf in _leaves(v, (*path, k))]
    return [(path, patch)]


@given(_objects, _patch_objects)
def test_merge_patch_leaves_land_in_the_result(doc: dict[str, Any], patch: dict[str, Any]) -> None:
    result = merge_patch(doc, patch)
    for path, value in _leaves(patch):
        cur: Any = result
        for key in path[:-1]:
            cur = cur[key]
        if value is None:
            assert path[-1] not in cur
        elif path:
            assert cur[path[-1]] == value


def test_strategic_merge_by_merge_key_and_directives() -> None:
    pod = {
        "metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
        "spec": {
            "containers": [{"name": "main", "image": "i:1"}, {"name": "side", "image": "s:1"}],
            "tolerations": [{"key": "old"}],
        },
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    }
    before = copy.deepcopy(pod)
    result = strategic_merge_patch(
        pod,
        {
            "metadata": {"labels": {"b": None, "c": "3"}, "finalizers": ["y", "x"]},
            "spec": {
                "containers": [{"name": "side", "$patch": "delete"}, {"name": "main", "image": "i:2"}],
                "tolerations": [{"key": "new"}],
                "$setElementOrder/containers": [{"name": "main"}],
            },
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "Synced", "status": "True"}]
            },
        },
    )
    assert pod == before
    assert result["metadata"] == {"labels": {"a": "1", "c": "3"}, "finalizers": ["x", "y"]}
    assert result["spec"]["containers"] == [{"name": "main", "image": "i:2"}]
    assert result["spec"]["tolerations"] == [{"key": "new"}]  # no patch strategy: replaced whole
    assert result["status"]["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "Synced", "status": "True"},
    ]


def test_strategic_merge_map_directives() -> None:
    obj = {"metadata": {"annotations": {"a": "1"}}, "spec": {"selector": {"x": "1", "y": "2"}}}
    result = strategic_merge_patch(
        obj,
        {
            "metadata": {"annotations": {"$patch": "delete"}},
            "spec": {"selector": {"$patch": "replace", "z": "3"}},
        },
    )
    assert result == {"metadata": {}, "spec": {"selector": {"z": "3"}}}


def test_strategic_merge_rejects_malformed_patches() -> None:
    with pytest.raises(ApiError) as exc:
        strategic_merge_patch({}, ["not", "a", "map"])
    assert exc.value.code == 400
    with pytest.raises(ApiError) as exc:
        strategic_merge_patch({"spec": {"containers": []}}, {"spec": {"containers": [{"image": "no-name"}]}})
    assert exc.value.code == 400


def test_json_patch_errors() -> None:
    doc = {"metadata": {"name": "a"}}
    assert json_patch(doc, [{"op": "add", "path": "/metadata/labels", "value": {"k": "v"}}])["metadata"][
        "labels"
    ]
    assert doc == {"metadata": {"name": "a"}}
    with pytest.raises(ApiError) as exc:
        json_patch(doc, [{"op": "frobnicate", "path": "/x"}])
    assert exc.value.code == 400
    with pytest.raises(ApiError) as exc:
        json_patch(doc, [{"op": "remove", "path": "/spec/missing"}])
    assert exc.value.code == 422
    with pytest.raises(ApiError) as exc:
        json_patch(doc, {"op": "add"})
    assert exc.value.code == 400


def test_media_types() -> None:
    assert apply_patch({"a": 1}, {"b": 2}, "application/merge-patch+json; charset=utf-8") == {"a": 1, "b": 2}
    with pytest.raises(ApiError) as exc:
        apply_patch({}, {}, "application/apply-patch+yaml")
    assert exc.value.code == 415
    with pytest.raises(ApiError) as exc:
        apply_patch({}, {}, "application/strategic-merge-patch+json", strategic_allowed=False)
    assert exc.value.code == 415
