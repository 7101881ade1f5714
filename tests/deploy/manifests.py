"""Building the manifests under deploy/ and checking objects against CRD schemas, for the deploy tests."""

from __future__ import annotations

import copy
import functools
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBECTL = Path(sys.executable).parent / "kubectl"
OVERLAYS = ("dry-run", "enforcing", "privileged", "no-operator")
NAMESPACE = "gpuhealth-system"
SCHEMAS = Path(__file__).parent / "schemas"
CRD_FILE = DEPLOY / "crds" / "devicequarantines.gpuhealth.io.yaml"


class _Loader(yaml.SafeLoader):
    """YAML as Go reads it: kustomize writes a bare `=` (a matchType), which is YAML 1.1's
    `value` tag to PyYAML and a plain string to kubectl."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def load_all(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc]


def kustomize(path: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize PATH` as objects; AssertionError with kustomize's message on failure."""
    done = subprocess.run(
        [str(KUBECTL), "kustomize", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed: {done.stderr.strip()}")
    return load_all(done.stdout)


@functools.cache
def _built(overlay: str) -> str:
    done = subprocess.run(
        [str(KUBECTL), "kustomize", str(DEPLOY / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize deploy/overlays/{overlay} failed: {done.stderr.strip()}")
    return done.stdout


def build(overlay: str) -> list[dict[str, Any]]:
    """The objects an overlay installs (a fresh copy each call; kustomize runs once per overlay)."""
    return load_all(_built(overlay))


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    [only] = workload["spec"]["template"]["spec"]["containers"]
    return only


def local_args(
    spec: dict[str, Any],
    *,
    downward: dict[str, str],
    mounts: dict[str, Path],
    port: int,
    swaps: dict[str, str],
) -> list[str]:
    """A container's args as the pod would run them, with loopback and local stand-ins."""
    env: dict[str, str] = {}
    for var in spec.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            env[var["name"]] = downward[var["valueFrom"]["fieldRef"]["fieldPath"]]
    mounted = {m["mountPath"]: m for m in spec.get("volumeMounts", [])}
    assert set(mounts) == set(mounted), f"stand-ins for {sorted(mounts)}, mounts {sorted(mounted)}"
    out = []
    for arg in spec["args"]:
        arg = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)
        flag, _, value = arg.partition("=")
        if flag == "--listen":
            value = f"127.0.0.1:{port}"
        elif flag in swaps:
            value = swaps[flag]
        elif value.startswith("/"):
            [mount] = [m for m in mounted if value.startswith(m.rstrip("/") + "/")] or [None]
            assert mount is not None, f"{arg}: not under any volume mount of the container"
            value = str(mounts[mount] / value.removeprefix(mount.rstrip("/") + "/"))
        out.append(f"{flag}={value}" if value else flag)
    return out


# ----- schemas -------------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """An OpenAPI v3 structural schema as JSON Schema that refuses unknown fields."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    strict = _strict(copy.deepcopy(schema))
    return jsonschema.Draft202012Validator(
        strict, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


@functools.cache
def operator_schemas() -> dict[str, Any]:
    doc = yaml.safe_load((SCHEMAS / "prometheus-operator.yaml").read_text())
    schemas: dict[str, Any] = doc["schemas"]
    return schemas


def crd_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]
    return schema


def schema_errors(obj: dict[str, Any], schema: dict[str, Any]) -> Iterator[str]:
    for error in validator(schema).iter_errors(obj):
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        yield f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}: {where}: {error.message}"
