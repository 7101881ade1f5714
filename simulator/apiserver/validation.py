"""Schema validation of objects that API clients write, so gpuhealth cannot drift from real shapes.

Built-in kinds are checked against the Kubernetes 1.37 OpenAPI schemas that the
kubernetes-validate package carries (the "strict" set: unknown fields are errors). The package's
own `validate()` re-reads and re-compiles the schemas on every call (about 12 ms per Pod); here
the shared definitions are loaded once and one compiled validator is cached per kind.
Custom resources are checked against their CRD's openAPIV3Schema, converted to JSON Schema
(`nullable`, `x-kubernetes-int-or-string`), after pruning unknown fields as the real API does.
Failures become 422 Invalid errors naming the field.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from referencing import Registry as RefRegistry
from referencing import Resource

from simulator.apiserver.errors import ApiError, invalid
from simulator.apiserver.resources import ResourceInfo

SCHEMA_SET = "v1.37.0-local-strict"
"""kubernetes-validate schema directory; 1.37 is the first with resource.k8s.io/v1 DeviceTaintRule."""

_MAX_CAUSES = 5


def _field_path(path: Any) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _cause(error: jsonschema.ValidationError) -> tuple[str, str]:
    base = _field_path(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [r for r in error.validator_value if r not in error.instance]
        if missing:
            field = f"{base}.{missing[0]}" if base else str(missing[0])
            return field, "Required value"
    if error.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(
        error.instance, dict
    ):
        return base, f"unknown field: {error.message}"
    return base, f"Invalid value: {error.message}"


def _schema_dir() -> Any:
    return (
        importlib.resources.files("kubernetes_validate")
        .joinpath("kubernetes-json-schema")
        .joinpath(SCHEMA_SET)
    )


def crd_schema_to_jsonschema(schema: Any) -> Any:
    """An OpenAPI v3 structural schema as JSON Schema 2020-12 (the keywords that differ)."""
    if isinstance(schema, list):
        return [crd_schema_to_jsonschema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: crd_schema_to_jsonschema(v) for k, v in schema.items()}
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def prune(obj: Any, schema: Any) -> Any:
    """Drop fields the structural schema does not declare (unless it preserves unknown fields)."""
    if not isinstance(schema, dict):
        return obj
    if isinstance(obj, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            props = schema.get("properties") or {}
            return {k: prune(v, props.get(k)) for k, v in obj.items()}
        props = schema.get("properties")
        additional = schema.get("additionalProperties")
        if props is not None:
            return {k: prune(v, props[k]) for k, v in obj.items() if k in props}
        if isinstance(additional, dict):
            return {k: prune(v, additional) for k, v in obj.items()}
        if additional is True or schema.get("type") != "object":
            return obj
        return {}
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [prune(v, schema["items"]) for v in obj]
    return obj


def _find_key(value: Any, key: str, path: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    """The path of the first mapping in `value` that holds `key`, or None."""
    if isinstance(value, dict):
        if key in value:
            return path
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for k, v in items:
        found = _find_key(v, key, (*path, k))
        if found is not None:
            return found
    return None


def _invalid_crd(name: str, field: str, message: str) -> ApiError:
    return invalid("CustomResourceDefinition", "apiextensions.k8s.io", name, [(field, message)])


@functools.cache
def _definitions() -> RefRegistry:
    """The shared definitions (1.8 MB of JSON), loaded once per process."""
    defs = json.loads(_schema_dir().joinpath("_definitions.json").read_text())
    return Resource.from_contents(defs) @ RefRegistry()


@functools.cache
def _builtin_validator(group: str, version: str, kind: str) -> Any:
    """The compiled validator of a built-in kind (None when the schema set lacks it), once per process."""
    prefix = group.split(".", 1)[0]
    fname = f"{kind.lower()}-{prefix}-{version}.json" if prefix else f"{kind.lower()}-{version}.json"
    path = _schema_dir().joinpath(fname)
    if not path.is_file():
        return None
    schema = json.loads(path.read_text())
    registry = Resource.from_contents(schema) @ _definitions()
    return jsonschema.Draft202012Validator(schema, registry=registry)


class Validator:
    """Validates objects; built-in validators are shared per process, CRD ones cached per schema."""

    def __init__(self) -> None:
        self._custom: dict[tuple[str, str], tuple[dict[str, Any], Any]] = {}

    def _builtin_validator(self, info: ResourceInfo) -> Any:
        return _builtin_validator(info.group, info.version, info.kind)

    def _custom_validator(self, info: ResourceInfo, version: str) -> Any:
        schema = info.schemas.get(version)
        if schema is None:
            return None
        cached = self._custom.get((info.key, version))
        # Reused only for the very schema object it was built from: an id() key could match a
        # new schema that happens to get the address of a freed one after a CRD update.
        if cached is not None and cached[0] is schema:
            return cached[1]
        converted = crd_schema_to_jsonschema(copy.deepcopy(schema))
        props = converted.get("properties") if isinstance(converted, dict) else None
        if isinstance(props, dict):
            # The server owns metadata checks; apiVersion and kind are set by the route.
            for k in ("metadata", "apiVersion", "kind"):
                props.pop(k, None)
        validator = jsonschema.Draft202012Validator(converted)
        self._custom[(info.key, version)] = (schema, validator)
        return validator

    def check_custom_schemas(self, info: ResourceInfo, crd: dict[str, Any]) -> None:
        """422 Invalid for a CRD whose openAPIV3Schema could never validate a custom resource.

        The real API refuses such a CRD when it is written (structural schemas: no `$ref`,
        known types, patterns that compile); without this, every write of its resources
        would fail inside the validator instead.
        """
        crd_name = str(crd["metadata"]["name"])
        for index, entry in enumerate(crd["spec"]["versions"]):  # shape checked by info_from_crd
            version = entry["name"]
            schema = info.schemas.get(version)
            if schema is None:
                continue
            where = ("spec", "versions", index, "schema", "openAPIV3Schema")
            ref = _find_key(schema, "$ref")
            if ref is not None:
                field = _field_path((*where, *ref, "$ref"))
                raise _invalid_crd(crd_name, field, "Forbidden: $ref is not allowed")
            try:
                validator = self._custom_validator(info, version)
                validator.check_schema(validator.schema, format_checker=validator.FORMAT_CHECKER)
            except jsonschema.exceptions.SchemaError as exc:
                field = _field_path((*where, *exc.absolute_path))
                raise _invalid_crd(crd_name, field, f"Invalid value: {exc.message}") from exc

    def validate(self, info: ResourceInfo, obj: dict[str, Any]) -> None:
        """ApiError 422 Invalid when `obj` does not fit its schema; custom resources are pruned in place."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise invalid(info.kind, info.group, name, [("metadata", "Required value")])
        if info.custom:
            schema = info.schemas.get(info.version)
            if schema is not None:
                pruned = prune(
                    {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")}, schema
                )
                for k in [k for k in obj if k not in ("metadata", "apiVersion", "kind")]:
                    if k in pruned:
                        obj[k] = pruned[k]
                    else:
                        del obj[k]
            validator = self._custom_validator(info, info.version)
            target = {k: v for k, v in obj.items() if k != "metadata"}
        else:
            validator = self._builtin_validator(info)
            target = obj
        if validator is None:
            return
        try:
            errors = sorted(validator.iter_errors(target), key=lambda e: list(map(str, e.absolute_path)))
        except jsonschema.exceptions.SchemaError as exc:
            raise ApiError(500, "InternalError", f"schema of {info.key} is invalid: {exc.message}") from exc
        if errors:
            raise invalid(info.kind, info.group, name, [_cause(e) for e in errors[:_MAX_CAUSES]])
