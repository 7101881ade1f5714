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

from gpuhealth.kube.resources import Resource
from responder.intake import rfc3339
from responder.records import API_VERSION, KIND, Quarantine

log = logging.getLogger(__name__)

EVENT = Resource("", "v1", "events", namespaced=True)
NAMESPACE = "default"
COMPONENT = "gpuhealth-responder"


class EventSink(Protocol):
    def emit(self, record: Quarantine, reason: str, message: str, *, warning: bool, now: float) -> None: ...


class Client(Protocol):
    def create(
        self, resource: Resource, obj: dict[str, Any], *, namespace: str | None = ...
    ) -> dict[str, Any]: ...


def event(record: Quarantine, reason: str, message: str, *, warning: bool, now: float) -> dict[str, Any]:
    """The core/v1 Event for one notice about `record` (pure)."""
    stamp = rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{record.name[:236]}.", "namespace": NAMESPACE},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": record.name,
            "uid": record.uid,
            "resourceVersion": record.resource_version,
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp[:19] + "Z",
        "lastTimestamp": stamp[:19] + "Z",
        "count": 1,
    }


class KubeEvents:
    def __init__(self, client: Client) -> None:
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
