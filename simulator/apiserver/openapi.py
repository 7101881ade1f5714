"""The OpenAPI documents of the simulated cluster: `/openapi/v2`, and `/openapi/v3` per group/version.

kubectl reads them for three things: whether the server does field validation itself (a PATCH
operation of the kind carrying a `fieldValidation` query parameter; otherwise kubectl validates
client-side or refuses without `--validate=false`), strategic-merge patch metadata for `apply`
(`x-kubernetes-patch-strategy` and `-merge-key` on the kind's schema), and `kubectl explain`
(the kind's schema found by `x-kubernetes-group-version-kind`).

Nothing upstream is committed: the documents are built, on first request and cached, from the
Kubernetes 1.37 definitions the kubernetes-validate package carries (the same ones writes are
validated against), converted from its JSON Schema form back to OpenAPI (single types, `$ref`
into `components/schemas` or `definitions`, no `additionalProperties: false`), plus the served
CustomResourceDefinitions' `openAPIV3Schema`. A group/version document holds the paths of the
resources served there and the schemas they reach, as the real apiserver's do.

Deliberately left out: the protobuf encodings (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`
and the v3 one) are answered 406 NotAcceptable when the client accepts nothing else; kubectl
1.27 and later read v3 JSON and need v2 only when v3 is missing.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.resources
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from simulator.apiserver.errors import ApiError
from simulator.apiserver.resources import CRD_KEY, ResourceInfo
from simulator.apiserver.store import Store
from simulator.apiserver.validation import SCHEMA_SET
from simulator.apiserver.versions import KubernetesVersion

OPENAPI_JSON = "application/json"
_V3_REF = "#/components/schemas/"
_V2_REF = "#/definitions/"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_LIST_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
_STATUS = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"
_DELETE_OPTIONS = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions"
_PATCH = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch"
_PATCH_TYPES = (
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
)

# Query parameters of writes, as the real apiserver lists them: kubectl looks for fieldValidation.
_WRITE_PARAMS = (
    ("dryRun", "When present, indicates that modifications should not be persisted."),
    (
        "fieldManager",
        "fieldManager is a name associated with the actor or entity that is making these changes.",
    ),
    (
        "fieldValidation",
        "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) "
        "containing unknown or duplicate fields. Valid values are: Ignore, Warn, Strict.",
    ),
)
_LIST_PARAMS = (
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
)


def accepts(accept: str | None, *media: str) -> bool:
    """Whether the Accept header takes one of `media` (or anything, via */* or application/*)."""
    if not accept:
        return True
    for part in accept.split(","):
        token = part.split(";", 1)[0].strip().lower()
        if token in media or token in ("*/*", "application/*"):
            return True
    return False


def not_acceptable(offered: str) -> ApiError:
    return ApiError(406, "NotAcceptable", f"only the following media types are accepted: {offered}")


# ---- the 1.37 definitions as OpenAPI ----------------------------------------------------------------


@functools.cache
def _json_schema_definitions() -> dict[str, Any]:
    path = (
        importlib.resources.files("kubernetes_validate")
        .joinpath("kubernetes-json-schema")
        .joinpath(SCHEMA_SET)
        .joinpath("_definitions.json")
    )
    defs: dict[str, Any] = orjson.loads(path.read_bytes())["$defs"]
    return defs


def _to_openapi(schema: Any, ref_prefix: str, wrap_refs: bool) -> Any:
    """A JSON Schema from the definitions as OpenAPI: single `type`, refs retargeted, strictness dropped."""
    if isinstance(schema, list):
        return [_to_openapi(s, ref_prefix, wrap_refs) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = ref_prefix + value.rsplit("/", 1)[-1]
        elif key == "type" and isinstance(value, list):
            kinds = [t for t in value if t != "null"]
            if kinds:
                out[key] = kinds[0]
        elif key == "additionalProperties" and value is False:
            continue  # the strict set's addition; unknown fields are the server's to refuse
        elif key == "properties" and isinstance(value, dict):
            out[key] = {k: _to_openapi(v, ref_prefix, wrap_refs) for k, v in value.items()}
        else:
            out[key] = _to_openapi(value, ref_prefix, wrap_refs)
    if "$ref" in out and len(out) > 1 and wrap_refs:
        # OpenAPI 3.0 ignores siblings of $ref: the apiserver wraps the reference in allOf.
        out["allOf"] = [{"$ref": out.pop("$ref")}]
    return out


def _definition(name: str, schema: dict[str, Any], ref_prefix: str, wrap_refs: bool) -> dict[str, Any]:
    if name in (
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
        "io.k8s.apimachinery.pkg.api.resource.Quantity",
    ):
        fmt = "int-or-string" if name.endswith("IntOrString") else ""
        out: dict[str, Any] = {"description": schema.get("description", ""), "type": "string"}
        if fmt:
            out["format"] = fmt
        return out
    converted: dict[str, Any] = _to_openapi(schema, ref_prefix, wrap_refs)
    for field in ("apiVersion", "kind"):
        prop = (converted.get("properties") or {}).get(field)
        if isinstance(prop, dict):
            prop.pop("enum", None)  # the schema set pins them; the real documents do not
    return converted


@functools.cache
def builtin_schemas(version: int) -> dict[str, dict[str, Any]]:
    """Every 1.37 definition in OpenAPI v2 (`version=2`) or v3 form, converted once per process."""
    prefix, wrap = (_V2_REF, False) if version == 2 else (_V3_REF, True)
    return {name: _definition(name, s, prefix, wrap) for name, s in _json_schema_definitions().items()}


@functools.cache
def _gvk_index() -> dict[tuple[str, str, str], str]:
    index: dict[tuple[str, str, str], str] = {}
    for name, schema in _json_schema_definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or ():
            index[(gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", ""))] = name
    return index


def _refs(schema: Any, prefix: str) -> Iterable[str]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str) and value.startswith(prefix):
                yield value[len(prefix) :]
            else:
                yield from _refs(value, prefix)
    elif isinstance(schema, list):
        for item in schema:
            yield from _refs(item, prefix)


def _closure(roots: Iterable[str], schemas: dict[str, dict[str, Any]], prefix: str) -> dict[str, Any]:
    """The named schemas and every schema they reach through references."""
    out: dict[str, Any] = {}
    pending = [r for r in roots if r in schemas]
    while pending:
        name = pending.pop()
        if name in out:
            continue
        out[name] = schemas[name]
        pending.extend(r for r in _refs(schemas[name], prefix) if r in schemas and r not in out)
    return out


# ---- custom resources --------------------------------------------------------------------------------


def crd_schema_name(info: ResourceInfo, version: str) -> str:
    """The component name of a custom resource's schema: reversed group, version, kind (as real)."""
    return ".".join([*reversed(info.group.split(".")), version, info.kind])


def _crd_schema(info: ResourceInfo, version: str, ref_prefix: str, wrap_refs: bool) -> dict[str, Any]:
    schema: dict[str, Any] = copy.deepcopy(info.schemas.get(version) or {"type": "object"})
    schema.setdefault("type", "object")
    props = schema.setdefault("properties", {})
    props["apiVersion"] = {
        "type": "string",
        "description": "APIVersion defines the versioned schema of this representation of an object.",
    }
    props["kind"] = {
        "type": "string",
        "description": "Kind is a string value representing the REST resource this object represents.",
    }
    meta_ref = {"$ref": ref_prefix + _OBJECT_META}
    props["metadata"] = (
        {"allOf": [meta_ref], "description": "Standard object's metadata."}
        if wrap_refs
        else {**meta_ref, "description": "Standard object's metadata."}
    )
    schema["x-kubernetes-group-version-kind"] = [{"group": info.group, "version": version, "kind": info.kind}]
    return schema


def _open_schema(info: ResourceInfo, version: str) -> dict[str, Any]:
    return {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "x-kubernetes-group-version-kind": [{"group": info.group, "version": version, "kind": info.kind}],
    }


def _crd_list_schema(info: ResourceInfo, version: str, ref_prefix: str) -> dict[str, Any]:
    return {
        "description": f"{info.kind}List is a list of {info.kind}",
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string"},
            "items": {"type": "array", "items": {"$ref": ref_prefix + crd_schema_name(info, version)}},
            "kind": {"type": "string"},
            "metadata": {"$ref": ref_prefix + _LIST_META},
        },
        "x-kubernetes-group-version-kind": [
            {"group": info.group, "version": version, "kind": info.list_kind()}
        ],
    }


# ---- paths -------------------------------------------------------------------------------------------


def _camel(text: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in text.replace("-", ".").split(".") if part)


def _operation_id(verb: str, info: ResourceInfo, version: str, namespaced: bool, suffix: str = "") -> str:
    group = "Core" if not info.group else _camel(info.group.removesuffix(".k8s.io"))
    scope = "Namespaced" if namespaced else ""
    return f"{verb}{group}{_camel(version)}{scope}{info.kind}{suffix}"


class _PathBuilder:
    """Operations of one resource in one OpenAPI version."""

    def __init__(
        self, openapi: int, info: ResourceInfo, version: str, kind_schema: str, list_schema: str | None
    ) -> None:
        self.v2 = openapi == 2
        self.prefix = _V2_REF if self.v2 else _V3_REF
        self.info = info
        self.version = version
        self.kind_schema = kind_schema
        self.list_schema = list_schema or kind_schema
        self.gvk = {"group": info.group, "version": version, "kind": info.kind}

    def _param(self, name: str, where: str, description: str = "", required: bool = False) -> dict[str, Any]:
        param: dict[str, Any] = {"name": name, "in": where, "description": description}
        if required:
            param["required"] = True
        if self.v2:
            param["type"] = "string"
            param["uniqueItems"] = True
        else:
            param["schema"] = {"type": "string", "uniqueItems": True}
        return param

    def _ref(self, name: str) -> dict[str, Any]:
        return {"$ref": self.prefix + name}

    def op(
        self,
        verb: str,
        action: str,
        namespaced: bool,
        *,
        body: str | None,
        response: str,
        params: Iterable[dict[str, Any]] = (),
        suffix: str = "",
        consumes: tuple[str, ...] = ("*/*",),
    ) -> dict[str, Any]:
        operation: dict[str, Any] = {
            "description": f"{action} {self.info.kind}",
            "operationId": _operation_id(verb, self.info, self.version, namespaced, suffix),
            "tags": [
                _camel(self.info.group.removesuffix(".k8s.io")) + "_" + self.version
                if self.info.group
                else "core_" + self.version
            ],
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": dict(self.gvk),
        }
        parameters = list(params)
        ok = "201" if action == "post" else "200"
        if self.v2:
            operation["consumes"] = list(consumes)
            operation["produces"] = [
                "application/json",
                "application/yaml",
                "application/vnd.kubernetes.protobuf",
            ]
            if body is not None:
                parameters.insert(
                    0, {"in": "body", "name": "body", "required": True, "schema": self._ref(body)}
                )
            operation["responses"] = {
                ok: {"description": "OK", "schema": self._ref(response)},
                "401": {"description": "Unauthorized"},
            }
        else:
            if body is not None:
                operation["requestBody"] = {
                    "content": {c: {"schema": self._ref(body)} for c in consumes},
                    "required": True,
                }
            operation["responses"] = {
                ok: {"description": "OK", "content": {"application/json": {"schema": self._ref(response)}}},
                "401": {"description": "Unauthorized"},
            }
        if parameters:
            operation["parameters"] = parameters
        return operation

    def paths(self) -> dict[str, dict[str, Any]]:
        info, version = self.info, self.version
        base = f"/apis/{info.group}/{version}" if info.group else f"/api/{version}"
        writes = [self._param(n, "query", d) for n, d in _WRITE_PARAMS]
        lists = [self._param(n, "query") for n in _LIST_PARAMS]
        pretty = [self._param("pretty", "query", "If 'true', then the output is pretty printed.")]
        out: dict[str, dict[str, Any]] = {}
        scoped = info.namespaced
        collection = f"{base}/namespaces/{{namespace}}/{info.plural}" if scoped else f"{base}/{info.plural}"
        scope_params = (
            [
                self._param(
                    "namespace", "path", "object name and auth scope, such as for teams and projects", True
                )
            ]
            if scoped
            else []
        )
        name_param = [self._param("name", "path", f"name of the {info.kind}", True)]
        out[collection] = {
            "get": self.op("list", "list", scoped, body=None, response=self.list_schema, params=lists),
            "post": self.op(
                "create", "post", scoped, body=self.kind_schema, response=self.kind_schema, params=writes
            ),
            "delete": self.op(
                "deletecollection",
                "deletecollection",
                scoped,
                body=_DELETE_OPTIONS,
                response=_STATUS,
                params=lists,
            ),
            "parameters": scope_params + pretty,
        }
        item = f"{collection}/{{name}}"
        out[item] = {
            "get": self.op("read", "get", scoped, body=None, response=self.kind_schema),
            "put": self.op(
                "replace", "put", scoped, body=self.kind_schema, response=self.kind_schema, params=writes
            ),
            "patch": self.op(
                "patch",
                "patch",
                scoped,
                body=_PATCH,
                response=self.kind_schema,
                params=[*writes, self._param("force", "query")],
                consumes=_PATCH_TYPES,
            ),
            "delete": self.op("delete", "delete", scoped, body=_DELETE_OPTIONS, response=_STATUS),
            "parameters": name_param + scope_params + pretty,
        }
        if info.has_status:
            out[f"{item}/status"] = {
                "get": self.op("read", "get", scoped, body=None, response=self.kind_schema, suffix="Status"),
                "put": self.op(
                    "replace",
                    "put",
                    scoped,
                    body=self.kind_schema,
                    response=self.kind_schema,
                    params=writes,
                    suffix="Status",
                ),
                "patch": self.op(
                    "patch",
                    "patch",
                    scoped,
                    body=_PATCH,
                    response=self.kind_schema,
                    params=writes,
                    suffix="Status",
                    consumes=_PATCH_TYPES,
                ),
                "parameters": name_param + scope_params + pretty,
            }
        if scoped:
            out[f"{base}/{info.plural}"] = {
                "get": self.op(
                    "list",
                    "list",
                    False,
                    body=None,
                    response=self.list_schema,
                    params=lists,
                    suffix="ForAllNamespaces",
                ),
                "parameters": pretty,
            }
        return out


# ---- the documents -----------------------------------------------------------------------------------

CrdLookup = Callable[[str], tuple[int, dict[str, Any]] | None]
"""resource key -> (resourceVersion, CRD object) of a custom resource's definition, or None."""


def _served(
    infos: Iterable[ResourceInfo], openapi: int, only_version: str | None = None
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Paths and schemas for the given resources (every served version, or `only_version`)."""
    builtin = builtin_schemas(openapi)
    prefix, wrap = (_V2_REF, False) if openapi == 2 else (_V3_REF, True)
    paths: dict[str, dict[str, Any]] = {}
    extra: dict[str, Any] = {}
    roots = [_STATUS, _DELETE_OPTIONS, _PATCH]
    for info in infos:
        for version in info.versions:
            if only_version is not None and version != only_version:
                continue
            if info.custom:
                kind_name = crd_schema_name(info, version)
                list_name = kind_name + "List"
                extra[kind_name] = _crd_schema(info, version, prefix, wrap)
                extra[list_name] = _crd_list_schema(info, version, prefix)
                roots += [_OBJECT_META, _LIST_META]
            else:
                found = _gvk_index().get((info.group, version, info.kind))
                if found is None:
                    # A kind this schema set lacks still needs its PATCH operation: without one
                    # kubectl refuses to apply it ("Path not found for GVK"). Described as open.
                    kind_name = crd_schema_name(info, version)
                    extra[kind_name] = _open_schema(info, version)
                    list_name = kind_name
                else:
                    kind_name = found
                    list_name = _gvk_index().get((info.group, version, info.list_kind()), kind_name)
                roots += [kind_name, list_name]
            paths.update(_PathBuilder(openapi, info, version, kind_name, list_name).paths())
    schemas = _closure(roots, builtin, prefix)
    for schema in extra.values():
        schemas.update(_closure(_refs(schema, prefix), builtin, prefix))
    schemas.update(extra)
    return paths, dict(sorted(schemas.items()))


def _info(version: str) -> dict[str, Any]:
    return {"title": "Kubernetes", "version": version}


def group_version_path(group: str, version: str) -> str:
    """The key of a group/version in the v3 discovery document ("api/v1", "apis/batch/v1")."""
    return f"apis/{group}/{version}" if group else f"api/{version}"


class OpenApiDocs:
    """The OpenAPI documents of the resources served now, rebuilt only when the served set changes.

    `fingerprint` names the served resources and their CRDs' resourceVersions; a document built
    for one fingerprint is reused (as bytes) until a CRD comes, goes or changes.
    """

    def __init__(self, kubernetes_version: str = KubernetesVersion().info()["gitVersion"]) -> None:
        self.kubernetes_version = kubernetes_version
        self._cache: dict[tuple[Any, ...], bytes] = {}

    def _cached(self, key: tuple[Any, ...], build: Callable[[], Any]) -> bytes:
        data = self._cache.get(key)
        if data is None:
            if len(self._cache) > 256:
                self._cache.clear()
            data = orjson.dumps(build())
            self._cache[key] = data
        return data

    @staticmethod
    def fingerprint(infos: Iterable[ResourceInfo], crd_rv: Callable[[str], int]) -> tuple[Any, ...]:
        return tuple(sorted((i.key, i.versions, crd_rv(i.key) if i.custom else 0) for i in infos))

    def v2(self, infos: list[ResourceInfo], crd_rv: Callable[[str], int]) -> bytes:
        def build() -> dict[str, Any]:
            paths, schemas = _served(infos, 2)
            return {
                "swagger": "2.0",
                "info": _info(self.kubernetes_version),
                "paths": dict(sorted(paths.items())),
                "definitions": schemas,
            }

        return self._cached(("v2", self.fingerprint(infos, crd_rv)), build)

    def v3_document(self, version: str, infos: list[ResourceInfo], crd_rv: Callable[[str], int]) -> bytes:
        """The document of one group/version: `infos` are the resources served there."""

        def build() -> dict[str, Any]:
            paths, schemas = _served(infos, 3, version)
            return {
                "openapi": "3.0.0",
                "info": _info(self.kubernetes_version),
                "paths": dict(sorted(paths.items())),
                "components": {"schemas": schemas},
            }

        return self._cached(("v3", version, self.fingerprint(infos, crd_rv)), build)

    # -- what the HTTP layer calls

    def serve_v2(self, store: Store, accept: str | None) -> bytes:
        """`/openapi/v2` as JSON; 406 for a client that takes only the protobuf encoding."""
        if not accepts(accept, OPENAPI_JSON):
            raise not_acceptable(OPENAPI_JSON)
        return self.v2(store.registry.all(), _crd_rv(store))

    def serve_v3(self, store: Store, path: str, accept: str | None) -> bytes:
        """`/openapi/v3` (path "") or one group/version document ("api/v1", "apis/batch/v1")."""
        if not accepts(accept, OPENAPI_JSON):
            raise not_acceptable(OPENAPI_JSON)
        served = _group_versions(store)
        crd_rv = _crd_rv(store)
        if not path:
            paths: dict[str, Any] = {}
            for gv_path, (version, infos) in sorted(served.items()):
                digest = hashlib.sha512(self.v3_document(version, infos, crd_rv)).hexdigest().upper()
                paths[gv_path] = {"serverRelativeURL": f"/openapi/v3/{gv_path}?hash={digest}"}
            return orjson.dumps({"paths": paths})
        found = served.get(path)
        if found is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return self.v3_document(found[0], found[1], crd_rv)


def _group_versions(store: Store) -> dict[str, tuple[str, list[ResourceInfo]]]:
    registry = store.registry
    out = {group_version_path("", "v1"): ("v1", registry.in_group_version("", "v1"))}
    for group, versions in registry.groups():
        for version in versions:
            out[group_version_path(group, version)] = (version, registry.in_group_version(group, version))
    return out


def _crd_rv(store: Store) -> Callable[[str], int]:
    def rv(key: str) -> int:
        try:
            return store.get_entry(CRD_KEY, key).rv
        except ApiError:
            return 0

    return rv
