"""Value validation of API clients' writes: what the apiserver's strategies check beyond the schema.

Pure functions from objects to field errors, `(field path, "Type: detail")` pairs worded as the
apiserver words them (`metadata.name: Invalid value: "Bad_Pod": a lowercase RFC 1123
subdomain must consist of ...`); the store joins them into one 422 Invalid. Covered per kind
(by registry key): object names (DNS-1123 subdomain, or label for Namespaces), label and
annotation syntax, Pods (containers, images, enums, ports, resources, tolerations), pod
templates of the workload kinds, Deployments/ReplicaSets/StatefulSets/Jobs (selectors,
counts), ConfigMaps/Secrets (keys), PodDisruptionBudgets, Leases, Nodes' taints,
DeviceTaintRules; on update the fields the apiserver holds immutable (a pod's spec apart from
images, activeDeadlineSeconds, added tolerations and terminationGracePeriodSeconds; a Job's
selector, template and completions; a ResourceClaim's spec; an immutable ConfigMap's or
Secret's data). Quantities that do not parse are a decoding error (400), as in the apiserver.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from decimal import Decimal, InvalidOperation
from typing import Any

Causes = list[tuple[str, str]]

# ---- texts the apiserver uses ----------------------------------------------------------------

_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_CONFIG_KEY_RE = re.compile(r"[-._a-zA-Z0-9]+")
_PERCENT_RE = re.compile(r"[0-9]+%")

SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_QUALIFIED_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
    "an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
    "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_CONFIG_KEY_MSG = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  "
    "or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
)
_PERCENT_MSG = (
    "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', "
    "regex used for validation is '[0-9]+%')"
)
QUANTITY_MSG = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
POD_UPDATE_MSG = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions "
    "to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)
_IMMUTABLE = "field is immutable"
_MAX_ANNOTATIONS_BYTES = 256 * 1024


def value(v: Any) -> str:
    """A bad value as a field error prints it: Go's %q for strings, %v for numbers, JSON otherwise."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if v is None:
        return "null"
    if isinstance(v, int | float):
        return str(v)
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def invalid_value(v: Any, detail: str) -> str:
    return f"Invalid value: {value(v)}: {detail}"


def unsupported(v: Any, allowed: tuple[str, ...]) -> str:
    return f"Unsupported value: {value(v)}: supported values: " + ", ".join(f'"{a}"' for a in allowed)


REQUIRED = "Required value"

# ---- quantities ------------------------------------------------------------------------------

_QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_quantity(text: Any) -> Decimal:
    """A resource quantity ("100m", "1Gi", "1e3", 2) as a number; ValueError when it does not parse."""
    if isinstance(text, bool):
        raise ValueError(QUANTITY_MSG)
    if isinstance(text, int | float):
        return Decimal(str(text))
    if not isinstance(text, str):
        raise ValueError(QUANTITY_MSG)
    match = _QUANTITY_RE.match(text.strip() if text != text.strip() else text)
    if match is None:
        raise ValueError(QUANTITY_MSG)
    number, suffix = match.groups()
    try:
        base = Decimal(number)
    except InvalidOperation as exc:
        raise ValueError(QUANTITY_MSG) from exc
    if suffix in _SUFFIXES:
        return base * _SUFFIXES[suffix]
    if suffix[:1] in ("e", "E"):
        try:
            return base * (Decimal(10) ** int(suffix[1:]))
        except ValueError as exc:
            raise ValueError(QUANTITY_MSG) from exc
    raise ValueError(QUANTITY_MSG)


def _quantity_maps(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    spec = _dict(obj.get("spec"))
    for pod_spec in (spec, _dict(_dict(spec.get("template")).get("spec"))):
        for key in ("containers", "initContainers"):
            for container in _dicts(pod_spec.get(key)):
                resources = container.get("resources")
                if isinstance(resources, dict):
                    for part in ("limits", "requests"):
                        if isinstance(resources.get(part), dict):
                            yield part, resources[part]
    status = _dict(obj.get("status"))
    for part in ("capacity", "allocatable"):
        if isinstance(status.get(part), dict):
            yield part, status[part]


def quantity_problems(obj: dict[str, Any]) -> list[str]:
    """Decoding failures of resource quantities in containers and node status (the apiserver's 400)."""
    for _, quantities in _quantity_maps(obj):
        for text in quantities.values():
            try:
                parse_quantity(text)
            except ValueError:
                return [QUANTITY_MSG]
    return []


# ---- metadata --------------------------------------------------------------------------------


def _dicts(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def subdomain_errors(name: str) -> list[str]:
    out = []
    if len(name) > 253:
        out.append("must be no more than 253 characters")
    if not _SUBDOMAIN_RE.fullmatch(name):
        out.append(SUBDOMAIN_MSG)
    return out


def label_errors(name: str) -> list[str]:
    out = []
    if len(name) > 63:
        out.append("must be no more than 63 characters")
    if not _LABEL_RE.fullmatch(name):
        out.append(LABEL_MSG)
    return out


def qualified_name_errors(key: str) -> list[str]:
    """Label and annotation keys: an optional DNS subdomain prefix and a 63-character name part."""
    parts = key.split("/")
    if len(parts) == 1:
        prefix, name = "", parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ["prefix part must be non-empty"]
    else:
        return [
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start "
            "and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
            "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS "
            "subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    out = [f"prefix part {m}" for m in subdomain_errors(prefix)] if prefix else []
    if not name:
        out.append("name part must be non-empty")
    elif len(name) > 63:
        out.append("name part must be no more than 63 characters")
    if name and not _QUALIFIED_NAME_RE.fullmatch(name):
        out.append(_QUALIFIED_NAME_MSG)
    return out


def _label_value_errors(v: str) -> list[str]:
    out = []
    if len(v) > 63:
        out.append("must be no more than 63 characters")
    if not _LABEL_VALUE_RE.fullmatch(v):
        out.append(_LABEL_VALUE_MSG)
    return out


def labels_causes(labels: Any, path: str) -> Causes:
    causes: Causes = []
    for key, v in _dict(labels).items():
        causes += [(path, invalid_value(key, m)) for m in qualified_name_errors(key)]
        if isinstance(v, str):
            causes += [(path, invalid_value(v, m)) for m in _label_value_errors(v)]
    return causes


def _annotations_causes(annotations: Any, path: str) -> Causes:
    causes: Causes = []
    total = 0
    for key, v in _dict(annotations).items():
        causes += [(path, invalid_value(key, m)) for m in qualified_name_errors(key.lower())]
        total += len(key) + (len(v) if isinstance(v, str) else 0)
    if total > _MAX_ANNOTATIONS_BYTES:
        causes.append((path, f"Too long: may not be more than {_MAX_ANNOTATIONS_BYTES} bytes"))
    return causes


def metadata_causes(meta: dict[str, Any], name_check: Callable[[str], list[str]]) -> Causes:
    causes: Causes = []
    name = meta.get("name")
    if isinstance(name, str) and name:
        causes += [("metadata.name", invalid_value(name, m)) for m in name_check(name)]
    causes += labels_causes(meta.get("labels"), "metadata.labels")
    causes += _annotations_causes(meta.get("annotations"), "metadata.annotations")
    return causes


# ---- pods ------------------------------------------------------------------------------------

_RESTART_POLICIES = ("Always", "OnFailure", "Never")
_DNS_POLICIES = ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None")
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_MESSAGE_POLICIES = ("File", "FallbackToLogsOnError")
_PROTOCOLS = ("SCTP", "TCP", "UDP")
_TOLERATION_OPERATORS = ("Equal", "Exists")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _container_causes(container: dict[str, Any], path: str, names: set[str]) -> Causes:
    causes: Causes = []
    name = container.get("name")
    if not name:
        causes.append((f"{path}.name", REQUIRED))
    elif isinstance(name, str):
        causes += [(f"{path}.name", invalid_value(name, m)) for m in label_errors(name)]
        if name in names:
            causes.append((f"{path}.name", f"Duplicate value: {value(name)}"))
        names.add(name)
    if not container.get("image"):
        causes.append((f"{path}.image", REQUIRED))
    policy = container.get("imagePullPolicy")
    if policy is not None and policy not in _PULL_POLICIES:
        causes.append((f"{path}.imagePullPolicy", unsupported(policy, _PULL_POLICIES)))
    message_policy = container.get("terminationMessagePolicy")
    if message_policy is not None and message_policy not in _MESSAGE_POLICIES:
        causes.append((f"{path}.terminationMessagePolicy", unsupported(message_policy, _MESSAGE_POLICIES)))
    for i, port in enumerate(_dicts(container.get("ports"))):
        where = f"{path}.ports[{i}]"
        number = port.get("containerPort")
        if not number:
            causes.append((f"{where}.containerPort", REQUIRED))
        elif isinstance(number, int) and not 1 <= number <= 65535:
            causes.append(
                (f"{where}.containerPort", invalid_value(number, "must be between 1 and 65535, inclusive"))
            )
        protocol = port.get("protocol")
        if protocol is not None and protocol not in _PROTOCOLS:
            causes.append((f"{where}.protocol", unsupported(protocol, _PROTOCOLS)))
    resources = _dict(container.get("resources"))
    limits, requests = _dict(resources.get("limits")), _dict(resources.get("requests"))
    for part, quantities in (("limits", limits), ("requests", requests)):
        for rname, text in quantities.items():
            try:
                amount = parse_quantity(text)
            except ValueError:
                continue  # a decoding error, reported before validation
            if amount < 0:
                causes.append(
                    (
                        f"{path}.resources.{part}[{rname}]",
                        invalid_value(str(text), "must be greater than or equal to 0"),
                    )
                )
    for rname, text in requests.items():
        if rname not in limits:
            continue
        try:
            if parse_quantity(text) > parse_quantity(limits[rname]):
                causes.append(
                    (
                        f"{path}.resources.requests",
                        invalid_value(
                            str(text), f"must be less than or equal to {rname} limit of {limits[rname]}"
                        ),
                    )
                )
        except ValueError:
            continue
    return causes


def pod_spec_causes(spec: Any, path: str, *, restart_policies: tuple[str, ...] = _RESTART_POLICIES) -> Causes:
    """Field errors of a PodSpec at `path` (`spec`, or `spec.template.spec` in a workload)."""
    if not isinstance(spec, dict):
        return [(f"{path}.containers", REQUIRED)]
    causes: Causes = []
    names: set[str] = set()
    containers = _dicts(spec.get("containers"))
    if not containers:
        causes.append((f"{path}.containers", REQUIRED))
    for i, container in enumerate(containers):
        causes += _container_causes(container, f"{path}.containers[{i}]", names)
    for i, container in enumerate(_dicts(spec.get("initContainers"))):
        causes += _container_causes(container, f"{path}.initContainers[{i}]", names)
    restart = spec.get("restartPolicy")
    if restart is not None and restart not in restart_policies:
        causes.append((f"{path}.restartPolicy", unsupported(restart, restart_policies)))
    dns = spec.get("dnsPolicy")
    if dns is not None and dns not in _DNS_POLICIES:
        causes.append((f"{path}.dnsPolicy", unsupported(dns, _DNS_POLICIES)))
    node = spec.get("nodeName")
    if isinstance(node, str) and node:
        causes += [(f"{path}.nodeName", invalid_value(node, m)) for m in subdomain_errors(node)]
    grace = spec.get("terminationGracePeriodSeconds")
    if isinstance(grace, int) and not isinstance(grace, bool) and grace < 0:
        causes.append(
            (
                f"{path}.terminationGracePeriodSeconds",
                invalid_value(grace, "must be greater than or equal to 0"),
            )
        )
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and not isinstance(deadline, bool) and deadline <= 0:
        causes.append((f"{path}.activeDeadlineSeconds", invalid_value(deadline, "must be greater than 0")))
    for i, toleration in enumerate(_dicts(spec.get("tolerations"))):
        causes += _toleration_causes(toleration, f"{path}.tolerations[{i}]")
    causes += labels_causes(spec.get("nodeSelector"), f"{path}.nodeSelector")
    return causes


def _toleration_causes(toleration: dict[str, Any], path: str) -> Causes:
    causes: Causes = []
    key = toleration.get("key")
    if isinstance(key, str) and key:
        causes += [(f"{path}.key", invalid_value(key, m)) for m in qualified_name_errors(key)]
    operator = toleration.get("operator")
    if operator not in (None, "") and operator not in _TOLERATION_OPERATORS:
        causes.append((f"{path}.operator", unsupported(operator, _TOLERATION_OPERATORS)))
    if operator == "Exists" and toleration.get("value"):
        causes.append(
            (
                f"{path}.operator",
                invalid_value(toleration.get("value"), "value must be empty when `operator` is 'Exists'"),
            )
        )
    if not key and operator != "Exists":
        causes.append(
            (
                f"{path}.operator",
                invalid_value(
                    operator or "",
                    "operator must be Exists when `key` is empty, which means "
                    '"match all values and all keys"',
                ),
            )
        )
    effect = toleration.get("effect")
    if effect not in (None, "") and effect not in _TAINT_EFFECTS:
        causes.append((f"{path}.effect", unsupported(effect, _TAINT_EFFECTS)))
    if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
        causes.append(
            (
                f"{path}.effect",
                invalid_value(effect or "", "effect must be 'NoExecute' when `tolerationSeconds` is set"),
            )
        )
    return causes


def _pod(obj: dict[str, Any]) -> Causes:
    return pod_spec_causes(obj.get("spec"), "spec")


def _template_causes(spec: dict[str, Any], restart_policies: tuple[str, ...]) -> Causes:
    template = spec.get("template")
    if not isinstance(template, dict):
        return [("spec.template", REQUIRED)]
    tmeta = _dict(template.get("metadata"))
    causes = labels_causes(tmeta.get("labels"), "spec.template.metadata.labels")
    causes += pod_spec_causes(template.get("spec"), "spec.template.spec", restart_policies=restart_policies)
    return causes


def _selector_matches(selector: dict[str, Any], labels: dict[str, Any]) -> bool:
    for key, want in _dict(selector.get("matchLabels")).items():
        if labels.get(key) != want:
            return False
    for expr in _dicts(selector.get("matchExpressions")):
        label, op, allowed = str(expr.get("key")), expr.get("operator"), expr.get("values") or []
        have = labels.get(label)
        if (
            (op == "In" and have not in allowed)
            or (op == "NotIn" and have in allowed)
            or (op == "Exists" and label not in labels)
            or (op == "DoesNotExist" and label in labels)
        ):
            return False
    return True


def _non_negative(spec: dict[str, Any], fields: tuple[str, ...]) -> Causes:
    causes: Causes = []
    for name in fields:
        v = spec.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v < 0:
            causes.append((f"spec.{name}", invalid_value(v, "must be greater than or equal to 0")))
    return causes


def _workload(kind: str, restart_policies: tuple[str, ...]) -> Callable[[dict[str, Any]], Causes]:
    def check(obj: dict[str, Any]) -> Causes:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return [("spec.selector", REQUIRED), ("spec.template", REQUIRED)]
        causes = _non_negative(spec, ("replicas", "minReadySeconds", "revisionHistoryLimit"))
        selector = spec.get("selector")
        if not isinstance(selector, dict):
            causes.append(("spec.selector", REQUIRED))
        elif not selector.get("matchLabels") and not selector.get("matchExpressions"):
            causes.append(("spec.selector", invalid_value(selector, f"empty selector is invalid for {kind}")))
        causes += _template_causes(spec, restart_policies)
        template_labels = _dict(_dict(_dict(spec.get("template")).get("metadata")).get("labels"))
        selects = isinstance(selector, dict) and (
            selector.get("matchLabels") or selector.get("matchExpressions")
        )
        if selects and isinstance(selector, dict) and not _selector_matches(selector, template_labels):
            causes.append(
                (
                    "spec.template.metadata.labels",
                    invalid_value(template_labels, "`selector` does not match template `labels`"),
                )
            )
        return causes

    return check


_JOB_RESTART = ("OnFailure", "Never")
_COMPLETION_MODES = ("NonIndexed", "Indexed")


def _job(obj: dict[str, Any]) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec.template", REQUIRED)]
    causes = _non_negative(spec, ("parallelism", "completions", "backoffLimit"))
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and not isinstance(deadline, bool) and deadline <= 0:
        causes.append(("spec.activeDeadlineSeconds", invalid_value(deadline, "must be greater than 0")))
    mode = spec.get("completionMode")
    if mode is not None and mode not in _COMPLETION_MODES:
        causes.append(("spec.completionMode", unsupported(mode, _COMPLETION_MODES)))
    causes += _template_causes(spec, _JOB_RESTART)
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        causes.append(("spec.selector", REQUIRED))
    else:
        labels = _dict(_dict(_dict(spec.get("template")).get("metadata")).get("labels"))
        if not _selector_matches(selector, labels):
            causes.append(
                (
                    "spec.template.metadata.labels",
                    invalid_value(labels, "`selector` does not match template `labels`"),
                )
            )
    return causes


def _config_keys(obj: dict[str, Any]) -> Causes:
    causes: Causes = []
    seen: set[str] = set()
    for part in ("data", "binaryData", "stringData"):
        for key in _dict(obj.get(part)):
            if not _CONFIG_KEY_RE.fullmatch(key) or key in (".", ".."):
                causes.append((f"{part}[{key}]", invalid_value(key, _CONFIG_KEY_MSG)))
            elif key in seen and part != "stringData":
                causes.append((f"{part}[{key}]", invalid_value(key, "duplicate of key present in data")))
            seen.add(key)
    return causes


_UNHEALTHY_POLICIES = ("IfHealthyBudget", "AlwaysAllow")


def _int_or_percent(v: Any, path: str) -> Causes:
    if isinstance(v, int) and not isinstance(v, bool):
        return [(path, invalid_value(v, "must be greater than or equal to 0"))] if v < 0 else []
    if isinstance(v, str):
        if not _PERCENT_RE.fullmatch(v):
            return [(path, invalid_value(v, _PERCENT_MSG))]
        if int(v[:-1]) > 100:
            return [(path, invalid_value(v, "must not be greater than 100%"))]
    return []


def _pdb(obj: dict[str, Any]) -> Causes:
    spec = _dict(obj.get("spec"))
    causes: Causes = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        causes.append(("spec", invalid_value(spec, "minAvailable and maxUnavailable cannot be both set")))
    for name in ("minAvailable", "maxUnavailable"):
        if spec.get(name) is not None:
            causes += _int_or_percent(spec[name], f"spec.{name}")
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in _UNHEALTHY_POLICIES:
        causes.append(("spec.unhealthyPodEvictionPolicy", unsupported(policy, _UNHEALTHY_POLICIES)))
    return causes


def _lease(obj: dict[str, Any]) -> Causes:
    spec = _dict(obj.get("spec"))
    causes: Causes = []
    duration = spec.get("leaseDurationSeconds")
    if isinstance(duration, int) and not isinstance(duration, bool) and duration <= 0:
        causes.append(("spec.leaseDurationSeconds", invalid_value(duration, "must be greater than 0")))
    transitions = spec.get("leaseTransitions")
    if isinstance(transitions, int) and not isinstance(transitions, bool) and transitions < 0:
        causes.append(
            ("spec.leaseTransitions", invalid_value(transitions, "must be greater than or equal to 0"))
        )
    return causes


def _taint_causes(taint: dict[str, Any], path: str, effects: tuple[str, ...]) -> Causes:
    causes: Causes = []
    key = taint.get("key")
    if not key:
        causes.append((f"{path}.key", REQUIRED))
    elif isinstance(key, str):
        causes += [(f"{path}.key", invalid_value(key, m)) for m in qualified_name_errors(key)]
    v = taint.get("value")
    if isinstance(v, str) and v:
        causes += [(f"{path}.value", invalid_value(v, m)) for m in _label_value_errors(v)]
    effect = taint.get("effect")
    if not effect:
        causes.append((f"{path}.effect", REQUIRED))
    elif effect not in effects:
        causes.append((f"{path}.effect", unsupported(effect, effects)))
    return causes


def _node(obj: dict[str, Any]) -> Causes:
    causes: Causes = []
    for i, taint in enumerate(_dicts(_dict(obj.get("spec")).get("taints"))):
        causes += _taint_causes(taint, f"spec.taints[{i}]", _TAINT_EFFECTS)
    return causes


_DEVICE_TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")


def _device_taint_rule(obj: dict[str, Any]) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec.taint", REQUIRED)]
    taint = spec.get("taint")
    if not isinstance(taint, dict):
        return [("spec.taint", REQUIRED)]
    return _taint_causes(taint, "spec.taint", _DEVICE_TAINT_EFFECTS)


def _event(obj: dict[str, Any]) -> Causes:
    meta = _dict(obj.get("metadata"))
    involved = _dict(obj.get("involvedObject"))
    ns = involved.get("namespace")
    if ns and ns != meta.get("namespace"):
        return [("involvedObject.namespace", invalid_value(ns, "does not match event.namespace"))]
    return []


_CREATE: dict[str, Callable[[dict[str, Any]], Causes]] = {
    "pods": _pod,
    "deployments.apps": _workload("deployment", ("Always",)),
    "replicasets.apps": _workload("replicaset", ("Always",)),
    "statefulsets.apps": _workload("statefulset", ("Always",)),
    "jobs.batch": _job,
    "configmaps": _config_keys,
    "secrets": _config_keys,
    "poddisruptionbudgets.policy": _pdb,
    "leases.coordination.k8s.io": _lease,
    "nodes": _node,
    "devicetaintrules.resource.k8s.io": _device_taint_rule,
    "events": _event,
}
_LABEL_NAMED = frozenset({"namespaces", "services"})
"""Resources whose names are DNS-1123 labels; every other one takes a DNS-1123 subdomain."""


def validate_object(resource: str, obj: dict[str, Any]) -> Causes:
    """Field errors of an object as written (create, and the new object of an update)."""
    check = label_errors if resource in _LABEL_NAMED else subdomain_errors
    causes = metadata_causes(_dict(obj.get("metadata")), check)
    fn = _CREATE.get(resource)
    if fn is not None:
        causes += fn(obj)
    return causes


# ---- updates ---------------------------------------------------------------------------------


def _immutable(path: str, new: Any) -> tuple[str, str]:
    return path, invalid_value(new, _IMMUTABLE)


def _pod_update(new: dict[str, Any], old: dict[str, Any]) -> Causes:
    new_spec, old_spec = _dict(new.get("spec")), _dict(old.get("spec"))
    # What may change is copied from the new spec onto the old one; any other difference is refused.
    allowed = json.loads(json.dumps(old_spec))
    for key in ("containers", "initContainers"):
        olds, news = _dicts(allowed.get(key)), _dicts(new_spec.get(key))
        if len(olds) == len(news):
            for o, n in zip(olds, news, strict=True):
                if "image" in n:
                    o["image"] = n["image"]
    for key in ("activeDeadlineSeconds", "terminationGracePeriodSeconds"):
        if key in new_spec:
            allowed[key] = new_spec[key]
        else:
            allowed.pop(key, None)
    old_tolerations = _dicts(old_spec.get("tolerations"))
    new_tolerations = _dicts(new_spec.get("tolerations"))
    if all(t in new_tolerations for t in old_tolerations):
        allowed["tolerations"] = new_spec.get("tolerations")
        if "tolerations" not in new_spec:
            allowed.pop("tolerations", None)
    if allowed == new_spec:
        return []
    changed = sorted(k for k in set(allowed) | set(new_spec) if allowed.get(k) != new_spec.get(k))
    diff = "".join(f"\n- \t{k}: {value(old_spec.get(k))}\n+ \t{k}: {value(new_spec.get(k))}" for k in changed)
    return [("spec", f"Forbidden: {POD_UPDATE_MSG}\n  core.PodSpec{{{diff}\n  }}\n")]


def _job_update(new: dict[str, Any], old: dict[str, Any]) -> Causes:
    new_spec, old_spec = _dict(new.get("spec")), _dict(old.get("spec"))
    causes: Causes = []
    for key in ("selector", "template", "completions", "completionMode"):
        if new_spec.get(key) != old_spec.get(key):
            causes.append(_immutable(f"spec.{key}", new_spec.get(key)))
    return causes


def _claim_update(new: dict[str, Any], old: dict[str, Any]) -> Causes:
    if new.get("spec") != old.get("spec"):
        return [_immutable("spec", new.get("spec"))]
    return []


_WHEN_IMMUTABLE = "Forbidden: field is immutable when `immutable` is set"


def _config_update(new: dict[str, Any], old: dict[str, Any]) -> Causes:
    causes: Causes = []
    if "type" in old and new.get("type") != old.get("type"):
        causes.append(_immutable("type", new.get("type")))
    if old.get("immutable") is True:
        if new.get("immutable") is not True:
            causes.append(("immutable", _WHEN_IMMUTABLE))
        for part in ("data", "binaryData"):
            if (new.get(part) or {}) != (old.get(part) or {}):
                causes.append((part, _WHEN_IMMUTABLE))
    return causes


def _workload_update(new: dict[str, Any], old: dict[str, Any]) -> Causes:
    new_selector, old_selector = (
        _dict(new.get("spec")).get("selector"),
        _dict(old.get("spec")).get("selector"),
    )
    if new_selector != old_selector:
        return [_immutable("spec.selector", new_selector)]
    return []


_UPDATE: dict[str, Callable[[dict[str, Any], dict[str, Any]], Causes]] = {
    "pods": _pod_update,
    "jobs.batch": _job_update,
    "resourceclaims.resource.k8s.io": _claim_update,
    "configmaps": _config_update,
    "secrets": _config_update,
    "deployments.apps": _workload_update,
    "replicasets.apps": _workload_update,
    "statefulsets.apps": _workload_update,
}


_HEALTH = ("Healthy", "Unhealthy", "Unknown")
_CLAIM_FORMAT = (
    "must match one of the container's resource claims in a format 'claim:<claimName>/<request>' "
    "or 'claim:<claimName>' if request is empty"
)


def allocated_resources_status_causes(pod: dict[str, Any]) -> Causes:
    """A pod status write's `allocatedResourcesStatus` as the API server checks it: each entry of
    a container's status names a resource that container requests, or one of its own claims
    (`claim:<claim>` or `claim:<claim>/<request>`); each resource ID once, each health a known
    one. A status of a container the spec does not have is not checked (as upstream)."""
    spec = _dict(pod.get("spec"))
    status = _dict(pod.get("status"))
    causes: Causes = []
    for list_name, spec_name in (
        ("containerStatuses", "containers"),
        ("initContainerStatuses", "initContainers"),
    ):
        containers = {str(c.get("name")): c for c in _dicts(spec.get(spec_name))}
        for i, cs in enumerate(_dicts(status.get(list_name))):
            container = containers.get(str(cs.get("name")))
            for j, entry in enumerate(_dicts(cs.get("allocatedResourcesStatus"))):
                path = f"status.{list_name}[{i}].allocatedResourcesStatus[{j}]"
                name = str(entry.get("name") or "")
                if container is not None:
                    resources = _dict(container.get("resources"))
                    if name.startswith("claim:"):
                        named = {
                            "claim:" + str(c.get("name")) + (f"/{c['request']}" if c.get("request") else "")
                            for c in _dicts(resources.get("claims"))
                        }
                        if name not in named:
                            causes.append((f"{path}.name", invalid_value(name, _CLAIM_FORMAT)))
                    elif name not in _dict(resources.get("requests")):
                        causes.append(
                            (
                                f"{path}.name",
                                invalid_value(name, "must match one of the container's resource requests"),
                            )
                        )
                seen: set[str] = set()
                for k, resource in enumerate(_dicts(entry.get("resources"))):
                    health = str(resource.get("health") or "")
                    if health not in _HEALTH:
                        causes.append((f"{path}.resources[{k}].health", unsupported(health, _HEALTH)))
                    rid = str(resource.get("resourceID") or "")
                    if rid in seen:
                        causes.append((f"{path}.resources[{k}].resourceID", f"Duplicate value: {value(rid)}"))
                    seen.add(rid)
    return causes


def validate_update(
    resource: str, new: dict[str, Any], old: dict[str, Any], subresource: str | None
) -> Causes:
    """Field errors of an update: the object's own checks, then the fields it may not change.

    `old` must be defaulted like `new`, so defaults alone never count as a change.
    """
    if subresource is not None:
        # A status write cannot change the spec, so only what it may change is checked (as the
        # apiserver's status strategies do); the simulator's own objects need not pass spec checks.
        check = label_errors if resource in _LABEL_NAMED else subdomain_errors
        causes = metadata_causes(_dict(new.get("metadata")), check)
        if resource == "pods" and subresource == "status":
            causes += allocated_resources_status_causes(new)
        return causes
    causes = validate_object(resource, new)
    fn = _UPDATE.get(resource)
    if fn is not None:
        causes += fn(new, old)
    return causes


__all__ = [
    "LABEL_MSG",
    "POD_UPDATE_MSG",
    "QUANTITY_MSG",
    "SUBDOMAIN_MSG",
    "Causes",
    "allocated_resources_status_causes",
    "invalid_value",
    "parse_quantity",
    "quantity_problems",
    "validate_object",
    "validate_update",
    "value",
]
