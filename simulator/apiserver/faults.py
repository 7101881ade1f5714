"""API faults of the simulated apiserver: seeded, per verb and resource, off unless configured.

What a client of a real apiserver must survive, injected on purpose: 500 and 503 answers
(with a `Status` body; 503 with `Retry-After`), 409 Conflict on a write, 429 Too Many
Requests with `Retry-After`, slow answers, a watch stream cut off mid-way, and 410 Gone when
a watch resumes from a resourceVersion. A `FaultInjector` holds an ordered list of
`FaultRule`s; for each request the first rule that matches its verb and resource and wins
its seeded draw decides the fault (`decide`), and the HTTP layer applies it
(`Injection.answer` for the immediate ones; its watch handler for `drop-watch` and `gone`).
The same seed and the same sequence of requests give the same faults.

With no rules the HTTP layer's cost is one attribute test per request: the fault-free path
stays as it was. Faults are configured from Python on a running cluster
(`SimulatedCluster.api_faults.configure(...)`, through `ClusterHandle.call` from another
thread) or over HTTP (`/simulator/v1/api-faults`, served by `simulator.runner`), with the
JSON form `parse_config` reads::

    {"seed": 7, "rules": [
        {"kind": "error", "code": 503, "probability": 0.1, "verbs": ["list", "watch"]},
        {"kind": "conflict", "probability": 0.2, "resources": ["devicequarantines.gpuhealth.io"]},
        {"kind": "throttle", "retryAfter": 2, "limit": 5},
        {"kind": "slow", "delay": 0.5, "verbs": ["get"]},
        {"kind": "drop-watch", "after": 2.0, "resources": ["pods"]},
        {"kind": "gone", "probability": 0.5}]}

Times here (`delay`, `after`, `retryAfter`) are wall seconds: they act on the HTTP
connection, which knows nothing of the simulated clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from aiohttp import web

from simulator.apiserver.errors import ApiError, conflict

KINDS = ("error", "conflict", "throttle", "slow", "drop-watch", "gone")
"""What a rule may inject."""

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
"""Kubernetes request verbs (an eviction is a `create` of pods/eviction)."""

_APPLIES_TO: dict[str, frozenset[str]] = {
    "error": frozenset(VERBS),
    "throttle": frozenset(VERBS),
    "slow": frozenset(VERBS),
    # A Conflict answers a write whose precondition (resourceVersion, uid) failed; a create
    # collides as AlreadyExists instead, which is not this fault. Only a conditional write gets
    # one (`is_conditional`): a real apiserver retries an unconditional write itself.
    "conflict": frozenset({"update", "patch", "delete"}),
    "drop-watch": frozenset({"watch"}),
    "gone": frozenset({"watch"}),
}

ERROR_CODES = (500, 503)

WATCH_KINDS = ("drop-watch", "gone")
"""The kinds a watch meets when it starts (`FaultInjector.configure` ends the open ones)."""


class FaultConfigError(ValueError):
    """A fault configuration that cannot be used; the message names the field path."""


@dataclass(frozen=True, slots=True)
class FaultRule:
    """One kind of fault for some requests; checked when built."""

    kind: str
    """One of KINDS."""
    probability: float = 1.0
    """Chance, from 0 to 1, that a matching request gets the fault."""
    verbs: frozenset[str] = frozenset()
    """Verbs it applies to; empty: every verb the kind can apply to."""
    resources: frozenset[str] = frozenset()
    """Resources by plural (`pods`) or plural.group (`leases.coordination.k8s.io`); empty: all."""
    code: int = 500
    """`error` only: 500 InternalError or 503 ServiceUnavailable."""
    retry_after_seconds: int = 1
    """`throttle` and a 503 `error`: the Retry-After header, whole wall seconds."""
    delay_seconds: float = 0.5
    """`slow`: wall seconds the answer is held back."""
    after_seconds: float = 1.0
    """`drop-watch`: wall seconds into the stream when the connection is cut."""
    limit: int | None = None
    at_least: int = 0
    """The first `at_least` requests the rule matches while it stays configured get the fault
    whatever the draw (then `probability` decides): a fault window that is sure to meet one."""
    """At most this many injections by this rule; None: no limit."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise FaultConfigError(f"kind: expected one of {', '.join(KINDS)}, got {self.kind!r}")
        if not 0.0 <= self.probability <= 1.0:  # NaN fails both comparisons
            raise FaultConfigError(f"probability: expected a number from 0 to 1, got {self.probability!r}")
        unknown = sorted(self.verbs - set(VERBS))
        if unknown:
            raise FaultConfigError(f"verbs: {unknown[0]!r} is not one of {', '.join(VERBS)}")
        allowed = _APPLIES_TO[self.kind]
        beyond = sorted(self.verbs - allowed)
        if beyond:
            raise FaultConfigError(
                f"verbs: a {self.kind} fault applies only to {', '.join(sorted(allowed))}, not {beyond[0]!r}"
            )
        if self.code not in ERROR_CODES:
            raise FaultConfigError(
                f"code: expected one of {', '.join(map(str, ERROR_CODES))}, got {self.code!r}"
            )
        if self.retry_after_seconds < 1:
            raise FaultConfigError(
                f"retryAfter: expected whole seconds of 1 or more, got {self.retry_after_seconds!r}"
            )
        for name, value in (("delay", self.delay_seconds), ("after", self.after_seconds)):
            if not 0.0 <= value < math.inf:
                raise FaultConfigError(f"{name}: expected wall seconds of 0 or more, got {value!r}")
        if self.limit is not None and self.limit < 1:
            raise FaultConfigError(f"limit: expected a whole number of 1 or more, got {self.limit!r}")
        if not 0 <= self.at_least <= (self.limit if self.limit is not None else self.at_least):
            raise FaultConfigError(
                f"atLeast: expected a whole number from 0 to the limit, got {self.at_least!r}"
            )

    def matches(self, verb: str, resource: str, plural: str, resume: bool, conditional: bool) -> bool:
        if verb not in (self.verbs or _APPLIES_TO[self.kind]):
            return False
        if self.resources and resource not in self.resources and plural not in self.resources:
            return False
        if self.kind == "conflict":
            return conditional
        return resume or self.kind != "gone"  # only a watch that resumes can find its version gone

    def label(self) -> str:
        """How the fault is counted: `api-500`, `api-409`, `api-slow`, ..."""
        return {
            "error": f"api-{self.code}",
            "conflict": "api-409",
            "throttle": "api-429",
            "slow": "api-slow",
            "drop-watch": "api-watch-drop",
            "gone": "api-410",
        }[self.kind]


@dataclass(frozen=True, slots=True)
class Injection:
    """The fault one request gets."""

    rule: FaultRule
    target: tuple[str, str, str] = ("", "", "")
    """(plural, group, name) of the request, for the Conflict's details."""

    @property
    def drops_watch(self) -> bool:
        return self.rule.kind == "drop-watch"

    async def answer(self) -> web.Response | None:
        """Hold back a slow answer, or the error response to send instead of handling the request.

        None: handle the request (a slow one after its delay; a watch fault is the watch's to apply).
        """
        rule = self.rule
        if rule.kind == "slow":
            await asyncio.sleep(rule.delay_seconds)
            return None
        if rule.kind == "error":
            if rule.code == 503:
                err = ApiError(
                    503,
                    "ServiceUnavailable",
                    "injected fault: the server is currently unable to handle the request",
                )
                return _response(err, {"Retry-After": str(rule.retry_after_seconds)})
            return _response(
                ApiError(
                    500,
                    "InternalError",
                    "injected fault: an error on the server has prevented the request from succeeding",
                )
            )
        if rule.kind == "throttle":
            err = ApiError(
                429, "TooManyRequests", "injected fault: too many requests, please try again later"
            )
            return _response(err, {"Retry-After": str(rule.retry_after_seconds)})
        if rule.kind == "conflict":
            return _response(conflict(*self.target))
        return None

    def expired(self, resource_version: str | None, current: int) -> ApiError | None:
        """For `gone`: the 410 a watch resuming from `resource_version` gets (sent as an ERROR event)."""
        if self.rule.kind != "gone":
            return None
        return ApiError(410, "Expired", f"too old resource version: {resource_version} ({current})")

    def cut_at(self, started: float, deadline: float) -> float | None:
        """For `drop-watch`: the loop time when the stream is cut (None: it ends first, or no drop)."""
        cut = started + self.rule.after_seconds
        return cut if self.drops_watch and cut < deadline else None


class _Info(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def plural(self) -> str: ...
    @property
    def group(self) -> str: ...


class _Target(Protocol):
    """What `app.Target` offers (app imports this module, not the other way round)."""

    @property
    def info(self) -> _Info: ...
    @property
    def name(self) -> str | None: ...
    @property
    def subresource(self) -> str | None: ...


def _response(err: ApiError, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        status=err.code, body=orjson.dumps(err.status()), content_type="application/json", headers=headers
    )


def is_conditional(verb: str, body: bytes) -> bool:
    """Whether a write carries a precondition a concurrent writer can break: a resourceVersion
    in the object or merge patch, a JSON patch testing it, a delete's preconditions."""
    try:
        doc = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return False  # protobuf (kubectl create) or malformed: the handler answers that
    if isinstance(doc, list):
        return any(
            isinstance(op, dict) and op.get("op") == "test" and op.get("path") == "/metadata/resourceVersion"
            for op in doc
        )
    if not isinstance(doc, dict):
        return False
    if verb == "delete":
        preconditions = doc.get("preconditions")
        return isinstance(preconditions, dict) and any(
            preconditions.get(k) for k in ("uid", "resourceVersion")
        )
    meta = doc.get("metadata")
    return isinstance(meta, dict) and bool(meta.get("resourceVersion"))


def verb_of(method: str, *, named: bool, subresource: str | None, watch: bool) -> str | None:
    """The Kubernetes verb of a resource request (None for a method no verb names)."""
    if subresource == "eviction":
        return "create"
    if method == "GET":
        return "get" if named else ("watch" if watch else "list")
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return None


@dataclass
class FaultInjector:
    """The faults a running apiserver injects now, the seeded draws, and what it injected."""

    seed: int = 0
    rules: tuple[FaultRule, ...] = ()
    injected: Counter[str] = field(default_factory=Counter)
    """Injections so far by label (`FaultRule.label`), over every configuration since the start."""
    end_watches: Callable[[tuple[FaultRule, ...]], None] | None = None
    """Set by the HTTP layer: ends the open watches that any of these watch rules matches."""
    _used: list[int] = field(default_factory=list)
    _owed: dict[FaultRule, int] = field(default_factory=dict)
    """Injections still owed to rules with `at_least`, kept while an equal rule stays configured
    (a chaos run configures every open window again each time one opens or closes)."""
    _random: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self.configure(self.rules, seed=self.seed)

    @property
    def active(self) -> bool:
        return bool(self.rules)

    def configure(self, rules: Iterable[FaultRule], *, seed: int | None = None) -> None:
        """Replace the rules (an empty list turns faults off); a seed restarts the draws.

        A watch rule (`drop-watch`, `gone`) new in this configuration ends the open watches it
        matches, as a real apiserver ends each at its timeout: a watch decides its fault when it
        starts, and the clients' watches last minutes (300 s for the exporter's), so a window of
        a minute would otherwise rarely meet one. Each client resumes at once, and meets the rule."""
        before = self.rules
        self.rules = tuple(rules)
        self._owed = {r: self._owed.get(r, r.at_least) if r in before else r.at_least for r in self.rules}
        new_watch_rules = tuple(r for r in self.rules if r.kind in WATCH_KINDS and r not in before)
        if new_watch_rules and self.end_watches is not None:
            self.end_watches(new_watch_rules)
        self._used = [0] * len(self.rules)
        if seed is not None:
            self.seed = seed
            self._random.seed(seed)

    def clear(self) -> None:
        self.configure(())

    def decide(
        self, verb: str | None, resource: str, plural: str, *, resume: bool = False, conditional: bool = False
    ) -> Injection | None:
        """The fault this request gets, if any: the first matching rule whose draw it wins.

        `resume`: a watch from a resourceVersion; `conditional`: a write with a precondition.
        """
        if verb is None:
            return None
        for index, rule in enumerate(self.rules):
            if not rule.matches(verb, resource, plural, resume, conditional):
                continue
            if rule.limit is not None and self._used[index] >= rule.limit:
                continue
            owed = self._owed.get(rule, 0)
            if not owed and rule.probability < 1.0 and self._random.random() >= rule.probability:
                continue
            if owed:
                self._owed[rule] = owed - 1
            self._used[index] += 1
            self.injected[rule.label()] += 1
            return Injection(rule)
        return None

    async def for_request(self, request: web.Request, target: _Target) -> Injection | None:
        """`decide` for an HTTP request to a resource URL (what the HTTP layer calls)."""
        query = request.query
        watch = query.get("watch", "").lower() in ("true", "1")
        named = target.name is not None
        verb = verb_of(request.method, named=named, subresource=target.subresource, watch=watch)
        resume = watch and query.get("resourceVersion", "") not in ("", "0")
        conditional = False
        if verb in _APPLIES_TO["conflict"] and any(r.kind == "conflict" for r in self.rules):
            # aiohttp keeps the body it read, for the handler to read again.
            conditional = is_conditional(verb, await request.read())
        info = target.info
        fault = self.decide(verb, info.key, info.plural, resume=resume, conditional=conditional)
        return (
            dataclasses.replace(fault, target=(info.plural, info.group, target.name or "")) if fault else None
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "rules": [rule_to_json(rule) for rule in self.rules],
            "injected": dict(sorted(self.injected.items())),
        }


_RULE_KEYS = (
    "kind",
    "probability",
    "verbs",
    "resources",
    "code",
    "retryAfter",
    "delay",
    "after",
    "limit",
    "atLeast",
)


def rule_to_json(rule: FaultRule) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": rule.kind, "probability": rule.probability}
    if rule.verbs:
        out["verbs"] = sorted(rule.verbs)
    if rule.resources:
        out["resources"] = sorted(rule.resources)
    if rule.kind == "error":
        out["code"] = rule.code
    if rule.kind == "throttle" or (rule.kind == "error" and rule.code == 503):
        out["retryAfter"] = rule.retry_after_seconds
    if rule.kind == "slow":
        out["delay"] = rule.delay_seconds
    if rule.kind == "drop-watch":
        out["after"] = rule.after_seconds
    if rule.limit is not None:
        out["limit"] = rule.limit
    if rule.at_least:
        out["atLeast"] = rule.at_least
    return out


def _number(raw: Mapping[str, Any], key: str, path: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultConfigError(f"{path}.{key}: expected a number, got {value!r}")
    return float(value)


def _whole(raw: Mapping[str, Any], key: str, path: str, default: int | None) -> int | None:
    value = raw.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise FaultConfigError(f"{path}.{key}: expected a whole number, got {value!r}")
    return value


def _names(raw: Mapping[str, Any], key: str, path: str) -> frozenset[str]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise FaultConfigError(f"{path}.{key}: expected a list of names, got {value!r}")
    return frozenset(value)


def rule_from_json(raw: Any, path: str = "rule") -> FaultRule:
    """One rule from its JSON form; errors name `path` and the field."""
    if not isinstance(raw, Mapping):
        raise FaultConfigError(f"{path}: expected a mapping, got {raw!r}")
    unknown = sorted(set(raw) - set(_RULE_KEYS))
    if unknown:
        raise FaultConfigError(
            f"{path}.{unknown[0]}: unknown field (expected one of: {', '.join(_RULE_KEYS)})"
        )
    if "kind" not in raw:
        raise FaultConfigError(f"{path}.kind: required (one of {', '.join(KINDS)})")
    try:
        return FaultRule(
            kind=str(raw["kind"]),
            probability=_number(raw, "probability", path, 1.0),
            verbs=_names(raw, "verbs", path),
            resources=_names(raw, "resources", path),
            code=_whole(raw, "code", path, 500) or 0,
            retry_after_seconds=_whole(raw, "retryAfter", path, 1) or 0,
            delay_seconds=_number(raw, "delay", path, 0.5),
            after_seconds=_number(raw, "after", path, 1.0),
            limit=_whole(raw, "limit", path, None),
            at_least=_whole(raw, "atLeast", path, 0) or 0,
        )
    except FaultConfigError as exc:
        message = str(exc)
        raise FaultConfigError(message if message.startswith(path) else f"{path}.{message}") from None


def parse_config(raw: Any) -> tuple[int | None, tuple[FaultRule, ...]]:
    """`{"seed": N, "rules": [...]}` (seed optional): the seed and the rules, checked."""
    if not isinstance(raw, Mapping):
        raise FaultConfigError(f"expected a mapping with rules (and a seed), got {raw!r}")
    unknown = sorted(set(raw) - {"seed", "rules"})
    if unknown:
        raise FaultConfigError(f"{unknown[0]}: unknown field (expected seed and rules)")
    seed = raw.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise FaultConfigError(f"seed: expected a whole number, got {seed!r}")
    rules = raw.get("rules")
    if not isinstance(rules, list):
        raise FaultConfigError(f"rules: expected a list (empty turns faults off), got {rules!r}")
    return seed, tuple(rule_from_json(r, f"rules[{i}]") for i, r in enumerate(rules))


def configure_from_json(injector: FaultInjector, body: bytes) -> None:
    """Apply a JSON configuration body to `injector` (FaultConfigError when it is not usable)."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise FaultConfigError(f"the body is not JSON: {exc}") from None
    seed, rules = parse_config(raw)
    injector.configure(rules, seed=seed)


def describe(rules: Sequence[FaultRule]) -> str:
    """One line naming the rules, for logs and progress."""
    return ", ".join(f"{r.label()}@{r.probability:g}" for r in rules) or "none"
