"""Request bodies in the Kubernetes protobuf encoding, decoded into the JSON shape the store takes.

kubectl's typed commands (`create namespace|configmap|secret|deployment|job|pdb|service`, `run`,
the evictions of `drain`) send `Content-Type: application/vnd.kubernetes.protobuf`: the 4-byte magic
`k8s\\x00`, then a `runtime.Unknown` message (1: typeMeta {1: apiVersion, 2: kind}, 2: raw,
3: contentEncoding, 4: contentType) whose `raw` is the object's own message. This module is a
small hand-written decoder of the protobuf wire format plus a table of the messages those
commands fill, field number by field number. Responses stay JSON, which kubectl accepts.

Nothing is dropped silently: a field this table does not know is accepted only when it holds
its zero value (the Go encoder writes every non-pointer field, set or not); one that carries
data, or a kind outside the table, is refused with 415 naming the JSON route
(`kubectl apply -f`, `kubectl create -f`). `status` is dropped on purpose, as the apiserver
resets it on create. Pure: bytes in, dict out.
"""

from __future__ import annotations

import base64
from typing import Any

from gpuhealth.kube.meta import rfc3339_seconds
from gpuhealth.protowire import LEN, WireError, encode_field
from gpuhealth.protowire import Field as WireField
from gpuhealth.protowire import fields as wire_fields
from simulator.apiserver.errors import ApiError, bad_request

PROTOBUF = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"


# Field kinds: "s" string (omitted when empty), "s?" pointer string (kept when empty), "i" int (omitted
# when 0), "i?" pointer int, "b" bool (omitted when false), "b?" pointer bool, "[s]" repeated string,
# "time" metav1.Time, "ios" IntOrString, "map:s" map<string,string>, "map:b" map<string,bytes> (base64
# in JSON), "map:q" map<string,Quantity>, "drop" read and discarded, and message names: "M" one,
# "[M]" repeated.
Field = tuple[str, str]
_MESSAGES: dict[str, dict[int, Field]] = {
    "TypeMeta": {1: ("apiVersion", "s"), 2: ("kind", "s")},
    "Unknown": {
        1: ("typeMeta", "TypeMeta"),
        2: ("raw", "raw"),
        3: ("contentEncoding", "s"),
        4: ("contentType", "s"),
    },
    "ObjectMeta": {
        1: ("name", "s"),
        2: ("generateName", "s"),
        3: ("namespace", "s"),
        4: ("selfLink", "s"),
        5: ("uid", "s"),
        6: ("resourceVersion", "s"),
        7: ("generation", "i"),
        8: ("creationTimestamp", "time"),
        9: ("deletionTimestamp", "time"),
        10: ("deletionGracePeriodSeconds", "i?"),
        11: ("labels", "map:s"),
        12: ("annotations", "map:s"),
        13: ("ownerReferences", "[OwnerReference]"),
        14: ("finalizers", "[s]"),
    },
    "OwnerReference": {
        1: ("kind", "s"),
        3: ("name", "s"),
        4: ("uid", "s"),
        5: ("apiVersion", "s"),
        6: ("controller", "b?"),
        7: ("blockOwnerDeletion", "b?"),
    },
    "LabelSelector": {1: ("matchLabels", "map:s"), 2: ("matchExpressions", "[LabelSelectorRequirement]")},
    "LabelSelectorRequirement": {1: ("key", "s"), 2: ("operator", "s"), 3: ("values", "[s]")},
    "Namespace": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NamespaceSpec"), 3: ("status", "drop")},
    "NamespaceSpec": {1: ("finalizers", "[s]")},
    "ConfigMap": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "map:s"),
        3: ("binaryData", "map:b"),
        4: ("immutable", "b?"),
    },
    "Secret": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "map:b"),
        3: ("type", "s"),
        4: ("stringData", "map:s"),
        5: ("immutable", "b?"),
    },
    "Pod": {1: ("metadata", "ObjectMeta"), 2: ("spec", "PodSpec"), 3: ("status", "drop")},
    "PodTemplateSpec": {1: ("metadata", "ObjectMeta"), 2: ("spec", "PodSpec")},
    "PodSpec": {
        2: ("containers", "[Container]"),
        3: ("restartPolicy", "s"),
        4: ("terminationGracePeriodSeconds", "i?"),
        5: ("activeDeadlineSeconds", "i?"),
        6: ("dnsPolicy", "s"),
        7: ("nodeSelector", "map:s"),
        8: ("serviceAccountName", "s"),
        9: ("serviceAccount", "s"),
        10: ("nodeName", "s"),
        11: ("hostNetwork", "b"),
        12: ("hostPID", "b"),
        13: ("hostIPC", "b"),
        16: ("hostname", "s"),
        17: ("subdomain", "s"),
        19: ("schedulerName", "s"),
        20: ("initContainers", "[Container]"),
        21: ("automountServiceAccountToken", "b?"),
        22: ("tolerations", "[Toleration]"),
        24: ("priorityClassName", "s"),
        25: ("priority", "i?"),
        30: ("enableServiceLinks", "b?"),
    },
    "Container": {
        1: ("name", "s"),
        2: ("image", "s"),
        3: ("command", "[s]"),
        4: ("args", "[s]"),
        5: ("workingDir", "s"),
        6: ("ports", "[ContainerPort]"),
        7: ("env", "[EnvVar]"),
        8: ("resources", "ResourceRequirements"),
        13: ("terminationMessagePath", "s"),
        14: ("imagePullPolicy", "s"),
        16: ("stdin", "b"),
        17: ("stdinOnce", "b"),
        18: ("tty", "b"),
        20: ("terminationMessagePolicy", "s"),
        24: ("restartPolicy", "s?"),
    },
    "ContainerPort": {
        1: ("name", "s"),
        2: ("hostPort", "i"),
        3: ("containerPort", "i"),
        4: ("protocol", "s"),
        5: ("hostIP", "s"),
    },
    "EnvVar": {1: ("name", "s"), 2: ("value", "s")},
    "ResourceRequirements": {1: ("limits", "map:q"), 2: ("requests", "map:q")},
    "Toleration": {
        1: ("key", "s"),
        2: ("operator", "s"),
        3: ("value", "s"),
        4: ("effect", "s"),
        5: ("tolerationSeconds", "i?"),
    },
    "Deployment": {1: ("metadata", "ObjectMeta"), 2: ("spec", "DeploymentSpec"), 3: ("status", "drop")},
    "DeploymentSpec": {
        1: ("replicas", "i?"),
        2: ("selector", "LabelSelector"),
        3: ("template", "PodTemplateSpec"),
        4: ("strategy", "DeploymentStrategy"),
        5: ("minReadySeconds", "i"),
        6: ("revisionHistoryLimit", "i?"),
        7: ("paused", "b"),
        9: ("progressDeadlineSeconds", "i?"),
    },
    "DeploymentStrategy": {1: ("type", "s"), 2: ("rollingUpdate", "RollingUpdateDeployment")},
    "RollingUpdateDeployment": {1: ("maxUnavailable", "ios"), 2: ("maxSurge", "ios")},
    "Job": {1: ("metadata", "ObjectMeta"), 2: ("spec", "JobSpec"), 3: ("status", "drop")},
    "JobSpec": {
        1: ("parallelism", "i?"),
        2: ("completions", "i?"),
        3: ("activeDeadlineSeconds", "i?"),
        4: ("selector", "LabelSelector"),
        5: ("manualSelector", "b?"),
        6: ("template", "PodTemplateSpec"),
        7: ("backoffLimit", "i?"),
        8: ("ttlSecondsAfterFinished", "i?"),
        9: ("completionMode", "s?"),
        10: ("suspend", "b?"),
    },
    "PodDisruptionBudget": {
        1: ("metadata", "ObjectMeta"),
        2: ("spec", "PodDisruptionBudgetSpec"),
        3: ("status", "drop"),
    },
    "PodDisruptionBudgetSpec": {
        1: ("minAvailable", "ios"),
        2: ("selector", "LabelSelector"),
        3: ("maxUnavailable", "ios"),
        4: ("unhealthyPodEvictionPolicy", "s?"),
    },
    "Service": {1: ("metadata", "ObjectMeta"), 2: ("spec", "ServiceSpec"), 3: ("status", "drop")},
    "ServiceSpec": {
        1: ("ports", "[ServicePort]"),
        2: ("selector", "map:s"),
        3: ("clusterIP", "s"),
        4: ("type", "s"),
        5: ("externalIPs", "[s]"),
        7: ("sessionAffinity", "s"),
        10: ("externalName", "s"),
    },
    "ServicePort": {
        1: ("name", "s"),
        2: ("protocol", "s"),
        3: ("port", "i"),
        4: ("targetPort", "ios"),
        5: ("nodePort", "i"),
    },
    "Eviction": {1: ("metadata", "ObjectMeta"), 2: ("deleteOptions", "DeleteOptions")},
    "DeleteOptions": {
        1: ("gracePeriodSeconds", "i?"),
        2: ("preconditions", "Preconditions"),
        3: ("orphanDependents", "b?"),
        4: ("propagationPolicy", "s?"),
        5: ("dryRun", "[s]"),
    },
    "Preconditions": {1: ("uid", "s?"), 2: ("resourceVersion", "s?")},
}

KINDS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "Namespace",
    ("v1", "ConfigMap"): "ConfigMap",
    ("v1", "Secret"): "Secret",
    ("v1", "Pod"): "Pod",
    ("apps/v1", "Deployment"): "Deployment",
    ("batch/v1", "Job"): "Job",
    ("v1", "Service"): "Service",
    ("policy/v1", "PodDisruptionBudget"): "PodDisruptionBudget",
    ("policy/v1", "Eviction"): "Eviction",
}
"""The kinds whose protobuf bodies are decoded: what kubectl's typed commands send."""


class _Undecodable(Exception):
    """Bytes that are not a well-formed protobuf message."""


def _unsupported(what: str) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - {what}; the simulated cluster decodes "
        f"protobuf only for {', '.join(sorted(k for _, k in KINDS))}: send the object as JSON "
        "(kubectl create -f or kubectl apply -f with a manifest; accepted media types include: "
        "application/json)",
    )


def fields(data: bytes) -> list[WireField]:
    """The (field number, wire type, value) triples of one message, in order."""
    try:
        return wire_fields(data)
    except WireError as exc:
        raise _Undecodable(str(exc)) from None


def _is_zero(wire: int, value: int | bytes, depth: int = 0) -> bool:
    """Whether an unknown field holds only its zero value (an unset non-pointer field)."""
    if wire != LEN:
        return value == 0
    assert isinstance(value, bytes)
    if not value:
        return True
    if depth > 32:
        return False
    try:
        return all(_is_zero(w, v, depth + 1) for _, w, v in fields(value))
    except _Undecodable:
        return False


def _signed(value: int) -> int:
    # int32/int64 are plain varints in two's complement over 64 bits.
    return value - (1 << 64) if value >= 1 << 63 else value


def _text(value: int | bytes, where: str) -> str:
    if not isinstance(value, bytes):
        raise _Undecodable(f"{where}: expected a length-delimited field")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Undecodable(f"{where}: not UTF-8") from exc


def _map_entry(value: int | bytes, where: str) -> tuple[str, int | bytes | None]:
    if not isinstance(value, bytes):
        raise _Undecodable(f"{where}: expected a map entry")
    key, item = "", None
    for number, _, v in fields(value):
        if number == 1:
            key = _text(v, where)
        elif number == 2:
            item = v
    return key, item


def _time(value: int | bytes, where: str) -> str | None:
    if not isinstance(value, bytes):
        raise _Undecodable(f"{where}: expected a Time message")
    seconds = 0
    for number, _, v in fields(value):
        if number == 1 and isinstance(v, int):
            seconds = _signed(v)
    if seconds == 0:
        return None
    return rfc3339_seconds(seconds)


def _int_or_string(value: int | bytes, where: str) -> int | str:
    if not isinstance(value, bytes):
        raise _Undecodable(f"{where}: expected an IntOrString message")
    kind, number, text = 0, 0, ""
    for n, _, v in fields(value):
        if n == 1 and isinstance(v, int):
            kind = v
        elif n == 2 and isinstance(v, int):
            number = _signed(v)
        elif n == 3:
            text = _text(v, where)
    return text if kind == 1 else number


def decode_message(name: str, data: bytes, where: str = "") -> dict[str, Any]:
    """One message of the table as its JSON object; _Undecodable or ApiError 415 on what it cannot take."""
    schema = _MESSAGES[name]
    out: dict[str, Any] = {}
    for number, wire, value in fields(data):
        spec = schema.get(number)
        if spec is None:
            if _is_zero(wire, value):
                continue
            raise _unsupported(f"field {number} of {name} ({where or 'object'}) is not decoded")
        json_name, kind = spec
        path = f"{where}.{json_name}" if where else json_name
        if kind == "drop":
            continue
        if kind.startswith("[") and kind != "[s]":
            out.setdefault(json_name, []).append(decode_message(kind[1:-1], _bytes(value, path), path))
        elif kind == "[s]":
            out.setdefault(json_name, []).append(_text(value, path))
        elif kind.startswith("map:"):
            key, item = _map_entry(value, path)
            target = out.setdefault(json_name, {})
            if kind == "map:s":
                target[key] = _text(item if item is not None else b"", path)
            elif kind == "map:b":
                target[key] = base64.b64encode(_bytes(item if item is not None else b"", path)).decode()
            else:
                quantity = decode_quantity(_bytes(item if item is not None else b"", path))
                target[key] = quantity
        elif kind in ("s", "s?", "raw"):
            if kind == "raw":
                out[json_name] = _bytes(value, path)
                continue
            text = _text(value, path)
            if text or kind == "s?":
                out[json_name] = text
        elif kind in ("i", "i?"):
            if not isinstance(value, int):
                raise _Undecodable(f"{path}: expected a varint")
            if value or kind == "i?":
                out[json_name] = _signed(value)
        elif kind in ("b", "b?"):
            if not isinstance(value, int):
                raise _Undecodable(f"{path}: expected a varint")
            if value or kind == "b?":
                out[json_name] = bool(value)
        elif kind == "time":
            stamp = _time(value, path)
            if stamp is not None:
                out[json_name] = stamp
        elif kind == "ios":
            out[json_name] = _int_or_string(value, path)
        else:
            out[json_name] = decode_message(kind, _bytes(value, path), path)
    return out


def _bytes(value: int | bytes, where: str) -> bytes:
    if not isinstance(value, bytes):
        raise _Undecodable(f"{where}: expected a length-delimited field")
    return value


def decode_quantity(data: bytes) -> str:
    for number, _, value in fields(data):
        if number == 1:
            return _text(value, "quantity")
    return "0"


def decode_body(body: bytes) -> dict[str, Any]:
    """A protobuf request body as the JSON object it encodes (apiVersion and kind included).

    400 BadRequest for bytes that are not the Kubernetes protobuf envelope; 415 for a kind or a
    field this decoder does not take (the message names the JSON route).
    """
    if not body.startswith(MAGIC):
        raise bad_request("the protobuf body does not start with the Kubernetes magic prefix k8s\\x00")
    try:
        envelope = decode_message("Unknown", body[len(MAGIC) :])
        type_meta = envelope.get("typeMeta") or {}
        api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
        if envelope.get("contentEncoding"):
            raise _unsupported(f"content encoding {envelope['contentEncoding']!r} is not supported")
        if envelope.get("contentType", PROTOBUF) != PROTOBUF:
            raise _unsupported(f"content type {envelope['contentType']!r} inside the envelope")
        message = KINDS.get((api_version, kind))
        if message is None:
            raise _unsupported(
                f"no protobuf decoder for {kind or 'an untyped object'} ({api_version or '?'})"
            )
        obj = decode_message(message, envelope.get("raw", b""))
    except _Undecodable as exc:
        raise bad_request(f"unable to decode the protobuf body: {exc}") from exc
    return {"apiVersion": api_version, "kind": kind, **obj}


# ---- encoding, for tests and fixtures -----------------------------------------------------------------


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    """A request body: the magic prefix and a runtime.Unknown around the object's bytes."""
    type_meta = encode_field(1, api_version) + encode_field(2, kind)
    return (
        MAGIC + encode_field(1, type_meta) + encode_field(2, raw) + encode_field(3, "") + encode_field(4, "")
    )
