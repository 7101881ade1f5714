"""The circuit breaker's persisted state: a ConfigMap, so a restart or a new leader keeps it.

An adapter over the API. One ConfigMap (`gpuhealth-breaker` in the responder's namespace)
holds the state (`state`: tripped, trigger, when, the counts that tripped it) and an audit
trail (`history`: every trip and every reset with who, why and what was done with the
backlog), both JSON. Written by read-modify-write at its resourceVersion: the leader trips
it, a person resets it (`gpuhealth breaker reset`), and neither overwrites the other.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import orjson

from gpuhealth.kube.api import Api
from gpuhealth.kube.conflicts import retry_on_conflict
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.resources import CONFIG_MAP
from responder.reconcile.breaker import BreakerState

NAME = "gpuhealth-breaker"
MAX_HISTORY = 100
"""Audit entries kept (oldest dropped first)."""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    time: str
    action: str
    """`trip` or `reset`."""
    actor: str
    reason: str
    backlog: str = ""
    """For a reset: `discard` or `reevaluate`."""


@dataclass(frozen=True, slots=True)
class Stored:
    state: BreakerState
    history: tuple[AuditEntry, ...]


class BreakerStore:
    def __init__(self, client: Api, namespace: str) -> None:
        self._client = client
        self._namespace = namespace

    def read(self) -> Stored:
        """The stored state; a breaker never tripped reads closed with no history."""
        try:
            return _decode(self._client.get(CONFIG_MAP, NAME, namespace=self._namespace))
        except NotFound:
            return Stored(BreakerState(), ())

    def write(self, state: BreakerState, entry: AuditEntry) -> Stored:
        """Set `state` and append `entry` to the audit trail (conditional; re-read on conflict)."""

        def attempt() -> Stored:
            try:
                current = self._client.get(CONFIG_MAP, NAME, namespace=self._namespace)
            except NotFound:
                current = None
            history = (*_decode(current).history, entry)[-MAX_HISTORY:] if current else (entry,)
            data = {"state": _encode_state(state), "history": _encode_history(history)}
            if current is None:
                self._client.create(CONFIG_MAP, _config_map(self._namespace, data), namespace=self._namespace)
            else:
                self._client.update(CONFIG_MAP, {**current, "data": data})
            return Stored(state, history)

        return retry_on_conflict(attempt, what=f"ConfigMap {self._namespace}/{NAME}")


def _config_map(namespace: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": NAME,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpuhealth"},
        },
        "data": data,
    }


def _encode_state(state: BreakerState) -> str:
    return orjson.dumps(
        {
            "tripped": state.tripped,
            "trigger": state.trigger,
            "trippedAt": state.tripped_at,
            "detail": state.detail,
            "discardedBefore": state.discarded_before,
        }
    ).decode()


def _encode_history(history: tuple[AuditEntry, ...]) -> str:
    return orjson.dumps(
        [
            {"time": e.time, "action": e.action, "actor": e.actor, "reason": e.reason, "backlog": e.backlog}
            for e in history
        ]
    ).decode()


def _decode(obj: dict[str, Any] | None) -> Stored:
    """The state in the ConfigMap; unreadable parts read as a tripped breaker (the safe side)."""
    data = (obj or {}).get("data") or {}
    try:
        raw = orjson.loads(data.get("state") or "{}")
        state = BreakerState(
            tripped=bool(raw.get("tripped", False)),
            trigger=str(raw.get("trigger") or ""),
            tripped_at=float(raw["trippedAt"]) if raw.get("trippedAt") is not None else None,
            detail=str(raw.get("detail") or ""),
            discarded_before=(
                float(raw["discardedBefore"]) if raw.get("discardedBefore") is not None else None
            ),
        )
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        state = BreakerState(
            tripped=True, trigger="unreadable", detail=f"ConfigMap {NAME} holds no readable state"
        )
    history: list[AuditEntry] = []
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError):
        for item in orjson.loads(data.get("history") or "[]"):
            history.append(
                AuditEntry(
                    time=str(item.get("time", "")),
                    action=str(item.get("action", "")),
                    actor=str(item.get("actor", "")),
                    reason=str(item.get("reason", "")),
                    backlog=str(item.get("backlog", "")),
                )
            )
    return Stored(state, tuple(history))
