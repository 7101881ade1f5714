"""Scheduler extenders: the KubeSchedulerConfiguration that names them, and their HTTP calls.

`load_scheduler_config(path)` reads a `kubescheduler.config.k8s.io/v1` KubeSchedulerConfiguration
(YAML or JSON) and returns its `extenders[]` as `ExtenderConfig`s, refusing what the simulated
scheduler does not do with a `SchedulerConfigError` naming the file and field. `Extender` calls
one extender with the JSON shapes of kube-scheduler's extender API (`ExtenderArgs` with the
pod and either the full `v1.NodeList` or, nodeCacheCapable, only `NodeNames`; answers
`ExtenderFilterResult` and `HostPriorityList`), over aiohttp so a slow extender never blocks
the fleet's event loop. Field names are matched case-insensitively, as Go's JSON decoder does.
`extend` is the scheduler's extender step for one pod over every configured extender.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from gpuhealth.durations import DurationError, parse_duration

log = logging.getLogger(__name__)

DEFAULT_HTTP_TIMEOUT = 5.0
"""Seconds; kube-scheduler's default `httpTimeout` for an extender."""
MAX_EXTENDER_PRIORITY = 10
MAX_NODE_SCORE = 100


NodeLoader = Callable[[str], dict[str, Any]]
"""A Node object by name (only read for extenders that are not nodeCacheCapable)."""


class SchedulerConfigError(ValueError):
    """A KubeSchedulerConfiguration the simulated scheduler cannot use; the message says where."""


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    url_prefix: str
    filter_verb: str = ""
    prioritize_verb: str = ""
    weight: int = 1
    node_cache_capable: bool = False
    managed_resources: tuple[tuple[str, bool], ...] = ()
    """(resource name, ignoredByScheduler)."""
    ignorable: bool = False
    http_timeout: float = DEFAULT_HTTP_TIMEOUT

    def interested(self, requests: Mapping[str, int]) -> bool:
        """Called for a pod only when it requests a managed resource (every pod when none are named)."""
        if not self.managed_resources:
            return True
        return any(requests.get(name, 0) > 0 for name, _ in self.managed_resources)

    def ignored_resources(self) -> frozenset[str]:
        return frozenset(name for name, ignored in self.managed_resources if ignored)


def _field(
    where: str, entry: Mapping[str, Any], name: str, kind: type | tuple[type, ...], default: Any
) -> Any:
    value = entry.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and kind is int:
        raise SchedulerConfigError(f"{where}.{name}: must be an integer, not {value!r}")
    if not isinstance(value, kind):
        raise SchedulerConfigError(f"{where}.{name}: invalid value {value!r}")
    return value


def parse_scheduler_config(doc: Any, source: str = "<config>") -> tuple[ExtenderConfig, ...]:
    """The extenders of a KubeSchedulerConfiguration document."""
    if not isinstance(doc, dict):
        raise SchedulerConfigError(f"{source}: not a KubeSchedulerConfiguration object")
    api_version = doc.get("apiVersion")
    if api_version != "kubescheduler.config.k8s.io/v1":
        raise SchedulerConfigError(
            f"{source}: apiVersion {api_version!r} is not kubescheduler.config.k8s.io/v1"
        )
    if doc.get("kind") != "KubeSchedulerConfiguration":
        raise SchedulerConfigError(f"{source}: kind {doc.get('kind')!r} is not KubeSchedulerConfiguration")
    extenders = doc.get("extenders") or []
    if not isinstance(extenders, list):
        raise SchedulerConfigError(f"{source}: extenders: must be a list")
    out = []
    for i, entry in enumerate(extenders):
        where = f"{source}: extenders[{i}]"
        if not isinstance(entry, dict):
            raise SchedulerConfigError(f"{where}: must be an object")
        url = _field(where, entry, "urlPrefix", str, "")
        if not url.startswith("http://"):
            raise SchedulerConfigError(f"{where}.urlPrefix: must be an http:// URL, not {url!r}")
        if _field(where, entry, "enableHTTPS", bool, False):
            raise SchedulerConfigError(
                f"{where}.enableHTTPS: HTTPS extenders are not supported by the simulator"
            )
        if entry.get("bindVerb"):
            raise SchedulerConfigError(
                f"{where}.bindVerb: extenders that bind are not supported by the simulator"
            )
        if entry.get("preemptVerb"):
            raise SchedulerConfigError(f"{where}.preemptVerb: the simulated scheduler does not preempt")
        weight = _field(where, entry, "weight", int, 1)
        prioritize = _field(where, entry, "prioritizeVerb", str, "")
        if prioritize and weight <= 0:
            raise SchedulerConfigError(f"{where}.weight: must have a positive weight applied to it")
        timeout_text = entry.get("httpTimeout")
        try:
            timeout = (
                DEFAULT_HTTP_TIMEOUT
                if timeout_text in (None, "")
                else parse_duration(timeout_text, bare_seconds=False)
            )
        except DurationError as exc:
            raise SchedulerConfigError(f"{where}.httpTimeout: {exc}") from exc
        managed = []
        for j, res in enumerate(_field(where, entry, "managedResources", list, [])):
            if not isinstance(res, dict) or not isinstance(res.get("name"), str) or not res["name"]:
                raise SchedulerConfigError(f"{where}.managedResources[{j}].name: Required value")
            managed.append((res["name"], bool(res.get("ignoredByScheduler", False))))
        out.append(
            ExtenderConfig(
                url_prefix=url.rstrip("/"),
                filter_verb=_field(where, entry, "filterVerb", str, ""),
                prioritize_verb=prioritize,
                weight=weight,
                node_cache_capable=_field(where, entry, "nodeCacheCapable", bool, False),
                managed_resources=tuple(managed),
                ignorable=_field(where, entry, "ignorable", bool, False),
                http_timeout=timeout,
            )
        )
    return tuple(out)


def load_scheduler_config(path: str | Path) -> tuple[ExtenderConfig, ...]:
    """Read a KubeSchedulerConfiguration file; `SchedulerConfigError` names the file and field."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SchedulerConfigError(f"{path}: {exc.strerror or exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SchedulerConfigError(f"{path}: not YAML or JSON: {exc}") from exc
    return parse_scheduler_config(doc, str(path))


class ExtenderError(Exception):
    """A failed extender call (transport, timeout, bad answer, or its `Error` field)."""


def _get(obj: Mapping[str, Any], name: str) -> Any:
    """A field of a Go-decoded struct: the exact name first, then any casing."""
    if name in obj:
        return obj[name]
    lowered = name.lower()
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


@dataclass(frozen=True, slots=True)
class FilterResult:
    passed: tuple[str, ...]
    failed: Mapping[str, str]
    """Node -> reason, FailedNodes and FailedAndUnresolvableNodes together."""


class Extender:
    """One configured extender, called with a shared aiohttp session."""

    def __init__(self, config: ExtenderConfig) -> None:
        self.config = config

    async def _post(self, session: aiohttp.ClientSession, verb: str, args: dict[str, Any]) -> Any:
        url = f"{self.config.url_prefix}/{verb}"
        try:
            async with asyncio.timeout(self.config.http_timeout):
                async with session.post(
                    url, data=orjson.dumps(args), headers={"Content-Type": "application/json"}
                ) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise ExtenderError(f"failed {verb} with extender at URL {url}, code {resp.status}")
        except TimeoutError as exc:
            raise ExtenderError(
                f"failed {verb} with extender at URL {url}: timeout after {self.config.http_timeout:g}s"
            ) from exc
        except aiohttp.ClientError as exc:
            raise ExtenderError(f"failed {verb} with extender at URL {url}: {exc}") from exc
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ExtenderError(f"failed {verb} with extender at URL {url}: invalid JSON: {exc}") from exc

    def _args(self, pod: dict[str, Any], names: Sequence[str], load: NodeLoader) -> dict[str, Any]:
        """ExtenderArgs: node names to a nodeCacheCapable extender, whole Node objects otherwise."""
        if self.config.node_cache_capable:
            return {"Pod": pod, "Nodes": None, "NodeNames": list(names)}
        items = [load(n) for n in names]
        return {"Pod": pod, "Nodes": {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items},
                "NodeNames": None}  # fmt: skip

    async def filter(
        self, session: aiohttp.ClientSession, pod: dict[str, Any], names: Sequence[str], load: NodeLoader
    ) -> FilterResult:
        result = await self._post(session, self.config.filter_verb, self._args(pod, names, load))
        if not isinstance(result, dict):
            raise ExtenderError("the extender's filter answer is not an ExtenderFilterResult object")
        error = _get(result, "Error")
        if error:
            raise ExtenderError(str(error))
        failed: dict[str, str] = {}
        for key in ("FailedNodes", "FailedAndUnresolvableNodes"):
            value = _get(result, key)
            if isinstance(value, dict):
                failed.update({str(k): str(v) for k, v in value.items()})
        if self.config.node_cache_capable:
            names = _get(result, "NodeNames")
            passed = [str(n) for n in names] if isinstance(names, list) else []
        else:
            node_list = _get(result, "Nodes")
            items = _get(node_list, "items") if isinstance(node_list, dict) else None
            passed = [
                str((item.get("metadata") or {}).get("name"))
                for item in items or ()
                if isinstance(item, dict)
            ]
        return FilterResult(tuple(passed), failed)

    async def prioritize(
        self, session: aiohttp.ClientSession, pod: dict[str, Any], names: Sequence[str], load: NodeLoader
    ) -> dict[str, int]:
        """Node -> the extender's score (0-10) times its weight, scaled to node-score range."""
        result = await self._post(session, self.config.prioritize_verb, self._args(pod, names, load))
        if not isinstance(result, list):
            raise ExtenderError("the extender's prioritize answer is not a HostPriorityList")
        scale = MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY
        out: dict[str, int] = {}
        for item in result:
            if not isinstance(item, dict):
                continue
            host, score = _get(item, "Host"), _get(item, "Score")
            if isinstance(host, str) and isinstance(score, int) and not isinstance(score, bool):
                out[host] = score * self.config.weight * scale
        return out


async def extend(
    extenders: Sequence[Extender],
    session: aiohttp.ClientSession | None,
    pod: dict[str, Any],
    requests: Mapping[str, int],
    feasible: list[str],
    load: NodeLoader,
) -> tuple[list[str], dict[str, str], dict[str, int]]:
    """kube-scheduler's extender step for one pod: every interested extender's filter in turn
    (an ignorable one that fails is skipped), then their priorities over what passed.

    Returns (the nodes still feasible, node -> why an extender filtered it out, node -> the
    extenders' summed scores). A failed prioritize call is logged and ignored, as kube-scheduler
    does; a failed filter of a non-ignorable extender raises ExtenderError."""
    failed: dict[str, str] = {}
    scores: dict[str, int] = {}
    interested = [e for e in extenders if e.config.interested(requests)]
    if not interested or session is None:
        return feasible, failed, scores
    for extender in interested:
        if not extender.config.filter_verb or not feasible:
            continue
        try:
            result = await extender.filter(session, pod, feasible, load)
        except ExtenderError:
            if extender.config.ignorable:
                continue
            raise
        allowed = set(result.passed)
        failed.update(result.failed)
        for name in feasible:
            if name not in allowed and name not in failed:
                failed[name] = "node(s) were filtered out by the extender"
        feasible = [n for n in feasible if n in allowed]
    for extender in interested:
        if not extender.config.prioritize_verb or len(feasible) < 2:
            continue
        try:
            for host, score in (await extender.prioritize(session, pod, feasible, load)).items():
                scores[host] = scores.get(host, 0) + score
        except ExtenderError as exc:
            log.info("scheduler: extender prioritize failed, ignored: %s", exc)
    return feasible, failed, scores
