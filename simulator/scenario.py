"""Scenario files: the simulated fleet, its workloads and a timeline of faults.

This module owns the scenario format (documented in `docs/scenarios.md`): loading YAML with
line numbers, validating every field into the frozen dataclasses of `simulator.model`, and
resolving a built-in name (`simulator/scenarios/<name>.yaml`) or a path. It does no I/O
beyond reading the file and knows nothing of the running fleet; a bad file raises
`ScenarioError` whose message names the file, the line and the field, e.g.
`scenarios/x.yaml:14: timeline[2].device.gpu: 9 is out of range (node gpu-node-3 has 8 GPUs)`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import yaml

from gpuhealth.durations import DurationError, parse_duration
from simulator.model import (
    ACTIONS,
    APPLICATION_XIDS,
    CHECKPOINT_AFTER,
    DCGM_HEALTH_WATCHES,
    DCGM_HOST_LABELS,
    DEVICE_FAULTS,
    DEVICE_PLUGIN,
    DRA,
    DRA_DRIVER_PROFILES,
    FAULT_KINDS,
    GPU_RESOURCE,
    KEP4680_DRIVER,
    MIG_MIXED,
    MIG_SINGLE,
    NVIDIA_DRIVER,
    DeviceRef,
    Fault,
    MigLayout,
    NodeGroup,
    PlacementError,
    Scenario,
    Settings,
    Workload,
    place_workloads,
)

BUILTIN_DIR = Path(__file__).with_name("scenarios")

# The model's types are part of this module's interface (callers build and inspect what it parses).
__all__ = [
    "BUILTIN_DIR",
    "DeviceRef",
    "Fault",
    "FieldReader",
    "NodeGroup",
    "Scenario",
    "ScenarioError",
    "Settings",
    "Workload",
    "builtin_names",
    "fault_from_dict",
    "format_path",
    "from_dict",
    "list_builtins",
    "load_file",
    "parse_fault",
    "parse_fault_json",
    "parse_text",
    "resolve",
]


_MAX_NODES = 100_000
_MAX_GPUS_PER_NODE = 64
_MAX_BUILD_NODES = 1_000_000  # YAML nodes materialised; stops alias bombs
_MAX_DEPTH = 40

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ScenarioError(Exception):
    """A scenario that cannot be used; the message names the source, the line and the field."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# ---------------------------------------------------------------------------- YAML with lines

_Path = tuple[str | int, ...]


def format_path(path: _Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "(top level)"


def _compose(text: str, source: str) -> tuple[Any, dict[_Path, int]]:
    """Parse YAML into plain values, recording the line of every value by its path."""
    lines: dict[_Path, int] = {}
    budget = [_MAX_BUILD_NODES]
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:  # the reader refuses control characters up front
        raise ScenarioError(f"{source}:1: not valid YAML: {exc}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            raise ScenarioError(f"{source}:1: the document is empty")
        return _build(loader, node, (), lines, 0, budget, source), lines
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = exc.problem or exc.context or "invalid YAML"
        raise ScenarioError(f"{source}:{line}: not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}:1: not valid YAML: {exc}") from None
    except (ValueError, TypeError, OverflowError) as exc:
        # Constructors reject some well-formed scalars (e.g. a timestamp like 2001-13-45).
        raise ScenarioError(f"{source}:1: not valid YAML: {exc}") from None
    except RecursionError:
        raise ScenarioError(f"{source}:1: the document is nested too deeply") from None
    finally:
        loader.dispose()


def _build(
    loader: yaml.SafeLoader,
    node: yaml.Node,
    path: _Path,
    lines: dict[_Path, int],
    depth: int,
    budget: list[int],
    source: str,
) -> Any:
    line = node.start_mark.line + 1
    lines.setdefault(path, line)
    budget[0] -= 1
    if budget[0] < 0:
        raise ScenarioError(f"{source}:{line}: the document is too large (alias expansion?)")
    if depth > _MAX_DEPTH:
        raise ScenarioError(f"{source}:{line}: {format_path(path)}: nested too deeply")
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_object(node)
    if isinstance(node, yaml.SequenceNode):
        return [
            _build(loader, item, (*path, i), lines, depth + 1, budget, source)
            for i, item in enumerate(node.value)
        ]
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # resolves `<<` merge keys
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise ScenarioError(f"{source}:{key_line}: {format_path(path)}: keys must be plain strings")
            key = loader.construct_object(key_node)
            if not isinstance(key, str):
                key = str(key)
            if key in out:
                raise ScenarioError(f"{source}:{key_line}: {format_path((*path, key))}: duplicate key")
            lines[(*path, key)] = key_line
            out[key] = _build(loader, value_node, (*path, key), lines, depth + 1, budget, source)
        return out
    raise ScenarioError(f"{source}:{line}: unsupported YAML node")


# ---------------------------------------------------------------------------- field readers


class FieldReader:
    """Typed field access that fails with the source, the line and the field path.

    Public for the parts that read the sections the simulator keeps for them (the demo's
    `expect:` section, `demo.expectations`) in the same grammar; they override `fail`.
    """

    def __init__(self, source: str, lines: Mapping[_Path, int]) -> None:
        self.source = source
        self.lines = lines

    def line(self, path: _Path) -> int:
        for end in range(len(path), -1, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return 1

    def fail(self, path: _Path, message: str) -> NoReturn:
        raise ScenarioError(f"{self.source}:{self.line(path)}: {format_path(path)}: {message}")

    def mapping(self, value: Any, path: _Path, allowed: Iterable[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {_show(value)}")
        allowed_set = set(allowed)
        for key in value:
            if key not in allowed_set:
                self.fail((*path, key), f"unknown field (expected one of: {', '.join(sorted(allowed_set))})")
        return value

    def section(self, value: Any, path: _Path) -> dict[str, Any]:
        """A mapping whose keys another part checks (absent: empty)."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {_show(value)}")
        return value

    def sequence(self, value: Any, path: _Path) -> list[Any]:
        if not isinstance(value, list):
            self.fail(path, f"expected a list, got {_show(value)}")
        return value

    def required(self, data: Mapping[str, Any], key: str, path: _Path) -> Any:
        if key not in data or data[key] is None:
            self.fail((*path, key), "is required")
        return data[key]

    def integer(self, value: Any, path: _Path, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected an integer, got {_show(value)}")
        if not low <= value <= high:
            self.fail(path, f"{value} is out of range ({low}..{high})")
        return value

    def string(self, value: Any, path: _Path, *, max_len: int = 253) -> str:
        if not isinstance(value, str):
            self.fail(path, f"expected a string, got {_show(value)}")
        if len(value) > max_len:
            self.fail(path, f"longer than {max_len} characters")
        return value

    def name(self, value: Any, path: _Path, *, max_len: int = 63) -> str:
        text = self.string(value, path, max_len=max_len)
        if not _NAME_RE.match(text):
            self.fail(path, f"{text!r} is not a valid name (lower-case letters, digits and '-')")
        return text

    def choice(self, value: Any, path: _Path, options: Iterable[str]) -> Any:
        options = list(options)
        if not isinstance(value, str) or value not in options:
            self.fail(path, f"{_show(value)} is not one of: {', '.join(options)}")
        return value

    def boolean(self, value: Any, path: _Path) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"expected true or false, got {_show(value)}")
        return value

    def duration(self, value: Any, path: _Path, *, positive: bool = False) -> float:
        try:
            seconds = parse_duration(value)
        except DurationError:
            self.fail(path, f"{_show(value)} is not a duration (seconds, or e.g. 90s, 2m, 1m30s)")
        if seconds > 10 * 365 * 86400:
            self.fail(path, f"{_show(value)} is too long")
        if positive and seconds <= 0:
            self.fail(path, "must be greater than zero")
        return seconds


def _show(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------- the schema

_TOP_KEYS = (
    "name",
    "description",
    "settings",
    "fleet",
    "workloads",
    "timeline",
    "demo",
    "responder",
    "expect",
    "janitor",
)
_OUTER_SECTIONS = ("demo", "responder", "expect")
"""Sections the simulator keeps as they are for the parts that run the scenario end to end."""
_SETTINGS_KEYS = (
    "leaseRenewInterval",
    "leaseDurationSeconds",
    "statusSyncInterval",
    "draHealthTimeout",
    "nodeMonitorGracePeriod",
    "seed",
)
_GROUP_KEYS = (
    "name",
    "count",
    "namePrefix",
    "gpusPerNode",
    "path",
    "sharedReplicas",
    "product",
    "memory",
    "labels",
    "draDriver",
    "extendedResource",
    "dcgmExporter",
    "mig",
    "resourceHealthStatus",
)
_MIG_KEYS = ("strategy", "profile", "partitions")
MIG_SLICES = 7
"""Compute slices of an A100, H100 or H200: a card's partitions share at most these."""
_WORKLOAD_KEYS = (
    "name",
    "namespace",
    "kind",
    "replicas",
    "gpusPerPod",
    "checkpoint",
    "topology",
    "path",
    "nodeGroup",
    "initContainer",
    "draClaim",
    "draStatusName",
    "completeAfter",
    "servingGate",
    "canary",
    "extendedResource",
    "errorRatio",
)
_FAULT_KEYS: dict[str, tuple[str, ...]] = {
    "device-unhealthy": ("device", "message", "duration", "reset"),
    "device-unknown": ("device", "duration"),
    "flap": ("device", "times", "period"),
    "kubelet-stop": ("node", "duration"),
    "node-partition": ("node", "duration"),
    "health-stream-broken": ("node", "duration"),
    "health-stream-stale": ("node", "duration"),
    "dra-plugin-restart": ("node",),
    "device-plugin-restart": ("node",),
    "xid": ("device", "xid", "message", "unhealthy"),
    "ecc": ("device", "corrected", "uncorrected"),
    "row-remap-failure": ("device",),
    "gpu-lost": ("device", "message"),
    "health-watch": ("device", "watch"),
    "recover": ("device", "node"),
}
_ACTION_KEYS: dict[str, tuple[str, ...]] = {
    "scale": ("namespace", "workload", "replicas"),
    "delete-pods": ("namespace", "selector", "node"),
}
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_KEY = rf"({_DNS_LABEL}(\.{_DNS_LABEL})*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_LABEL_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SELECTOR_TERM = re.compile(rf"^(!?{_LABEL_KEY}|{_LABEL_KEY}\s*(=|==|!=)\s*{_LABEL_VALUE})$")
"""One term of an equality-based label selector (`kubectl -l`): `key`, `!key`, `key=value`,
`key==value`, `key!=value`. Set-based terms (`in`, `notin`) are not accepted here."""


def _settings(r: FieldReader, raw: Any) -> Settings:
    path: _Path = ("settings",)
    if raw is None:
        return Settings()
    data = r.mapping(raw, path, _SETTINGS_KEYS)
    base = Settings()

    def dur(key: str, default: float) -> float:
        if data.get(key) is None:
            return default
        return r.duration(data[key], (*path, key), positive=True)

    return Settings(
        lease_renew_interval=dur("leaseRenewInterval", base.lease_renew_interval),
        lease_duration_seconds=(
            r.integer(data["leaseDurationSeconds"], (*path, "leaseDurationSeconds"), 1, 3600)
            if data.get("leaseDurationSeconds") is not None
            else base.lease_duration_seconds
        ),
        status_sync_interval=dur("statusSyncInterval", base.status_sync_interval),
        dra_health_timeout=dur("draHealthTimeout", base.dra_health_timeout),
        node_monitor_grace_period=dur("nodeMonitorGracePeriod", base.node_monitor_grace_period),
        seed=(
            r.integer(data["seed"], (*path, "seed"), 0, 2**31) if data.get("seed") is not None else base.seed
        ),
    )


def _node_group(r: FieldReader, raw: Any, index: int) -> NodeGroup:
    path: _Path = ("fleet", index)
    data = r.mapping(raw, path, _GROUP_KEYS)
    name = r.name(r.required(data, "name", path), (*path, "name"))
    count = r.integer(r.required(data, "count", path), (*path, "count"), 1, _MAX_NODES)
    prefix = r.string(data.get("namePrefix", f"{name}-"), (*path, "namePrefix"), max_len=200)
    if not re.match(r"^[a-z0-9][-a-z0-9.]*$", prefix):
        r.fail(
            (*path, "namePrefix"),
            f"{prefix!r} cannot start a node name (lower-case letters, digits, '-', '.')",
        )
    gpus = r.integer(r.required(data, "gpusPerNode", path), (*path, "gpusPerNode"), 1, _MAX_GPUS_PER_NODE)
    node_path = r.choice(r.required(data, "path", path), (*path, "path"), (DEVICE_PLUGIN, DRA))
    replicas = r.integer(data.get("sharedReplicas", 0), (*path, "sharedReplicas"), 0, 64)
    if replicas and node_path == DRA:
        r.fail((*path, "sharedReplicas"), "time-slicing replicas apply to the device-plugin path only")
    product = r.string(data.get("product", "NVIDIA H100 80GB HBM3"), (*path, "product"), max_len=64)
    memory = r.string(data.get("memory", "80Gi"), (*path, "memory"), max_len=16)
    if not re.match(r"^\d+(Ki|Mi|Gi|Ti)?$", memory):
        r.fail((*path, "memory"), f"{memory!r} is not a quantity like 80Gi")
    labels_raw = data.get("labels") or {}
    if not isinstance(labels_raw, dict):
        r.fail((*path, "labels"), f"expected a mapping, got {_show(labels_raw)}")
    labels = {k: r.string(v, (*path, "labels", k), max_len=63) for k, v in labels_raw.items()}
    dra_driver = KEP4680_DRIVER
    if data.get("draDriver") is not None:
        if node_path != DRA:
            r.fail((*path, "draDriver"), "a DRA driver profile applies to the dra path only")
        dra_driver = r.choice(data["draDriver"], (*path, "draDriver"), DRA_DRIVER_PROFILES)
    extended = r.boolean(data.get("extendedResource", False), (*path, "extendedResource"))
    if extended and node_path != DRA:
        r.fail(
            (*path, "extendedResource"),
            "a DeviceClass's extendedResourceName applies to DRA nodes only (a device-plugin node "
            "serves nvidia.com/gpu itself)",
        )
    dcgm = data.get("dcgmExporter")
    dcgm_host_label = None if dcgm is None else r.choice(dcgm, (*path, "dcgmExporter"), DCGM_HOST_LABELS)
    layout = _mig(r, data.get("mig"), (*path, "mig"), node_path, replicas, dra_driver, extended)
    health_status = r.boolean(data.get("resourceHealthStatus", True), (*path, "resourceHealthStatus"))
    return NodeGroup(
        name=name,
        count=count,
        name_prefix=prefix,
        gpus_per_node=gpus,
        path=node_path,
        shared_replicas=replicas,
        product=product,
        memory=memory,
        labels=labels,
        line=r.line(path),
        dra_driver=dra_driver,
        extended_resource=extended,
        dcgm_host_label=dcgm_host_label,
        mig=layout,
        resource_health_status=health_status,
    )


def _mig(
    r: FieldReader, raw: Any, path: _Path, node_path: str, replicas: int, dra_driver: str, extended: bool
) -> MigLayout | None:
    """A node group's `mig:` section: every card of the group partitioned alike.

    On the device-plugin path `strategy` says how the plugin advertises the partitions; on DRA
    (the `nvidia` driver profile only) the driver publishes each partition as a device of its own
    and there is no strategy."""
    if raw is None:
        return None
    data = r.mapping(raw, path, _MIG_KEYS)
    if replicas:
        r.fail(path, "a group is either MIG-partitioned or time-sliced (sharedReplicas), not both")
    strategy: Any = MIG_SINGLE  # on DRA: unused (`MigLayout`)
    if node_path == DRA:
        if dra_driver != NVIDIA_DRIVER:
            r.fail(
                path,
                "MIG on DRA is simulated with the NVIDIA DRA driver's profile only (draDriver: nvidia): "
                "the kep4680 profile streams no per-partition health",
            )
        if extended:
            r.fail(
                path,
                "extendedResource maps nvidia.com/gpu to the driver's whole-GPU DeviceClass; a "
                "MIG-partitioned DRA group publishes no whole GPU",
            )
        if data.get("strategy") is not None:
            r.fail(
                (*path, "strategy"),
                "strategy is the device plugin's; the DRA driver publishes each partition as a device",
            )
    else:
        strategy = r.choice(r.required(data, "strategy", path), (*path, "strategy"), (MIG_SINGLE, MIG_MIXED))
    profile = r.string(r.required(data, "profile", path), (*path, "profile"), max_len=16)
    match = re.match(r"^([1-7])g\.(\d{1,3})gb$", profile)
    if match is None:
        r.fail((*path, "profile"), f"{profile!r} is not a MIG profile like 1g.10gb or 3g.40gb")
    partitions = r.integer(r.required(data, "partitions", path), (*path, "partitions"), 1, MIG_SLICES)
    if partitions * int(match.group(1)) > MIG_SLICES:
        r.fail(
            (*path, "partitions"),
            f"{partitions} partitions of {profile} need {partitions * int(match.group(1))} compute slices; "
            f"a card has {MIG_SLICES}",
        )
    return MigLayout(strategy=strategy, profile=profile, partitions=partitions)


def _workload(r: FieldReader, raw: Any, index: int, groups: Mapping[str, NodeGroup]) -> Workload:
    path: _Path = ("workloads", index)
    data = r.mapping(raw, path, _WORKLOAD_KEYS)
    name = r.name(r.required(data, "name", path), (*path, "name"), max_len=40)
    kind = r.choice(data.get("kind", "Deployment"), (*path, "kind"), ("Deployment", "Job"))
    wl_path = data.get("path")
    if wl_path is not None:
        wl_path = r.choice(wl_path, (*path, "path"), (DEVICE_PLUGIN, DRA))
    node_group = data.get("nodeGroup")
    if node_group is not None:
        node_group = r.string(node_group, (*path, "nodeGroup"))
        if node_group not in groups:
            r.fail((*path, "nodeGroup"), f"no node group named {node_group!r}")
    complete_after = None
    if data.get("completeAfter") is not None:
        if kind != "Job":
            r.fail((*path, "completeAfter"), "only Jobs complete")
        complete_after = r.duration(data["completeAfter"], (*path, "completeAfter"), positive=True)
    checkpoint, checkpoint_after, checkpoint_fails = _checkpoint(
        r, data.get("checkpoint"), (*path, "checkpoint")
    )
    return Workload(
        name=name,
        namespace=r.name(data.get("namespace", "default"), (*path, "namespace")),
        kind=kind,
        replicas=r.integer(r.required(data, "replicas", path), (*path, "replicas"), 0, 1_000_000),
        gpus_per_pod=r.integer(
            r.required(data, "gpusPerPod", path), (*path, "gpusPerPod"), 1, _MAX_GPUS_PER_NODE
        ),
        checkpoint=checkpoint,
        checkpoint_after=checkpoint_after,
        checkpoint_fails=checkpoint_fails,
        topology=r.choice(data.get("topology", "fixed"), (*path, "topology"), ("fixed", "shardable")),
        path=wl_path,
        node_group=node_group,
        init_container=r.boolean(data.get("initContainer", False), (*path, "initContainer")),
        dra_claim=r.choice(data.get("draClaim", "template"), (*path, "draClaim"), ("template", "direct")),
        dra_status_name=r.choice(
            data.get("draStatusName", "request"), (*path, "draStatusName"), ("request", "claim")
        ),
        complete_after=complete_after,
        serving_gate=r.boolean(data.get("servingGate", False), (*path, "servingGate")),
        canary=r.boolean(data.get("canary", False), (*path, "canary")),
        # A group of MIG strategy mixed offers `nvidia.com/mig-<profile>`: its workloads name it.
        resource=groups[node_group].resource if node_group is not None else GPU_RESOURCE,
        line=r.line(path),
        extended_resource=_extended_request(r, data, path, wl_path),
        error_ratio=_share(r, data.get("errorRatio", 0), (*path, "errorRatio")),
    )


def _share(r: FieldReader, value: Any, path: _Path) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        r.fail(path, f"expected a share of requests between 0 and 1, got {value!r}")
    return float(value)


def _extended_request(r: FieldReader, data: Mapping[str, Any], path: _Path, wl_path: str | None) -> bool:
    extended = r.boolean(data.get("extendedResource", False), (*path, "extendedResource"))
    if not extended:
        return False
    if wl_path == DEVICE_PLUGIN:
        r.fail(
            (*path, "extendedResource"),
            "path: device-plugin pods request nvidia.com/gpu already; "
            "extendedResource asks DRA nodes to serve it",
        )
    for key in ("draClaim", "draStatusName"):
        if key in data:
            r.fail((*path, key), "the pods of extendedResource: true reference no claim of their own")
    return True


_CHECKPOINT_KEYS = ("mode", "commitAfter")


def _checkpoint(r: FieldReader, raw: Any, path: _Path) -> tuple[Any, float | None, bool]:
    """`checkpoint: annotation | none`, or `{mode: ..., commitAfter: <duration> | never | fail}`.

    Returns (mode, seconds to commit or None for never, whether the agent fails instead).
    """
    if raw is None:
        return "none", CHECKPOINT_AFTER, False
    if not isinstance(raw, dict):
        return r.choice(raw, path, ("annotation", "none")), CHECKPOINT_AFTER, False
    data = r.mapping(raw, path, _CHECKPOINT_KEYS)
    mode = r.choice(data.get("mode", "annotation"), (*path, "mode"), ("annotation", "none"))
    commit = data.get("commitAfter")
    if commit is None:
        return mode, CHECKPOINT_AFTER, False
    if mode == "none":
        r.fail((*path, "commitAfter"), "only a workload with mode: annotation has a checkpoint agent")
    if commit == "never":
        return mode, None, False
    if commit == "fail":
        return mode, 0.0, True
    if isinstance(commit, str) and not commit[:1].isdigit():
        r.fail((*path, "commitAfter"), f"{_show(commit)} is not a duration, never or fail")
    return mode, r.duration(commit, (*path, "commitAfter")), False


def _device_ref(r: FieldReader, raw: Any, path: _Path, nodes: Mapping[str, NodeGroup]) -> DeviceRef:
    data = r.mapping(raw, path, ("node", "gpu"))
    node = r.string(r.required(data, "node", path), (*path, "node"))
    group = nodes.get(node)
    if group is None:
        r.fail((*path, "node"), f"no node named {node!r} in the fleet")
    gpu_raw = r.required(data, "gpu", path)
    if isinstance(gpu_raw, bool) or not isinstance(gpu_raw, int):
        r.fail((*path, "gpu"), f"expected a GPU index, got {_show(gpu_raw)}")
    if not 0 <= gpu_raw < group.gpus_per_node:
        r.fail((*path, "gpu"), f"{gpu_raw} is out of range (node {node} has {group.gpus_per_node} GPUs)")
    return DeviceRef(node=node, gpu=gpu_raw)


def parse_fault(
    r: FieldReader,
    raw: Any,
    path: _Path,
    nodes: Mapping[str, NodeGroup],
    workloads: Iterable[Workload] = (),
    *,
    default_at: float | None = None,
) -> Fault:
    """One timeline entry, a fault or a person's action (`workloads`: the scenario's, which a
    `scale` names); `default_at` is used when `at` is absent (entries injected at run time)."""
    if not isinstance(raw, dict):
        r.fail(path, f"expected a mapping, got {_show(raw)}")
    if "action" in raw:
        if "fault" in raw:
            r.fail(path, "an entry is a fault or an action, not both")
        return _parse_action(r, raw, path, nodes, workloads, default_at=default_at)
    kind = r.choice(r.required(raw, "fault", path), (*path, "fault"), sorted(FAULT_KINDS))
    data = r.mapping(raw, path, ("at", "fault", *_FAULT_KEYS[kind]))
    at = _at(r, data, path, default_at)
    device = None
    node = None
    if kind == "recover" and ("device" in data) == ("node" in data):
        r.fail(path, "recover needs exactly one of: device, node")
    if kind in DEVICE_FAULTS or (kind == "recover" and "device" in data):
        device = _device_ref(r, r.required(data, "device", path), (*path, "device"), nodes)
    else:
        node = r.string(r.required(data, "node", path), (*path, "node"))
        if node not in nodes:
            r.fail((*path, "node"), f"no node named {node!r} in the fleet")
        if kind == "health-stream-stale" and nodes[node].path != DRA:
            # A device plugin's dead ListAndWatch stream makes the kubelet report every device
            # Unhealthy at once (health-stream-broken): nothing lingers there.
            r.fail(
                (*path, "node"),
                f"health-stream-stale needs a DRA node (its kubelet plugin's stream); {node!r} is "
                f"{nodes[node].path}: a device plugin's dead stream is health-stream-broken",
            )
        if kind == "dra-plugin-restart" and nodes[node].path != DRA:
            r.fail(
                (*path, "node"),
                f"dra-plugin-restart needs a DRA node (its driver's kubelet plugin); "
                f"{node!r} is {nodes[node].path}",
            )
        if kind == "device-plugin-restart" and nodes[node].path == DRA:
            r.fail(
                (*path, "node"),
                f"device-plugin-restart needs a device-plugin node (the NVIDIA device plugin); "
                f"{node!r} is {nodes[node].path}: its DRA driver's kubelet plugin restarts with "
                "dra-plugin-restart",
            )
    fault: dict[str, Any] = {"at": at, "kind": kind, "device": device, "node": node, "line": r.line(path)}
    if kind == "device-unknown":
        fault["duration"] = r.duration(r.required(data, "duration", path), (*path, "duration"), positive=True)
    elif "duration" in data and data["duration"] is not None:
        fault["duration"] = r.duration(data["duration"], (*path, "duration"), positive=True)
    if kind == "flap":
        fault["times"] = r.integer(r.required(data, "times", path), (*path, "times"), 1, 10_000)
        fault["period"] = r.duration(r.required(data, "period", path), (*path, "period"), positive=True)
    if kind == "xid":
        fault["xid"] = r.integer(r.required(data, "xid", path), (*path, "xid"), 1, 999)
        if data.get("unhealthy") is not None:
            fault["unhealthy"] = r.boolean(data["unhealthy"], (*path, "unhealthy"))
        else:
            fault["unhealthy"] = fault["xid"] not in APPLICATION_XIDS
    if data.get("message") is not None:
        fault["message"] = r.string(data["message"], (*path, "message"), max_len=100_000)
    if data.get("reset") is not None:
        fault["reset"] = r.choice(data["reset"], (*path, "reset"), ["clears", "fails"])
    if kind == "health-watch":
        fault["watch"] = r.choice(r.required(data, "watch", path), (*path, "watch"), DCGM_HEALTH_WATCHES)
        assert device is not None
        if nodes[device.node].dcgm_host_label is None:
            r.fail(
                (*path, "device"),
                f"health-watch needs dcgm-exporter on the node (its group's dcgmExporter); "
                f"{device.node!r} runs none, so nothing would see the failure",
            )
    if kind == "ecc":
        fault["corrected"] = r.integer(data.get("corrected", 0), (*path, "corrected"), 0, 2**40)
        fault["uncorrected"] = r.integer(data.get("uncorrected", 0), (*path, "uncorrected"), 0, 2**40)
        if fault["corrected"] == 0 and fault["uncorrected"] == 0:
            r.fail(path, "ecc needs corrected or uncorrected greater than zero")
    return Fault(**fault)


def _at(r: FieldReader, data: Mapping[str, Any], path: _Path, default_at: float | None) -> float:
    if data.get("at") is None:
        if default_at is None:
            r.fail((*path, "at"), "is required")
        return default_at
    return r.duration(data["at"], (*path, "at"))


def _parse_action(
    r: FieldReader,
    raw: dict[str, Any],
    path: _Path,
    nodes: Mapping[str, NodeGroup],
    workloads: Iterable[Workload],
    *,
    default_at: float | None,
) -> Fault:
    """A person's action through the API (`ACTIONS`): what `kubectl scale` and `kubectl delete
    pods -l` do, at a scenario time."""
    kind = r.choice(r.required(raw, "action", path), (*path, "action"), sorted(ACTIONS))
    data = r.mapping(raw, path, ("at", "action", *_ACTION_KEYS[kind]))
    at = _at(r, data, path, default_at)
    namespace = r.name(data.get("namespace", "default"), (*path, "namespace"))
    if kind == "scale":
        name = r.name(r.required(data, "workload", path), (*path, "workload"), max_len=40)
        workload = next((w for w in workloads if (w.namespace, w.name) == (namespace, name)), None)
        if workload is None:
            r.fail(
                (*path, "workload"),
                f"no workload {namespace}/{name} in the scenario (a scale names one of its Deployments)",
            )
        if workload.kind != "Deployment":
            r.fail((*path, "workload"), f"{namespace}/{name} is a Job: only a Deployment is scaled")
        replicas = r.integer(r.required(data, "replicas", path), (*path, "replicas"), 0, 1_000_000)
        return Fault(
            at=at, kind=kind, namespace=namespace, workload=name, replicas=replicas, line=r.line(path)
        )
    selector = r.string(r.required(data, "selector", path), (*path, "selector"), max_len=1000)
    terms = [t.strip() for t in selector.split(",")]
    bad = next((t for t in terms if not _SELECTOR_TERM.match(t)), None)
    if bad is not None:
        r.fail(
            (*path, "selector"),
            f"{bad!r} is not a label selector term (key, !key, key=value, key==value, key!=value)",
        )
    node = None
    if data.get("node") is not None:
        node = r.string(data["node"], (*path, "node"))
        if node not in nodes:
            r.fail((*path, "node"), f"no node named {node!r} in the fleet")
    return Fault(
        at=at, kind=kind, namespace=namespace, selector=",".join(terms), node=node, line=r.line(path)
    )


def _build_scenario(data_raw: Any, lines: Mapping[_Path, int], source: str, default_name: str) -> Scenario:
    r = FieldReader(source, lines)
    data = r.mapping(data_raw, (), _TOP_KEYS)
    name = r.string(data.get("name", default_name), ("name",), max_len=100)
    description = r.string(data.get("description", ""), ("description",), max_len=500)
    settings = _settings(r, data.get("settings"))
    fleet_raw = r.sequence(r.required(data, "fleet", ()), ("fleet",))
    if not fleet_raw:
        r.fail(("fleet",), "needs at least one node group")
    groups: dict[str, NodeGroup] = {}
    nodes: dict[str, NodeGroup] = {}
    total_nodes = 0
    for i, raw in enumerate(fleet_raw):
        group = _node_group(r, raw, i)
        if group.name in groups:
            r.fail(("fleet", i, "name"), f"node group {group.name!r} is defined twice")
        total_nodes += group.count
        if total_nodes > _MAX_NODES:
            r.fail(("fleet", i, "count"), f"the fleet may have at most {_MAX_NODES} nodes")
        first_dra = next((g for g in groups.values() if g.path == DRA), None)
        if group.path == DRA and first_dra is not None and first_dra.dra_driver != group.dra_driver:
            # Both profiles are driver gpu.nvidia.com: a cluster runs one install of a DRA driver,
            # and the exporter tells its health source by the driver's name.
            r.fail(
                ("fleet", i, "draDriver"),
                f"{group.dra_driver!r}, but group {first_dra.name!r} runs {first_dra.dra_driver!r}: "
                "a fleet runs one DRA driver profile",
            )
        groups[group.name] = group
        for node in group.node_names():
            if len(node) > 253:
                r.fail(("fleet", i, "namePrefix"), "node names would be longer than 253 characters")
            if node in nodes:
                r.fail(("fleet", i, "namePrefix"), f"node {node} is also in group {nodes[node].name!r}")
            nodes[node] = group
    dra_groups = [(i, g) for i, g in enumerate(groups.values()) if g.path == DRA]
    for i, g in dra_groups:
        if g.extended_resource != dra_groups[0][1].extended_resource:
            r.fail(
                ("fleet", i, "extendedResource"),
                "the DRA driver's DeviceClass is cluster-wide: every dra group sets extendedResource alike",
            )
    workloads_raw = r.sequence(data.get("workloads") or [], ("workloads",))
    workloads: list[Workload] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(workloads_raw):
        wl = _workload(r, raw, i, groups)
        if (wl.namespace, wl.name) in seen:
            r.fail(("workloads", i, "name"), f"workload {wl.namespace}/{wl.name} is defined twice")
        seen.add((wl.namespace, wl.name))
        workloads.append(wl)
    timeline_raw = r.sequence(data.get("timeline") or [], ("timeline",))
    timeline = [parse_fault(r, raw, ("timeline", i), nodes, workloads) for i, raw in enumerate(timeline_raw)]
    janitor = None
    if data.get("janitor") is not None:
        spec = r.mapping(data["janitor"], ("janitor",), ("resetSeconds",))
        janitor = r.duration(
            r.required(spec, "resetSeconds", ("janitor",)), ("janitor", "resetSeconds"), positive=True
        )
    scenario = Scenario(
        name=name,
        description=description,
        source=source,
        settings=settings,
        fleet=tuple(groups.values()),
        workloads=tuple(workloads),
        timeline=tuple(sorted(timeline, key=lambda f: f.at)),
        nodes=nodes,
        janitor=janitor,
        **{key: r.section(data.get(key), (key,)) for key in _OUTER_SECTIONS},
    )
    _check_placement(r, scenario)
    return scenario


def _check_placement(r: FieldReader, scenario: Scenario) -> None:
    try:
        place_workloads(scenario)
    except PlacementError as exc:
        r.fail(("workloads", exc.index, "replicas"), exc.reason)


# ---------------------------------------------------------------------------- entry points


def parse_text(text: str, source: str = "<string>", *, default_name: str = "scenario") -> Scenario:
    data, lines = _compose(text, source)
    return _build_scenario(data, lines, source, default_name)


def from_dict(data: Mapping[str, Any], source: str = "<dict>") -> Scenario:
    """A scenario given as plain data (tests); errors name the field but no line."""
    return _build_scenario(dict(data), {}, source, str(data.get("name", "scenario")))


def load_file(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_text(text, str(path), default_name=path.stem)


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def list_builtins() -> list[tuple[str, str]]:
    """(name, one-line description) of every built-in scenario."""
    out = []
    for name in builtin_names():
        scenario = load_file(BUILTIN_DIR / f"{name}.yaml")
        out.append((name, scenario.description.strip().splitlines()[0] if scenario.description else ""))
    return out


def resolve(spec: str | Path | Mapping[str, Any] | Scenario) -> Scenario:
    """A Scenario from a built-in name, a file path, plain data or a Scenario."""
    if isinstance(spec, Scenario):
        return spec
    if isinstance(spec, Mapping):
        return from_dict(spec)
    text = str(spec)
    if isinstance(spec, Path) or "/" in text or text.endswith((".yaml", ".yml")) or Path(text).is_file():
        return load_file(text)
    if (BUILTIN_DIR / f"{text}.yaml").is_file():
        return load_file(BUILTIN_DIR / f"{text}.yaml")
    raise ScenarioError(
        f"{text}: no such built-in scenario or file (built-ins: {', '.join(builtin_names())})"
    )


def parse_fault_json(text: str | bytes, scenario: Scenario, *, now: float) -> Fault:
    """A fault given as one timeline entry in JSON (or YAML), validated like the file.

    `at` is optional and counts from the start of the run; absent, the fault applies at `now`.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ScenarioError("<request>:1: not UTF-8 text") from None
    data, lines = _compose(text, "<request>")
    r = FieldReader("<request>", lines)
    return parse_fault(r, data, (), scenario.nodes, scenario.workloads, default_at=now)


def fault_from_dict(data: Mapping[str, Any], scenario: Scenario, *, now: float) -> Fault:
    r = FieldReader("<fault>", {})
    return parse_fault(r, dict(data), (), scenario.nodes, scenario.workloads, default_at=now)
