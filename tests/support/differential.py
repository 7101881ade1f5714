"""One list of requests sent to two control planes, and what their answers have in common.

The simulated apiserver (`simulator.apiserver`) claims to answer as kube-apiserver does for
what gpuhealth, kubectl and the official client send. `tests/controlplane/test_differential.py`
holds it to that: each `Step` is sent, in order, to both, and the answers are reduced to what a
client reads (`Answer`: the status code, a Status's reason and details, and the fields a step
names); any difference is a divergence, which is fixed or listed (with its reason) in
`docs/simulator.md`.

A step's path and body may use `{ns}` (the step list's namespace) and `{uid:NAME}` /
`{rv:NAME}` (the uid or resourceVersion an earlier step named NAME answered with on the same
plane): the two planes make their own uids and versions, and a flow must read its own.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import ApiClient

JSON = "application/json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


@dataclass(frozen=True)
class Step:
    """One request, and which fields of its answer must agree beyond the code and reason."""

    name: str
    method: str
    path: str
    body: Any = None
    params: Sequence[tuple[str, str]] = ()
    content_type: str = JSON
    fields: Sequence[str] = ()
    """Dotted paths into the answer's body (`metadata.name`, `spec.tolerations`, `items.#`: a length)."""
    message: bool = False
    """Compare the Status message too (after `{ns}`, uids and versions are blanked)."""
    accept: str = JSON
    until: int | None = None
    """Send again (every 0.2 s, for at most 30 s) until the code is this one: what a client waits
    for, such as a namespace's `default` ServiceAccount, which the real controller-manager makes
    a moment after the namespace."""


@dataclass(frozen=True)
class Answer:
    code: int
    reason: str = ""
    details: tuple[tuple[str, Any], ...] = ()
    fields: tuple[tuple[str, Any], ...] = ()
    message: str = ""


@dataclass
class Plane:
    """One control plane as a client sees it: an ApiClient and what its earlier steps answered."""

    name: str
    api: ApiClient
    namespace: str
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)

    def fill(self, text: str) -> str:
        def ref(match: re.Match[str]) -> str:
            kind, step = match.group(1), match.group(2)
            body = self.seen.get(step) or {}
            meta = body.get("metadata") or {}
            return str(meta.get("uid" if kind == "uid" else "resourceVersion", ""))

        return re.sub(r"\{(uid|rv):([\w-]+)\}", ref, text.replace("{ns}", self.namespace))


def _fill(value: Any, plane: Plane) -> Any:
    if isinstance(value, str):
        return plane.fill(value)
    if isinstance(value, Mapping):
        return {k: _fill(v, plane) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, plane) for v in value]
    return value


def send(plane: Plane, step: Step) -> tuple[int, dict[str, Any]]:
    """The raw status and decoded body of `step` on `plane` (any status: errors are answers here)."""
    body = _fill(step.body, plane)
    if body is None:
        data = None
    elif isinstance(body, str):
        data = body.encode()
    else:
        data = json.dumps(body).encode()
    headers = {"Accept": step.accept}
    if data is not None:
        headers["Content-Type"] = step.content_type
    method, url, headers, _, _ = plane.api.param_serialize(
        method=step.method,
        resource_path=plane.fill(step.path),
        query_params=[(k, plane.fill(v)) for k, v in step.params],
        header_params=headers,
        auth_settings=["BearerToken"],
    )
    pool = plane.api.rest_client.pool_manager
    raw = pool.request(method, url, body=data, headers=headers, timeout=30.0, retries=False)
    try:
        decoded = json.loads(raw.data) if raw.data else {}
    except ValueError:
        decoded = {"_text": raw.data.decode(errors="replace")[:200]}
    if not isinstance(decoded, dict):
        decoded = {"_value": decoded}
    plane.seen[step.name] = decoded
    return raw.status, decoded


_PART = re.compile(r"\[([^\]]+)\]|([^.\[]+)")


def _path(body: Any, dotted: str) -> Any:
    """The value at `dotted`: dot-separated keys, list indexes, `#` for a length, and `[key]` for a
    key with dots of its own (`metadata.annotations[gpuhealth.io/quarantined-devices]`)."""
    value = body
    for bracketed, plain in _PART.findall(dotted):
        part = bracketed or plain
        if part == "#":
            return len(value) if isinstance(value, list | dict) else None
        if isinstance(value, list):
            try:
                value = value[int(part)]
            except (ValueError, IndexError):
                return None
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            return None
    return value


_VOLATILE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|(?<=record \()\d+(?=\))|\b\d{3,}\b"
)


def answer(plane: Plane, step: Step, code: int, body: dict[str, Any]) -> Answer:
    """What a client reads of an answer, with each plane's own names and numbers blanked."""
    is_status = body.get("kind") == "Status"
    details: tuple[tuple[str, Any], ...] = ()
    reason = ""
    message = ""
    if is_status:
        reason = str(body.get("reason", ""))
        raw_details = body.get("details") or {}
        causes = tuple(
            sorted(
                (str(c.get("reason", "")), str(c.get("field", ""))) for c in raw_details.get("causes") or ()
            )
        )
        details = (
            ("kind", raw_details.get("kind")),
            ("group", raw_details.get("group")),
            ("name", raw_details.get("name")),
            ("causes", causes),
        )
        if step.message:
            message = _VOLATILE.sub("#", str(body.get("message", "")).replace(plane.namespace, "{ns}"))
    fields = tuple((f, _normalise(_path(body, f), plane)) for f in step.fields)
    return Answer(code, reason, details, fields, message)


def _normalise(value: Any, plane: Plane) -> Any:
    text = json.dumps(value, sort_keys=True)
    return json.loads(text.replace(plane.namespace, "{ns}"))


def run(plane: Plane, steps: Sequence[Step]) -> dict[str, Answer]:
    out: dict[str, Answer] = {}
    for step in steps:
        code, body = send(plane, step)
        deadline = time.monotonic() + 30.0
        while step.until is not None and code != step.until and time.monotonic() < deadline:
            time.sleep(0.2)
            code, body = send(plane, step)
        out[step.name] = answer(plane, step, code, body)
    return out


def differences(a: Mapping[str, Answer], b: Mapping[str, Answer]) -> dict[str, str]:
    """Step name -> a line saying how the two answers differ."""
    out: dict[str, str] = {}
    for name, left in a.items():
        right = b[name]
        if left == right:
            continue
        parts = []
        for attribute in ("code", "reason", "details", "fields", "message"):
            lv, rv = getattr(left, attribute), getattr(right, attribute)
            if lv != rv:
                parts.append(f"{attribute}: {lv!r} != {rv!r}")
        out[name] = "; ".join(parts)
    return out
