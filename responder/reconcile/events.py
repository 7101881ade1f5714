"""Kubernetes Events on quarantine records: what `Notify` effects become (an adapter).

Events of a cluster-scoped object live in `default`, as kubectl looks for them
(`kubectl describe devicequarantine <name>` lists them). Each notice is a new core/v1 Event
named `<record>.<random>` (generateName: two notices in one pass share a
timestamp): kubectl and dashboards read `reason` and `message`; a record's
history keeps the durable account, so an Event lost (they expire after an hour) loses nothing.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from gpuhealth.kube.api import Api
from gpuhealth.kube.events import EVENT, core_event
from responder.records import API_VERSION, KIND, Quarantine

log = logging.getLogger(__name__)

NAMESPACE = "default"
COMPONENT = "gpuhealth-responder"


class EventSink(Protocol):
    def emit(self, record: Quarantine, reason: str, message: str, *, warning: bool, now: float) -> None: ...


def event(record: Quarantine, reason: str, message: str, *, warning: bool, now: float) -> dict[str, Any]:
    """The core/v1 Event for one notice about `record` (pure)."""
    involved = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": record.name,
        "uid": record.uid,
        "resourceVersion": record.resource_version,
    }
    return core_event(
        involved=involved,
        namespace=NAMESPACE,
        reason=reason,
        message=message,
        warning=warning,
        now=now,
        component=COMPONENT,
        generate_name=f"{record.name[:236]}.",
    )


class KubeEvents:
    def __init__(self, client: Api) -> None:
        self._client = client

    def emit(self, record: Quarantine, reason: str, message: str, *, warning: bool, now: float) -> None:
        log.log(logging.WARNING if warning else logging.INFO, "%s: %s: %s", record.name, reason, message)
        self._client.create(
            EVENT, event(record, reason, message, warning=warning, now=now), namespace=NAMESPACE
        )


class RecordedEvents:
    """Keeps every notice (tests)."""

    def __init__(self) -> None:
        self.notices: list[tuple[str, str, str, bool]] = []

    def emit(self, record: Quarantine, reason: str, message: str, *, warning: bool, now: float) -> None:
        self.notices.append((record.name, reason, message, warning))

    def reasons(self, name: str | None = None) -> list[str]:
        return [reason for record, reason, _, _ in self.notices if name is None or record == name]
