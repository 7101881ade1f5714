"""Records an alert's intent in the device's `DeviceQuarantine` object (an executor over the API).

Thin: `responder.webhook.intake.decide` makes the decision; this reads the record, applies it with
writes conditional on the resourceVersion it read and, when someone else wrote first (409:
another replica, an HA peer's duplicate delivery), reads again and decides again. Every
failure becomes an outcome (`gpuhealth.outcomes`): a write that did not happen is a `Retry`,
so the webhook answers 503 and Alertmanager delivers again; nothing is answered as done
that is not in the API.

Synchronous, like `gpuhealth.kube.client.KubeClient`: the webhook runs it in a thread.

Two writes per change: the record's spec through the resource and its status through the
status subresource (the apiserver ignores status on the one and spec on the other). A crash
between them leaves a record whose status lacks the alert's key; the redelivery decides
again and completes it, changing nothing twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpuhealth.clock import Clock
from gpuhealth.kube.api import Api
from gpuhealth.kube.conflicts import retry_on_conflict
from gpuhealth.kube.errors import Conflict, NotFound
from gpuhealth.kube.resources import STATUS
from gpuhealth.outcomes import Done, Outcome, Retry, outcome_of
from responder.records import (
    QUARANTINES,
    Quarantine,
    RecordError,
    from_object,
    record_name,
    to_object,
)
from responder.webhook.alerts import Alert
from responder.webhook.intake import IntakeSettings, Write, decide, other_cluster

log = logging.getLogger(__name__)


class Recorder:
    def __init__(self, client: Api, clock: Clock, settings: IntakeSettings | None = None) -> None:
        self._client = client
        self._clock = clock
        self._settings = settings or IntakeSettings()

    def record_all(self, alerts: Sequence[Alert]) -> list[Outcome]:
        """Record a delivery's alerts one after another (each decided on a fresh read)."""
        return [self.record(alert) for alert in alerts]

    def record(self, alert: Alert) -> Outcome:
        """Record `alert` in its device's record; the outcome says whether that happened."""
        refused = other_cluster(alert, self._settings)
        if refused is not None:
            # Refused before any read: an API outage must not turn another cluster's alert
            # into a 503 that Alertmanager delivers again and again.
            log.warning("%s", refused.reason)
            return refused
        key = alert.device_key
        name = record_name(key.node, key.device) if key is not None else ""

        def attempt() -> Outcome:
            record = self._read(name) if name else None
            decision = decide(record, alert, now=self._clock.now(), settings=self._settings)
            if not isinstance(decision, Write):
                return decision
            self._write(decision, record)  # 409: someone wrote meanwhile: read and decide again
            log.info("%s: %s", decision.record.name, decision.detail)
            return Done(decision.detail)

        try:
            return retry_on_conflict(attempt, what=name)
        except Conflict as exc:
            return Retry(str(exc), 1.0)
        except RecordError as exc:
            # Someone edited the record into something unreadable; overwriting it would destroy
            # their state, so the alert waits (503) and the log says what to fix.
            log.error(
                "DeviceQuarantine %s is unreadable (%s): fix or delete it; the alert is retried", name, exc
            )
            return Retry(f"{name}: unreadable record ({exc})", 30.0)
        except Exception as exc:
            log.warning("recording %s for %s failed: %s", alert.name, name or "?", exc)
            return outcome_of(exc)

    def _read(self, name: str) -> Quarantine | None:
        try:
            return from_object(self._client.get(QUARANTINES, name))
        except NotFound:
            return None

    def _write(self, decision: Write, before: Quarantine | None) -> None:
        obj = to_object(decision.record)
        status = obj.pop("status")
        if decision.create:
            stored = self._client.create(QUARANTINES, obj)
        elif before is not None and before.spec != decision.record.spec:
            stored = self._client.update(QUARANTINES, obj)
        else:
            stored = {
                **obj,
                "metadata": {**obj["metadata"], "resourceVersion": decision.record.resource_version},
            }
        self._client.update(QUARANTINES, {**stored, "status": status}, subresource=STATUS)
