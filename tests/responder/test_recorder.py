"""The recorder's conflict handling (responder.webhook.recorder) against an in-memory API with
resourceVersions, driven through the interleavings two replicas can produce.

Aspects: a replica that reads a record between another's two writes (spec, then status)
completes it rather than leaving it without its opening history; a conflict on the status
write is re-read and decided again (the key found: nothing done twice); conflicts that never
end become a Retry; API errors become outcomes, never exceptions.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from gpuhealth.clock import ManualClock
from gpuhealth.kube.errors import AlreadyExists, Conflict, NotFound, Unavailable
from gpuhealth.kube.resources import Resource
from gpuhealth.outcomes import Done, Retry, Unchanged
from responder.records import from_object
from responder.webhook.alerts import parse_alert
from responder.webhook.recorder import Recorder
from tests.responder.test_recorder_simulated import ALERT, NAME


class MemoryApi:
    """Objects by name with a resourceVersion each; status and spec written separately."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 0
        self.after_write: Callable[[str], None] | None = None
        self.fail_with: Exception | None = None
        self.conflict_always = False

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)

    def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        if self.fail_with:
            raise self.fail_with
        if name not in self.objects:
            raise NotFound("not found", details={"name": name})
        return copy.deepcopy(self.objects[name])

    def create(
        self, resource: Resource, obj: dict[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        if name in self.objects:
            raise AlreadyExists("exists")
        stored = self._stamp({k: copy.deepcopy(v) for k, v in obj.items() if k != "status"})
        self.objects[name] = copy.deepcopy(stored)
        if self.after_write:
            self.after_write("create")
        return stored

    def update(
        self, resource: Resource, obj: dict[str, Any], *, subresource: str | None = None
    ) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        current = self.objects[name]
        if (
            self.conflict_always
            or obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]
        ):
            raise Conflict("the object has been modified")
        if subresource == "status":
            current["status"] = copy.deepcopy(obj["status"])
        else:
            current["spec"] = copy.deepcopy(obj["spec"])
        stored = self._stamp(current)
        if self.after_write:
            self.after_write(subresource or "update")
        return stored


def test_a_replica_reading_between_the_two_writes_completes_the_record() -> None:
    api = MemoryApi()
    first, second = Recorder(api, ManualClock()), Recorder(api, ManualClock())
    outcomes = []

    def interleave(write: str) -> None:
        if write == "create" and not outcomes:
            api.after_write = None
            outcomes.append(second.record(parse_alert(ALERT)))  # B runs between A's create and status

    api.after_write = interleave
    outcomes.append(first.record(parse_alert(ALERT)))
    assert [type(o) for o in outcomes] == [Done, Unchanged]  # B completed it; A then found its key
    record = from_object(api.objects[NAME])
    assert [h.message for h in record.status.history] == ["GPUDeviceUnhealthy fired: quarantine recorded"]
    assert len(record.status.processed_keys) == 1


def test_endless_conflicts_are_a_retry() -> None:
    api = MemoryApi()
    assert isinstance(Recorder(api, ManualClock()).record(parse_alert(ALERT)), Done)
    api.conflict_always = True
    again = copy.deepcopy(ALERT) | {"status": "resolved"}
    outcome = Recorder(api, ManualClock()).record(parse_alert(again))
    assert isinstance(outcome, Retry) and "still conflicting" in outcome.reason


def test_api_errors_are_outcomes() -> None:
    api = MemoryApi()
    api.fail_with = Unavailable("connection refused")
    outcome = Recorder(api, ManualClock()).record(parse_alert(ALERT))
    assert isinstance(outcome, Retry) and "connection refused" in outcome.reason
