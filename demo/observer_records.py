"""The demo observer's quarantine records: their phases, moves, release requests and checks. Pure.

`RecordWatch` diffs each DeviceQuarantine against the last version seen and journals a phase
change (PHASE, with the verdict of an ended quarantine), each migration's start and outcome
(NOTE move-started, MIGRATION), each release request and the responder's answer (REQUEST, and
the release command's refusals), and each check Job's result with the cards its pods really
reached (CHECK). A record naming a card for the first time makes its pods journaled
(`demo.observer_pods.PodWatch.device_recorded`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from demo.journal import Kind
from demo.observer_names import DELETED, DeviceNames, meta
from demo.observer_pods import CHECK_LABEL, PodWatch
from responder.checks.jobs import job_result
from responder.reconcile.policy import CheckResult
from responder.reconcile.requests import CONDITION as REQUEST_CONDITION
from responder.records import MigrationOutcome, RecordError, from_object
from responder.verdicts import verdict_of

RECORD_LABEL = "gpuhealth.io/record"


class RecordWatch:
    """DeviceQuarantines and check Jobs, as journal entries."""

    def __init__(self, names: DeviceNames, pods: PodWatch) -> None:
        self.names = names
        self.pods = pods
        self.journal = names.journal
        self._records: dict[str, tuple[str, str, str, dict[tuple[str, int], str]]] = {}
        """record name -> (phase, node, uuid, finished migration outcomes by (job, episode))."""
        self._requests: dict[str, tuple[str, str, str]] = {}
        """record name -> (requestedAt of its release request, answer status, answer reason)."""
        self._record_labels: dict[str, str] = {}
        """The record label of check Jobs (name cut to 63) -> record name."""
        self._checks_done: set[str] = set()

    def record(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        """A DeviceQuarantine's watch event."""
        if etype == DELETED:
            return
        try:
            record = from_object(dict(obj))
        except RecordError as exc:
            self.journal.record(at, Kind.NOTE, "unreadable record", detail=str(exc))
            return
        spec, status = record.spec, record.status
        uuid = spec.uuid or (
            spec.device
            if spec.device in self.journal.devices
            else self.names.of_labels({"device": spec.device})
        )
        before = self._records.get(record.name)
        phase = str(status.phase)
        outcomes = dict(before[3]) if before else {}
        if before is None or before[0] != phase:
            # An ended quarantine carries the verdict the responder counts for it (the same pure
            # function of the same record), for the summary to set beside the ground truth.
            verdict = verdict_of(record)
            self.journal.record(
                at,
                Kind.PHASE,
                phase,
                spec.node,
                uuid,
                reason=spec.reason,
                record=record.name,
                actor=spec.actor,
                action=spec.action,
                why=status.phase_reason,
                attempt=str(status.attempt),
                episode=str(status.episode),
                **({"requested": spec.release_request.actor} if spec.release_request is not None else {}),
                **({"verdict": verdict.value} if verdict is not None else {}),
            )
        if uuid:
            self.pods.device_recorded(at, uuid)
        self._request(at, record.name, spec.node, uuid, record)
        for migration in status.migrations:
            job = f"{migration.namespace}/{migration.owner.rsplit('/', 1)[-1]}"
            move = (job, migration.episode)
            if move not in outcomes:
                # The move's deadline counts from here (the safety verdict's pods left behind).
                outcomes[move] = ""
                self.journal.record(
                    at,
                    Kind.NOTE,
                    "move-started",
                    spec.node,
                    uuid,
                    record=record.name,
                    job=job,
                    episode=str(migration.episode),
                    detail=f"move of {job} off {self.journal.label(uuid)} started",
                )
            if migration.outcome is MigrationOutcome.WAITING or outcomes.get(move) == migration.outcome.value:
                continue
            outcomes[move] = migration.outcome.value
            self.journal.record(
                at,
                Kind.MIGRATION,
                migration.outcome.value.lower(),
                spec.node,
                uuid,
                job=job,
                owner=migration.owner,
                reason=migration.detail,
                record=record.name,
                episode=str(migration.episode),
                evictions=str(len(migration.evictions)),
            )
        self._records[record.name] = (phase, spec.node, uuid, outcomes)
        self._record_labels[record.name[:63].rstrip("-.")] = record.name

    def _request(self, at: float, name: str, node: str, uuid: str, record: Any) -> None:
        """REQUEST entries for a new release request and each new answer the responder gives."""
        request = record.spec.release_request
        answer = record.status.condition(REQUEST_CONDITION)
        before = self._requests.get(name, ("", "", ""))
        requested_at = request.requested_at if request is not None else ""
        state = (answer.status, answer.reason) if answer is not None and request is not None else ("", "")
        if request is not None and requested_at != before[0]:
            self.journal.record(
                at,
                Kind.REQUEST,
                "requested",
                node,
                uuid,
                record=name,
                actor=request.actor,
                message=request.reason[:300],
                by="responder",
            )
        if answer is not None and request is not None and (requested_at, *state) != before:
            self.journal.record(
                at,
                Kind.REQUEST,
                "honoured" if answer.status == "True" else "refused",
                node,
                uuid,
                record=name,
                actor=request.actor,
                reason=answer.reason,
                message=answer.message[:300],
                by="responder",
            )
        self._requests[name] = (requested_at, *state)

    def refused_by_command(self, at: float, record: str, device: str, actor: str, message: str) -> None:
        """The release command refused a request before writing it (what the record showed)."""
        known = self.journal.devices.get(device)
        self.journal.record(
            at,
            Kind.REQUEST,
            "refused",
            known.node if known else "",
            device,
            record=record,
            actor=actor,
            reason="RefusedByCommand",
            message=message[:300],
            by="command",
        )

    def record_of(self, device: str) -> str:
        """The name of the latest active record seen for `device` ('' when none)."""
        names = [n for n, (phase, _, uuid, _) in self._records.items() if uuid == device]
        active = [n for n in names if self._records[n][0] not in ("Released", "Abandoned")]
        return (active or names or [""])[-1]

    def job(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        """A Job's watch event: a check Job's result, once it has one."""
        m = meta(obj)
        labels = m.get("labels") or {}
        kind = labels.get(CHECK_LABEL)
        name = str(m.get("name", ""))
        if not kind or etype == DELETED or name in self._checks_done:
            return
        result = job_result(dict(obj))
        if result is CheckResult.RUNNING:
            return
        self._checks_done.add(name)
        record = self._record_labels.get(str(labels.get(RECORD_LABEL, "")), "")
        _, node, uuid, _ = self._records.get(record, ("", "", "", {}))
        ran_on = self.pods.check_devices(f"{m.get('namespace', '')}/{name}")
        self.journal.record(
            at,
            Kind.CHECK,
            str(kind),
            node,
            uuid,
            result="passed" if result is CheckResult.SUCCEEDED else "failed",
            job=name,
            record=record,
            attempt=str((m.get("annotations") or {}).get("gpuhealth.io/attempt", "")),
            ranOn=",".join(sorted(ran_on)),
        )
