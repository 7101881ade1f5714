"""The reset hand-off rung (responder.ladder.RESET, responder.reset.handoff).

Aspects: off unless configured (the shipped ladder has no reset; `reset.enabled` puts it before
the probe, a dry run takes it out); the policy walks it as a check: it asks for the reset of
each attempt once (StartReset), a reset that succeeded moves on to the probe, a failed or
timed-out one sends the device back to Quarantined with the failure counted and the backoff
doubled, its verdict kept in `lastCheck`; as a property, on the reset ladder no probe begins and
no release happens in an attempt without a reset that succeeded in it, and a failed reset never
passes; the reconciler runs the rung through its reset executor (refusing a reset ladder with
none); the executor writes the janitor's GPUReset (cluster-scoped, `spec.nodeName`,
`spec.selector.uuids`, owned by the record), once per record and attempt, reads the `Complete`
condition's reason as the outcome, and deletes its request when the record moves on; a cluster
that does not serve the kind, or forbids it, is named (at start, and on each request, which then
times out and counts as failed rather than stopping the pass); the configuration's `reset`
section with its errors.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from gpuhealth.kube.errors import AlreadyExists, Forbidden, NotFound
from gpuhealth.kube.resources import Resource
from responder import config
from responder.checks.jobs import job_name
from responder.ladder import LADDER, PROBING, RESET, Kind, with_reset, without_reset
from responder.reconcile.policy import (
    CheckResult,
    Health,
    PolicySettings,
    StartCheck,
    StartReset,
    Step,
    step,
)
from responder.records import Phase, Quarantine, Verdict
from responder.reset.handoff import ResetHandoff, ResetSettings, request_result
from tests.responder.test_policy import NOW, SETTINGS, ctx, observed, opened, resolved
from tests.responder.test_reconciler import POLICY, FakeChecks, Harness
from tests.responder.test_reconciler import SETTINGS as RECONCILER_SETTINGS

RESET_SETTINGS = replace(SETTINGS, ladder=with_reset(LADDER), reset_timeout_seconds=90)
RESETTING = RESET.phase
GPU_RESETS = Resource("janitor.dgxc.nvidia.com", "v1alpha1", "gpuresets", namespaced=False)


def test_the_shipped_ladder_has_no_reset_and_enabling_puts_it_before_the_probe() -> None:
    assert not LADDER.resets()
    assert PolicySettings().ladder == LADDER
    ladder = with_reset(LADDER)
    assert ladder.phases == (RESETTING, *LADDER.phases)
    assert ladder.rung(RESETTING) is not None and ladder.rung(RESETTING).kind == Kind.RESET  # type: ignore[union-attr]
    assert with_reset(ladder) == ladder
    assert without_reset(ladder) == LADDER
    assert ladder.describe() == f"reset, {LADDER.describe()}"


def _step(record: Quarantine, now: float, **view: Any) -> Step:
    c = ctx(now)
    return step(
        record,
        observed(**{"health": Health.HEALTHY, "enforcement_present": True, **view}),
        replace(c, settings=RESET_SETTINGS),
    )


def _quarantined() -> Quarantine:
    record = opened()
    admitted = step(record, observed(health=Health.UNHEALTHY), replace(ctx(NOW), settings=RESET_SETTINGS))
    assert admitted.record.status.phase == Phase.QUARANTINED
    return resolved(admitted.record, NOW + 1)


def test_a_reset_that_succeeds_leads_to_the_probe() -> None:
    first = _step(_quarantined(), NOW + 2)
    assert first.record.status.phase == RESETTING
    assert StartReset(1) in first.effects
    waiting = _step(first.record, NOW + 30, check=CheckResult.RUNNING)
    assert waiting.record.status.phase == RESETTING and not waiting.effects
    done = _step(first.record, NOW + 40, check=CheckResult.SUCCEEDED)
    assert done.record.status.phase == PROBING
    assert StartCheck("probe", 1) in done.effects
    assert done.record.status.last_check is not None
    assert (done.record.status.last_check.check, done.record.status.last_check.verdict) == (
        "reset",
        Verdict.PASSED,
    )


@pytest.mark.parametrize(
    ("result", "after", "why"),
    [(CheckResult.FAILED, 40, "failed"), (CheckResult.RUNNING, 95, "timed out after 90 s")],
)
def test_a_failed_or_timed_out_reset_quarantines_again_with_the_failure_counted(
    result: CheckResult, after: float, why: str
) -> None:
    resetting = _step(_quarantined(), NOW + 2).record
    failed = _step(resetting, NOW + 2 + after, check=result)
    assert failed.record.status.phase == Phase.QUARANTINED
    assert failed.record.status.failures == 1
    assert f"reset of attempt 1 {why}" in failed.record.status.history[-1].message
    assert failed.record.status.last_check is not None and failed.record.status.last_check.failed
    assert failed.record.status.retry_at  # the next attempt waits for the backoff
    assert not any(isinstance(e, StartCheck) for e in failed.effects)  # no probe of a card not reset


def test_an_absent_request_is_asked_for_again_until_the_timeout() -> None:
    resetting = _step(_quarantined(), NOW + 2).record
    again = _step(resetting, NOW + 10, check=CheckResult.ABSENT)
    assert again.effects == (StartReset(1),)


# One result per tick for whatever the record waits on (the reset, then each check).
ticks = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=120),
        st.sampled_from([Health.HEALTHY] * 12 + [Health.UNHEALTHY, Health.UNKNOWN]),
        st.sampled_from([CheckResult.SUCCEEDED] * 3 + [CheckResult.FAILED, CheckResult.RUNNING, None]),
        st.sampled_from([False] * 6 + [True]),  # the source alerts resolve
    ),
    max_size=50,
)


@settings(max_examples=300)
@given(ticks)
def test_no_probe_and_no_release_without_a_reset_that_succeeded_in_the_attempt(plan: list[tuple]) -> None:  # type: ignore[type-arg]
    record, now = _quarantined(), NOW + 2
    results: dict[tuple[int, str], CheckResult] = {}
    reset_passed: set[int] = set()
    furthest = 0
    for dt, health, finished, resolve in plan:
        now += dt
        if resolve:
            record = resolved(record, now)
        rung = RESET_SETTINGS.rungs.rung(record.status.phase)
        key = (record.status.attempt, rung.name if rung is not None else "")
        if rung is not None and rung.kind in (Kind.CHECK, Kind.RESET) and key in results and finished:
            results[key] = finished
        view = observed(
            health=health,
            healthy_since=now - 1 if health == Health.HEALTHY else None,
            enforcement_present=True,
            check=results.get(key, CheckResult.ABSENT) if rung is not None else CheckResult.ABSENT,
        )
        result = step(record, view, replace(ctx(now), settings=RESET_SETTINGS))
        after = result.record
        if record.status.phase == RESETTING and after.status.phase == PROBING:
            assert view.check == CheckResult.SUCCEEDED
            reset_passed.add(record.status.attempt)
        if after.status.phase == PROBING and record.status.phase != PROBING:
            assert after.status.attempt in reset_passed
        if after.status.phase == Phase.RELEASED:
            assert after.status.attempt in reset_passed
        if record.status.phase == RESETTING and view.check == CheckResult.FAILED:
            assert after.status.phase == Phase.QUARANTINED
            assert after.status.failures == record.status.failures + 1
        for effect in result.effects:
            if isinstance(effect, StartReset | StartCheck):
                name = "reset" if isinstance(effect, StartReset) else effect.kind
                results.setdefault((effect.attempt, name), CheckResult.RUNNING)
        furthest = max(
            furthest,
            RESET_SETTINGS.rungs.phases.index(after.status.phase) + 1
            if RESET_SETTINGS.rungs.rung(after.status.phase)
            else 0,
        )
        record = after
    target(float(furthest))


# ----- the reconciler and the executor --------------------------------------------------------


def test_the_reconciler_runs_the_rung_through_its_reset_executor() -> None:
    with pytest.raises(ValueError, match="reset hand-off"):
        Harness(replace(RECONCILER_SETTINGS, policy=replace(POLICY, ladder=with_reset(LADDER))))
    resets = FakeChecks()
    h = Harness(
        replace(RECONCILER_SETTINGS, policy=replace(POLICY, ladder=with_reset(LADDER))), resets=resets
    )
    name = h.add()
    h.reconciler.reconcile_once()
    h.resolve(name)
    h.clock.advance(61)
    record = h.client.record(name)
    h.health.set(record.spec.node, record.spec.device, Health.HEALTHY, NOW - 86400)
    h.reconciler.reconcile_once()
    record = h.client.record(name)
    assert record.status.phase == RESETTING
    assert resets.started == [(name, "reset", 1)] and not h.checks.started
    resets.complete(record, "reset", CheckResult.SUCCEEDED)
    h.clock.advance(1)
    h.reconciler.reconcile_once()
    assert h.client.record(name).status.phase == PROBING
    assert resets.finished == [(name, "reset", 1)]
    assert [kind for _, kind, _ in h.checks.started] == ["probe"]


class MemoryApi:
    """Objects by (resource, namespace, name), as an API server keeps them."""

    def __init__(self, served: tuple[str, ...] = ("v1alpha1",), refuse: Exception | None = None) -> None:
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.creates = 0
        self.served = served
        self.refuse = refuse
        """What every create raises (the kind not served, RBAC missing)."""

    def served_versions(self, group: str, plural: str) -> tuple[str, ...]:
        return self.served

    def create(
        self, resource: Resource, obj: Any, *, namespace: str | None = None, **_: Any
    ) -> dict[str, Any]:
        key = (resource.plural, namespace, obj["metadata"]["name"])
        if self.refuse is not None:
            raise self.refuse
        if key in self.objects:
            raise AlreadyExists("exists")
        self.creates += 1
        self.objects[key] = dict(obj)
        return obj

    def get(self, resource: Resource, name: str, *, namespace: str | None = None, **_: Any) -> dict[str, Any]:
        try:
            return self.objects[(resource.plural, namespace, name)]
        except KeyError:
            raise NotFound("not found") from None

    def delete(
        self, resource: Resource, name: str, *, namespace: str | None = None, **_: Any
    ) -> dict[str, Any]:
        try:
            return self.objects.pop((resource.plural, namespace, name))
        except KeyError:
            raise NotFound("not found") from None


def _record() -> Quarantine:
    record = opened()
    return replace(record, uid="uid-1", status=replace(record.status, attempt=2))


def test_the_executor_writes_the_janitors_gpureset_once_per_attempt() -> None:
    api = MemoryApi()
    handoff = ResetHandoff(api)  # type: ignore[arg-type]
    record = _record()
    assert handoff.result(record, "reset", 2) == CheckResult.ABSENT
    handoff.start(record, "reset", 2)
    handoff.start(record, "reset", 2)  # a second start (a retried pass) is a no-op
    assert api.creates == 1
    obj = api.get(GPU_RESETS, job_name(record, "reset", 2))
    assert obj["apiVersion"] == "janitor.dgxc.nvidia.com/v1alpha1" and obj["kind"] == "GPUReset"
    assert "namespace" not in obj["metadata"]  # cluster-scoped
    assert obj["spec"] == {
        "nodeName": record.spec.node,
        "selector": {"uuids": [record.spec.uuid or record.spec.device]},
    }
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert handoff.result(record, "reset", 2) == CheckResult.RUNNING
    assert handoff.result(record, "reset", 3) == CheckResult.ABSENT  # another attempt's is its own
    handoff.finish(record, "reset", 2)
    handoff.finish(record, "reset", 2)  # gone already: a no-op
    assert not api.objects


@pytest.mark.parametrize(
    ("uuid", "device"),
    [
        ("", "gpu.nvidia.com/pool/gpu-0"),
        ("MIG-4b1c9f2e-0f7a-5c2d-9e1b-3a6f8d0c2b71", "gpu.nvidia.com/pool/gpu-0-mig-1"),
    ],
)
def test_a_record_without_a_card_uuid_cannot_be_reset(uuid: str, device: str) -> None:
    api = MemoryApi()
    record = _record()
    record = replace(record, spec=replace(record.spec, uuid=uuid, device=device))
    handoff = ResetHandoff(api)  # type: ignore[arg-type]
    handoff.start(record, "reset", 2)
    assert not api.objects
    assert handoff.result(record, "reset", 2) == CheckResult.FAILED


@pytest.mark.parametrize(
    ("refuse", "logged"),
    [(NotFound("the server could not find the requested resource"), "is the reset controller installed?"),
     (Forbidden("forbidden"), "needs the RBAC of deploy/components/gpu-reset")],
)  # fmt: skip
def test_a_cluster_without_the_kind_or_the_rbac_is_named_and_the_reset_times_out(
    refuse: Exception, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    api = MemoryApi(refuse=refuse)
    record = _record()
    handoff = ResetHandoff(api)  # type: ignore[arg-type]
    handoff.start(record, "reset", 2)  # not raised: the record goes on to Resetting
    assert logged in caplog.text
    # Nothing to read: the policy times the rung out and counts the failure.
    assert handoff.result(record, "reset", 2) == CheckResult.ABSENT


def test_the_service_is_told_when_the_cluster_serves_no_reset_kind() -> None:
    assert ResetHandoff(MemoryApi()).unserved() is None  # type: ignore[arg-type]
    missing = ResetHandoff(MemoryApi(served=())).unserved()  # type: ignore[arg-type]
    assert missing is not None and "serves no gpuresets.janitor.dgxc.nvidia.com/v1alpha1:" in missing
    other = ResetHandoff(MemoryApi(served=("v1beta1",))).unserved()  # type: ignore[arg-type]
    assert other is not None and "(served: v1beta1)" in other


def _complete(status: str, reason: str) -> dict[str, Any]:
    return {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "Complete", "status": status, "reason": reason},
            ]
        }
    }


@pytest.mark.parametrize(
    ("obj", "result"),
    [
        ({}, CheckResult.RUNNING),
        (
            {"status": {"phase": "InProgress", "conditions": [{"type": "Ready", "status": "True"}]}},
            CheckResult.RUNNING,
        ),
        (_complete("False", "Pending"), CheckResult.RUNNING),
        (_complete("True", "GPUResetSucceeded"), CheckResult.SUCCEEDED),
        # The janitor marks a failed reset Complete too, with the failure as the reason.
        (_complete("True", "ResetJobFailed"), CheckResult.FAILED),
        (_complete("True", "ServiceTeardownTimeoutExceeded"), CheckResult.FAILED),
    ],
)
def test_the_outcome_is_the_complete_conditions_reason(obj: dict[str, Any], result: CheckResult) -> None:
    assert request_result(obj, ResetSettings()) == result


def test_another_controllers_shape_is_configurable() -> None:
    s = ResetSettings(
        group="reset.example.com", version="v1", kind="CardReset", plural="cardresets",
        namespace="ops", node_field="spec.node", uuids_field="spec.cards",
        complete_condition="Done", succeeded_reason="Reset",
    )  # fmt: skip
    api = MemoryApi()
    record = _record()
    ResetHandoff(api, s).start(record, "reset", 2)  # type: ignore[arg-type]
    ((key, obj),) = api.objects.items()
    assert key[:2] == ("cardresets", "ops")
    assert obj["metadata"]["namespace"] == "ops"
    assert obj["spec"] == {"node": record.spec.node, "cards": [record.spec.uuid or record.spec.device]}
    assert (
        request_result({"status": {"conditions": [{"type": "Done", "status": "True", "reason": "Reset"}]}}, s)
        == CheckResult.SUCCEEDED
    )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"group": "Not A Group"}, "group must be a DNS name"),
        ({"uuids_field": "uuids"}, "uuids_field must be a dotted path"),
        ({"kind": " "}, "kind must not be empty"),
    ],
)
def test_bad_reset_settings_are_refused(bad: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ResetSettings(**bad)  # type: ignore[arg-type]


# ----- configuration --------------------------------------------------------------------------


def _settings() -> Any:
    from responder.settings import ResponderSettings

    return ResponderSettings(token="t", identity="me", prometheus_url="http://prometheus:9090")


def test_reset_enabled_puts_the_rung_on_the_ladder_and_timeout_times_it() -> None:
    off = config.apply({}, _settings(), "cfg.yaml")
    assert off.reconciler.policy.ladder == LADDER
    on = config.apply(
        {"reset": {"enabled": True, "timeout": "5m", "kind": "GPUReset", "namespace": ""}},
        _settings(),
        "cfg.yaml",
    )
    assert on.reconciler.policy.ladder == with_reset(LADDER)
    assert on.reconciler.policy.rungs.rung(RESETTING).seconds == 300  # type: ignore[union-attr]
    assert (
        config.apply({"reset": {"enabled": False}}, _settings(), "cfg.yaml").reconciler.policy.ladder
        == LADDER
    )


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"reset": {"enabled": "yes"}}, "cfg.yaml: reset.enabled: 'yes' must be true or false"),
        ({"reset": {"timeout": "0s"}}, "cfg.yaml: reset.timeout: "),
        ({"reset": {"namespace": "Not_A_Namespace"}}, "cfg.yaml: reset.namespace: "),
        ({"reset": {"uuids_field": "uuids"}}, "cfg.yaml: .*uuids_field must be a dotted path"),
        ({"reset": {"resource": "x"}}, "cfg.yaml: reset.resource: unknown key"),
    ],
)
def test_a_bad_reset_section_is_refused_with_the_key(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        config.apply(doc, _settings(), "cfg.yaml")
