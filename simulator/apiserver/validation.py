"""Schema validation of objects that API clients write, so gpuhealth cannot drift from real shapes.

Built-in kinds are checked against the Kubernetes 1.37 OpenAPI schemas that the
kubernetes-validate package carries (the "strict" set: unknown fields are errors). The package's
own `validate()` re-reads and re-compiles the schemas on every call (about 12 ms per Pod); here
the shared definitions are loaded once and one compiled validator is cached per kind.
Custom resources are checked against their CRD's openAPIV3Schema, converted to JSON Schema
(`nullable`, `x-kubernetes-int-or-string`), after pruning unknown fields as the real API does.
A value of the wrong JSON type in a built-in kind is the decoder's 400 (`json: cannot unmarshal
string into Go struct field PodSpec.spec.containers of type []v1.Container`); other failures
become 422 Invalid errors naming the field, worded as the apiserver words them
(`spec.color: Unsupported value: "green": supported values: "red", "blue"`).

Unknown fields follow the request's `fieldValidation` (`WriteOptions`): Strict refuses them with
the apiserver's 400 `strict decoding error`, Warn (the default) drops them and returns one
warning each, Ignore drops them silently. Duplicate fields in the request body are found by
`duplicate_fields` while the body is decoded, and follow the same rule.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]
from referencing import Registry as RefRegistry
from referencing import Resource

from simulator.apiserver.defaults import apply_schema_defaults
from simulator.apiserver.errors import ApiError, invalid, join_field_errors
from simulator.apiserver.resources import ResourceInfo
from simulator.apiserver.values import value as go_value

SCHEMA_SET = "v1.37.0-local-strict"
"""kubernetes-validate schema directory; 1.37 is the first with resource.k8s.io/v1 DeviceTaintRule."""

_MAX_CAUSES = 5
"""For built-in kinds only: a custom resource's schema errors are all reported, as kube-apiserver
1.37 does (tests/controlplane/test_differential.py: six missing fields, six causes)."""

FieldValidation = Literal["Strict", "Warn", "Ignore"]
FIELD_VALIDATIONS: tuple[FieldValidation, ...] = ("Strict", "Warn", "Ignore")


@dataclass
class WriteOptions:
    """How one API write is carried out: the request's query options, and the warnings it collects."""

    dry_run: bool = False
    """`dryRun=All`: validated, defaulted and answered as if done, but nothing is stored or watched."""
    field_validation: FieldValidation = "Warn"
    """What unknown and duplicate fields do: refuse (Strict), drop with a warning (Warn), drop (Ignore)."""
    duplicates: list[str] = field(default_factory=list)
    """Paths of fields the request body set twice (the decoder keeps the last)."""
    warnings: list[str] = field(default_factory=list)
    """Texts for the response's `Warning: 299 - "..."` headers, in order."""


def decoding_error(kind: str, version: str, problems: list[str]) -> ApiError:
    """The 400 the apiserver's decoder answers for a body it cannot turn into the kind."""
    return ApiError(
        400,
        "BadRequest",
        f'{kind} in version "{version}" cannot be handled as a {kind}: ' + ", ".join(problems),
    )


def apply_field_validation(
    info: ResourceInfo, version: str, unknown: list[str], options: WriteOptions
) -> None:
    """Refuse, or record warnings for, the unknown fields (already dropped) and the duplicate ones."""
    problems = [f'unknown field "{path}"' for path in unknown]
    problems += [f'duplicate field "{path}"' for path in options.duplicates]
    if not problems:
        return
    if options.field_validation == "Strict":
        raise decoding_error(info.kind, version, ["strict decoding error: " + ", ".join(problems)])
    if options.field_validation == "Warn":
        options.warnings.extend(problems)


class _Pairs(dict[str, Any]):
    """A decoded JSON object that remembers the keys its text repeated."""

    repeated: tuple[str, ...] = ()


def _pairs_hook(pairs: list[tuple[str, Any]]) -> _Pairs:
    obj = _Pairs(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        obj.repeated = tuple(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
    return obj


def duplicate_fields(raw: bytes) -> list[str]:
    """Paths (`spec.replicas`, `spec.containers[0].name`) of keys a JSON text sets more than once.

    orjson keeps the last value silently, as the apiserver's decoder does; this second,
    slower decode only runs on request bodies (kilobytes) to name the repeats.
    """
    if raw.count(b'"') < 4:
        return []
    try:
        tree = json.loads(raw, object_pairs_hook=_pairs_hook)
    except ValueError:
        return []
    out: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, _Pairs):
            out.extend(f"{path}.{k}" if path else k for k in value.repeated)
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else k)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")

    walk(tree, "")
    return out


def _field_path(path: Any) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return _JSON_TYPES.get(type(value), "string")


def _first_type(expected: Any) -> str:
    if isinstance(expected, list):
        return next((t for t in expected if t != "null"), "object")
    return str(expected)


_REQUIRED_PROPERTY = re.compile(r"^'(.+)' is a required property$")


def _cause(error: jsonschema.ValidationError) -> tuple[str, str]:
    """One schema failure as the apiserver's (field, "Type: detail") for OpenAPI schema errors."""
    base = _field_path(error.absolute_path)
    where = base or "body"
    kind, value, rule = error.validator, error.instance, error.validator_value
    if kind == "required" and isinstance(value, dict):
        # jsonschema reports each missing property as an error of its own, naming it in the
        # message ("'device' is a required property"); the rule lists them all.
        named = _REQUIRED_PROPERTY.match(error.message)
        missing = [named.group(1)] if named else [r for r in rule if r not in value]
        if missing:
            return (f"{base}.{missing[0]}" if base else str(missing[0])), "Required value"
    if kind == "enum":
        allowed = ", ".join(go_value(v) for v in rule)
        return base, f"Unsupported value: {go_value(value)}: supported values: {allowed}"
    if kind == "type":
        given = _json_type(value)
        return (
            base,
            f'Invalid value: "{given}": {where} in body must be of type {_first_type(rule)}: "{given}"',
        )
    if kind in ("oneOf", "anyOf") and all("type" in (s or {}) for s in rule if isinstance(s, dict)):
        wanted = " or ".join(_first_type(s.get("type")) for s in rule if isinstance(s, dict))
        given = _json_type(value)
        return base, f'Invalid value: "{given}": {where} in body must be of type {wanted}: "{given}"'
    bounds = {
        "minimum": f"should be greater than or equal to {rule}",
        "maximum": f"should be less than or equal to {rule}",
        "exclusiveMinimum": f"should be greater than {rule}",
        "exclusiveMaximum": f"should be less than {rule}",
        "pattern": f"should match '{rule}'",
        "minLength": f"should be at least {rule} chars long",
        "minItems": f"should have at least {rule} items",
        "minProperties": f"should have at least {rule} properties",
        "multipleOf": f"should be a multiple of {rule}",
        "uniqueItems": "shouldn't contain duplicates",
        "format": f"must be of type {rule}",
    }
    if kind == "maxLength":
        return base, f"Too long: may not be more than {rule} bytes"
    if kind in ("maxItems", "maxProperties"):
        count = len(value) if isinstance(value, list | dict) else value
        noun = "items" if kind == "maxItems" else "properties"
        return base, f"Too many: {count}: must have at most {rule} {noun}"
    if kind in bounds:
        return base, f"Invalid value: {go_value(value)}: {where} in body {bounds[kind]}"
    return base, f"Invalid value: {go_value(value)}: {error.message}"


def _unknown_keys(error: jsonschema.ValidationError) -> list[str]:
    """Keys an additionalProperties=false failure names (the schema's properties lack them)."""
    schema = error.schema if isinstance(error.schema, dict) else {}
    known = schema.get("properties") or {}
    instance = error.instance if isinstance(error.instance, dict) else {}
    return [k for k in instance if k not in known]


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


def prune(obj: Any, schema: Any, dropped: list[str] | None = None, path: str = "") -> Any:
    """Drop fields the structural schema does not declare (unless it preserves unknown fields).

    The paths of dropped fields are appended to `dropped` (for fieldValidation warnings).
    """
    if not isinstance(schema, dict):
        return obj

    def at(key: str) -> str:
        return f"{path}.{key}" if path else key

    if isinstance(obj, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            props = schema.get("properties") or {}
            return {k: prune(v, props.get(k), dropped, at(k)) for k, v in obj.items()}
        props = schema.get("properties")
        additional = schema.get("additionalProperties")
        if props is not None:
            if dropped is not None:
                dropped.extend(at(k) for k in obj if k not in props)
            return {k: prune(v, props[k], dropped, at(k)) for k, v in obj.items() if k in props}
        if isinstance(additional, dict):
            return {k: prune(v, additional, dropped, at(k)) for k, v in obj.items()}
        if additional is True or schema.get("type") != "object":
            return obj
        if dropped is not None:
            dropped.extend(at(k) for k in obj)
        return {}
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [prune(v, schema["items"], dropped, f"{path}[{i}]") for i, v in enumerate(obj)]
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
def _raw_definitions() -> dict[str, Any]:
    defs: dict[str, Any] = json.loads(_schema_dir().joinpath("_definitions.json").read_text())["$defs"]
    return defs


def _schema_file(group: str, version: str, kind: str) -> Any:
    prefix = group.split(".", 1)[0]
    fname = f"{kind.lower()}-{prefix}-{version}.json" if prefix else f"{kind.lower()}-{version}.json"
    return _schema_dir().joinpath(fname)


@functools.cache
def _kind_schema(group: str, version: str, kind: str) -> Any:
    return json.loads(_schema_file(group, version, kind).read_text())


def _go_type(schema: dict[str, Any]) -> str:
    """The Go type the apiserver's decoder names for a field of this schema."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        return ("*" if name.endswith("Time") else "") + ".".join(name.split(".")[-2:])
    kind = _first_type(schema.get("type"))
    if kind == "integer":
        return str(schema.get("format") or "int64")
    if kind == "number":
        return "float64"
    if kind == "boolean":
        return "bool"
    if kind == "array":
        items = schema.get("items")
        return "[]" + (_go_type(items) if isinstance(items, dict) else "interface {}")
    if kind == "object":
        values = schema.get("additionalProperties")
        return "map[string]" + (_go_type(values) if isinstance(values, dict) else "interface {}")
    return "string"


def _unmarshal_problem(info: ResourceInfo, error: jsonschema.ValidationError) -> str | None:
    """Go's `json: cannot unmarshal ...` for a value of the wrong JSON type in a built-in kind, or None."""
    path = list(error.absolute_path)
    if not path:
        return None
    defs = _raw_definitions()
    schema: Any = _kind_schema(info.group, info.version, info.kind)
    struct = info.kind
    names: list[str] = []
    for part in path:
        while isinstance(schema, dict) and "$ref" in schema:
            name = str(schema["$ref"]).rsplit("/", 1)[-1]
            struct = name.rsplit(".", 1)[-1]
            schema = defs.get(name)
        if not isinstance(schema, dict):
            return None
        if isinstance(part, int):
            schema = schema.get("items")
            continue
        props = schema.get("properties")
        if isinstance(props, dict) and part in props:
            names.append(str(part))
            schema = props[part]
        elif isinstance(schema.get("additionalProperties"), dict):
            schema = schema["additionalProperties"]  # Go names the map field, not its key
        else:
            return None
    if not isinstance(schema, dict):
        return None
    value = error.instance
    given = {dict: "object", list: "array", str: "string", bool: "bool"}.get(type(value), "number")
    if given == "number" and isinstance(value, float):
        given = f"number {value:g}"
    field = f"{struct}.{'.'.join(names)}"
    return f"json: cannot unmarshal {given} into Go struct field {field} of type {_go_type(schema)}"


@functools.cache
def _builtin_validator(group: str, version: str, kind: str) -> Any:
    """The compiled validator of a built-in kind (None when the schema set lacks it), once per process."""
    if not _schema_file(group, version, kind).is_file():
        return None
    schema = _kind_schema(group, version, kind)
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

    def schema_causes(
        self, info: ResourceInfo, obj: dict[str, Any], options: WriteOptions | None = None
    ) -> list[tuple[str, str]]:
        """Schema-check `obj`, dropping unknown fields as `options.field_validation` says.

        Returns the remaining schema failures as (field, message) causes, for the caller to
        join with its value checks into one 422; raises 400 for Strict unknown or duplicate fields.
        Unknown fields are removed from `obj` in place (custom resources: everything their
        structural schema does not declare, as the apiserver prunes).
        """
        options = options or WriteOptions()
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            return [("metadata", "Required value")]
        unknown: list[str] = []
        version = info.version
        if info.custom:
            schema = info.schemas.get(info.version)
            if schema is not None:
                body = {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")}
                pruned = prune(body, schema, unknown)
                apply_schema_defaults(pruned, schema)  # after pruning, before validation, as the apiserver
                for k in list(body):
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
            apply_field_validation(info, version, unknown, options)
            return []
        try:
            errors = sorted(validator.iter_errors(target), key=lambda e: list(map(str, e.absolute_path)))
        except jsonschema.exceptions.SchemaError as exc:
            raise ApiError(500, "InternalError", f"schema of {info.key} is invalid: {exc.message}") from exc
        causes: list[tuple[str, str]] = []
        for error in errors:
            if error.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(
                error.instance, dict
            ):
                base = _field_path(error.absolute_path)
                for key in _unknown_keys(error):
                    unknown.append(f"{base}.{key}" if base else key)
                    del error.instance[key]  # the very mapping inside `obj`
                continue
            if not info.custom and error.validator == "type":
                # A built-in kind's decoder refuses a value of the wrong JSON type before any validation.
                problem = _unmarshal_problem(info, error)
                if problem is not None:
                    raise decoding_error(info.kind, version, [problem])
            causes.append(_cause(error))
        apply_field_validation(info, version, unknown, options)
        return causes if info.custom else causes[:_MAX_CAUSES]

    def validate(self, info: ResourceInfo, obj: dict[str, Any], options: WriteOptions | None = None) -> None:
        """`schema_causes`, raising 422 Invalid for the schema failures (tests and simple callers)."""
        causes = self.schema_causes(info, obj, options)
        if causes:
            name = str((obj.get("metadata") or {}).get("name", ""))
            raise invalid(info.kind, info.group, name, causes)


__all__ = [
    "FIELD_VALIDATIONS",
    "SCHEMA_SET",
    "FieldValidation",
    "Validator",
    "WriteOptions",
    "apply_field_validation",
    "crd_schema_to_jsonschema",
    "decoding_error",
    "duplicate_fields",
    "join_field_errors",
    "prune",
]
