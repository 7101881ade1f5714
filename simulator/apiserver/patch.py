"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch.

Strategic merge is implemented for the subset gpuhealth and its simulated kubelet use: maps merge
recursively (null deletes a key, `{"$patch": "delete"}` deletes a map, `{"$patch": "replace"}`
replaces it), lists listed in `MERGE_KEYS` merge element-wise by their key (an element carrying
`"$patch": "delete"` is removed), `finalizers` merges as a set of strings (and
`$deleteFromPrimitiveList/finalizers` removes entries), every other list is replaced whole, as
for lists without a patch strategy in the real API. `$setElementOrder/...` directives are
accepted and ignored (order of merged lists is: existing elements in place, new ones appended).
The merge keys come from the Kubernetes Go types (patchMergeKey tags) and are applied by field
name, which is exact for the types gpuhealth touches.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from simulator.apiserver.errors import ApiError, bad_request

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
PATCH_TYPES = (MERGE_PATCH, JSON_PATCH, STRATEGIC_MERGE_PATCH)

MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "resourceClaims": "name",
    "resourceClaimStatuses": "name",
    "podIPs": "ip",
    "hostIPs": "ip",
}
"""List fields merged element-wise, and the key identifying an element."""

SET_LISTS = frozenset({"finalizers"})
"""Lists of strings merged as sets (patchStrategy=merge without a key)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new value and never mutates its inputs."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _op_failure() -> ApiError:
    """An operation that cannot apply is the client's error (422). kube-apiserver 1.37 does not
    pass on its patch library's words, whatever the operation (tests/controlplane/test_differential.py)."""
    return ApiError(
        422, "Invalid", "the server rejected our request due to an error in our request", details={}
    )


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch; ApiError 400 for a malformed patch, 422 when an operation cannot apply."""
    if not isinstance(operations, list):
        raise bad_request(
            "error decoding patch: json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp"
        )
    try:
        jsonpatch.JsonPatch(operations)  # checks every operation's shape before any applies
    except (jsonpatch.InvalidJsonPatch, TypeError, KeyError, ValueError, AttributeError) as exc:
        raise bad_request(f"invalid json patch: {exc}") from exc
    # One operation at a time, so a failure names the operation and path that failed.
    result = target
    for operation in operations:
        try:
            result = jsonpatch.JsonPatch([operation]).apply(result, in_place=False)
        except (
            jsonpatch.JsonPatchTestFailed,
            jsonpatch.JsonPatchConflict,
            jsonpatch.JsonPointerException,
        ) as exc:
            raise _op_failure() from exc
        except (jsonpatch.InvalidJsonPatch, TypeError, KeyError, ValueError, AttributeError) as exc:
            raise bad_request(f"invalid json patch: {exc}") from exc
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch over the subset described in the module docstring; never mutates inputs."""
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch must be a JSON object")
    return _merge_map(target if isinstance(target, dict) else {}, patch)


def _merge_map(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive is not None and directive != "merge":
        raise bad_request(f"unknown patch directive {directive!r} in map")
    result = copy.deepcopy(target)
    deletions: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key == "$patch" or key.startswith("$setElementOrder/") or key == "$retainKeys":
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            if not isinstance(value, list):
                raise bad_request(f"{key} must be a list")
            deletions[key.split("/", 1)[1]] = value
            continue
        if value is None:
            result.pop(key, None)
            continue
        if isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
                continue
            current = result.get(key)
            result[key] = _merge_map(current if isinstance(current, dict) else {}, value)
            continue
        if isinstance(value, list):
            current = result.get(key)
            if key in MERGE_KEYS and isinstance(current, list):
                result[key] = _merge_keyed_list(current, value, MERGE_KEYS[key])
            elif key in SET_LISTS and isinstance(current, list):
                result[key] = current + [v for v in value if v not in current]
            else:
                result[key] = [_strip_directives(v) for v in value]
            continue
        result[key] = value
    for key, values in deletions.items():
        current = result.get(key)
        if isinstance(current, list):
            result[key] = [v for v in current if v not in values]
    return result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def _merge_keyed_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    result = [copy.deepcopy(v) for v in current]
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [
            _strip_directives(p) for p in patch if not (isinstance(p, dict) and p.get("$patch") == "replace")
        ]
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise bad_request(f"strategic merge patch: list element {item!r} lacks merge key {merge_key!r}")
        idx = next(
            (i for i, v in enumerate(result) if isinstance(v, dict) and v.get(merge_key) == item[merge_key]),
            None,
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                del result[idx]
            continue
        if idx is None:
            result.append(_strip_directives(item))
        else:
            result[idx] = _merge_map(result[idx], item)
    return result


def apply_patch(
    target: dict[str, Any], patch: Any, patch_type: str, *, strategic_allowed: bool = True
) -> Any:
    """Apply a PATCH body of the given content type; ApiError 415 for unsupported types."""
    media = patch_type.split(";", 1)[0].strip().lower()
    if media == MERGE_PATCH:
        return merge_patch(target, patch)
    if media == JSON_PATCH:
        return json_patch(target, patch)
    if media == STRATEGIC_MERGE_PATCH:
        if not strategic_allowed:
            # Custom resources have no Go types to carry patch strategies; the real API refuses too.
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "strategic merge patch is not supported for custom resources: "
                "use application/merge-patch+json",
            )
        return strategic_merge_patch(target, patch)
    raise ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(PATCH_TYPES),
    )
