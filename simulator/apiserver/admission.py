"""What the simulated apiserver does to a write before it is stored: the object as a create or
an update makes it, and admission (decode checks, defaults, schema and value validation).

- A create: `creating` checks the body and settles the namespace; `stamp_created` sets the
  server's metadata (uid, creationTimestamp, generation) and drops what a client may not set;
  `reset_status_on_create` resets status as the real create strategies do.
- An update: `check_precondition` (409 for a stale resourceVersion), `check_patched` (a patch
  may not rename), `merge_write` gives the object a PUT, a patch or the status subresource
  stores (server metadata kept, status only through its subresource), `keep_identity` the one
  the simulator's own read-modify-write stores; `refuse_new_finalizers` guards an object being
  deleted; `next_generation` and `is_no_op` decide what the write changes.
- `admit`: an API client's write as the apiserver takes it; every field error comes back as one
  422 Invalid. `dry_result`: what a dry-run write answers.

Pure functions over plain data (the validator compiles schemas once, and is passed in); the
store owns state, names and the resourceVersion.
"""

from __future__ import annotations

import copy
import random
import uuid
from typing import Any

import orjson

from simulator.apiserver.defaults import apply_defaults
from simulator.apiserver.errors import ApiError, bad_request, conflict, invalid, not_found
from simulator.apiserver.resources import CRD_KEY, ResourceInfo
from simulator.apiserver.validation import Validator, WriteOptions, decoding_error
from simulator.apiserver.values import invalid_value, quantity_problems, validate_object, validate_update

SERVER_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")
"""Metadata only the server sets: an update keeps the stored values, whatever the body says."""
_CLIENT_UNSETTABLE = (
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "resourceVersion",
)


def creating(info: ResourceInfo, obj: Any, namespace: str | None) -> dict[str, Any]:
    """A private copy of a create's body, its kind checked and its namespace settled (400 otherwise).

    The namespace comes from the request or the body (both: they must agree); a cluster-scoped
    object loses any it carries. The name is not checked here (generateName is the store's)."""
    if not isinstance(obj, dict):
        raise bad_request("the body of the request must be a JSON object")
    if not isinstance(obj.get("metadata", {}), dict | None):
        raise bad_request("metadata must be an object")
    new: dict[str, Any] = copy.deepcopy(obj)
    meta: dict[str, Any] = new.get("metadata") or {}  # `"metadata": null` is no metadata
    new["metadata"] = meta
    if new.get("kind") not in (None, info.kind):
        raise bad_request(f"the kind {new.get('kind')!r} of the object does not match {info.kind!r}")
    if info.namespaced:
        body_ns = meta.get("namespace")
        if namespace and body_ns and body_ns != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        ns = namespace or body_ns
        if not ns:
            raise bad_request(f"a namespace is required to create {info.key}")
        meta["namespace"] = ns
    else:
        meta.pop("namespace", None)
    return new


def stamp_created(info: ResourceInfo, new: dict[str, Any], rng: random.Random, created_at: str) -> None:
    """Set what the server sets on a new object (after its name is known): a uid drawn from `rng`,
    creationTimestamp, generation; drop what clients may not set."""
    meta = new["metadata"]
    name = meta.get("name")
    if not isinstance(name, str):
        raise invalid(
            info.kind, info.group, str(name), [("metadata.name", "Invalid value: must be a string")]
        )
    for key in _CLIENT_UNSETTABLE:
        meta.pop(key, None)
    meta["uid"] = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    meta["creationTimestamp"] = created_at
    if info.generation:
        meta["generation"] = 1
    else:
        meta.pop("generation", None)
    new["apiVersion"] = info.api_version()
    new["kind"] = info.kind


def reset_status_on_create(info: ResourceInfo, obj: dict[str, Any]) -> None:
    """An API client's create starts without status (pods: Pending), as the create strategies do."""
    if info.key == "pods":
        obj["status"] = {"phase": "Pending"}
    elif info.has_status and info.key not in ("nodes", "namespaces", CRD_KEY):
        obj.pop("status", None)


def admit(
    validator: Validator,
    info: ResourceInfo,
    new: dict[str, Any],
    old: dict[str, Any] | None,
    options: WriteOptions,
    subresource: str | None = None,
) -> None:
    """An API client's write as the apiserver takes it: decode checks, defaults, then validation.

    Unknown and duplicate fields follow `options.field_validation`; every field error of the
    schema and of the kind's value checks comes back as one 422 Invalid.
    """
    name = str((new.get("metadata") or {}).get("name", ""))
    problems = quantity_problems(new)
    if problems:
        raise decoding_error(info.kind, info.version, problems)
    if subresource is None:
        apply_defaults(info.key, new, create=old is None)
    causes = validator.schema_causes(info, new, options)
    if old is None:
        causes += validate_object(info.key, new)
    else:
        old_defaulted = copy.deepcopy(old)
        apply_defaults(info.key, old_defaulted, create=False)
        causes += validate_update(info.key, new, old_defaulted, subresource)
    if causes:
        raise invalid(info.kind, info.group, name, causes)


def merge_write(
    info: ResourceInfo, old: dict[str, Any], incoming: dict[str, Any], subresource: str | None
) -> dict[str, Any]:
    """The object to store when `incoming` is written to the main resource or a subresource."""
    if subresource == "status":
        if not info.has_status:
            raise not_found(f"{info.plural}/status", info.group, str(old["metadata"]["name"]))
        new = copy.deepcopy(old)
        if incoming.get("status") is None:
            new.pop("status", None)
        else:
            new["status"] = incoming["status"]
        new["metadata"].pop("resourceVersion", None)
        return new
    if subresource is not None:
        raise ApiError(
            405, "MethodNotAllowed", f"subresource {subresource!r} of {info.key} cannot be written"
        )
    meta = incoming.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise bad_request("metadata must be an object")
    for key in SERVER_META:
        if key in old["metadata"]:
            meta[key] = old["metadata"][key]
        else:
            meta.pop(key, None)
    meta["name"] = old["metadata"]["name"]
    if info.namespaced:
        meta["namespace"] = old["metadata"]["namespace"]
    meta.pop("resourceVersion", None)
    meta.pop("managedFields", None)
    if info.has_status:
        if "status" in old:
            incoming["status"] = old["status"]
        else:
            incoming.pop("status", None)
    incoming["apiVersion"], incoming["kind"] = info.api_version(), info.kind
    return incoming


def check_precondition(info: ResourceInfo, old: dict[str, Any], meta: dict[str, Any], stored_rv: int) -> None:
    """409 Conflict when the write names a resourceVersion other than the stored one (unset: none)."""
    rv = meta.get("resourceVersion")
    if rv not in (None, "") and str(rv) != str(stored_rv):
        raise conflict(info.plural, info.group, str(old["metadata"]["name"]))


def check_patched(info: ResourceInfo, old: dict[str, Any], patched: Any, stored_rv: int) -> None:
    """A patch's result must be an object with the same name and namespace, at the stored
    resourceVersion when it names one (422, 409)."""
    name = str(old["metadata"]["name"])
    if not isinstance(patched, dict) or not isinstance(patched.get("metadata", {}), dict):
        raise invalid(info.kind, info.group, name, [("", "the patched object is not a JSON object")])
    meta = patched.setdefault("metadata", {})
    check_precondition(info, old, meta, stored_rv)
    for key in ("name", "namespace"):
        if meta.get(key) != old["metadata"].get(key):
            raise invalid(
                info.kind,
                info.group,
                name,
                [(f"metadata.{key}", invalid_value(meta.get(key), "field is immutable"))],
            )


def keep_identity(info: ResourceInfo, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new` as the simulator's own write stores it: every part may change except the object's
    identity (name, namespace, uid, creationTimestamp), apiVersion and kind."""
    meta = new.setdefault("metadata", {})
    for key in ("name", "namespace", "uid", "creationTimestamp"):
        if key in old["metadata"]:
            meta[key] = old["metadata"][key]
    meta.pop("resourceVersion", None)
    new["apiVersion"], new["kind"] = info.api_version(), info.kind
    return new


def refuse_new_finalizers(info: ResourceInfo, old: dict[str, Any], new: dict[str, Any]) -> None:
    """422 when a write adds a finalizer to an object that is being deleted."""
    old_meta, meta = old["metadata"], new.get("metadata") or {}
    if not old_meta.get("deletionTimestamp"):
        return
    if set(meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ()):
        raise invalid(
            info.kind,
            info.group,
            old_meta["name"],
            [
                (
                    "metadata.finalizers",
                    "Forbidden: no new finalizers can be added if the object is being deleted",
                )
            ],
        )


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _without_rv(obj: dict[str, Any]) -> dict[str, Any]:
    meta = dict(obj.get("metadata") or {})
    meta.pop("resourceVersion", None)
    return {**obj, "metadata": meta}


def next_generation(old: dict[str, Any], new: dict[str, Any]) -> int:
    """metadata.generation after the write: one more when anything but metadata and status changed."""
    generation = int(old["metadata"].get("generation") or 1)
    return generation + 1 if _spec_part(new) != _spec_part(old) else generation


def is_no_op(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether the write changes nothing: no new resourceVersion, no event, like the real API."""
    return _without_rv(new) == _without_rv(old)


def dry_result(info: ResourceInfo, obj: dict[str, Any], rv: int | None) -> dict[str, Any]:
    """What a dry-run write answers: the object as it would be stored, at `rv` (None: no version yet)."""
    meta = obj.setdefault("metadata", {})
    if rv is None:
        meta.pop("resourceVersion", None)
    else:
        meta["resourceVersion"] = str(rv)
    ordered = {"apiVersion": info.api_version(), "kind": info.kind}
    ordered.update((k, v) for k, v in obj.items() if k not in ("apiVersion", "kind"))
    result: dict[str, Any] = orjson.loads(orjson.dumps(ordered))
    return result


__all__ = [
    "SERVER_META",
    "admit",
    "check_patched",
    "check_precondition",
    "creating",
    "dry_result",
    "is_no_op",
    "keep_identity",
    "merge_write",
    "next_generation",
    "refuse_new_finalizers",
    "reset_status_on_create",
    "stamp_created",
]
