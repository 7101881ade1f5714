"""Migration plans (responder.migrate.plan), as properties over random jobs and contexts.

Aspects: new requests stop before a checkpoint is requested (a pod behind the readiness gate
only once the kubelet has taken it out of its endpoints); a checkpoint the workload reports
failed (of this key) ends the move unrecoverable at once; a move that evicted succeeds only once
as many new pods of the job as were moved run on healthy devices (never the shards it left
alone), and fails past the replacement timeout; no move begins while the breaker is open,
one under way goes on (property); a restrict never evicts, requests or locks anything; in
checkpoint mode no pod is
evicted before its commit of this key; allow-completion never evicts; nothing is requested
or evicted without this flow holding the job's lease; a lease is taken only when free and
the node has a slot; the namespace cap holds; only target pods are evicted, shardable jobs
move only the device's shard; undeclared or late checkpoints are unrecoverable (evidence and
a tenant event, no eviction); a move past its lease cap fails once (tenant told, lease released,
nothing evicted); an eviction's answer is judged (a 429 waits at least the floor, a refusal for
good fails, a server error retries, never the other way round); the node and namespace caps
count only what the records hold within the hour (properties); a simulated world (commits,
evictions, an owner recreating pods elsewhere) ends in Succeeded with the recreated pods untouched;
every job holding the device gets one move per episode of its record, keyed by (device, job,
episode), and never a second flow while one is unfinished (property).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from responder.migrate.plan import (
    CHECKPOINT,
    CHECKPOINT_FAILED,
    CHECKPOINT_POLL_SECONDS,
    COMMITTED,
    EVICTION_RETRY_FLOOR_SECONDS,
    FAILED_REASON,
    HOUR,
    REQUESTED,
    SEVERAL_BUDGETS,
    TOPOLOGY,
    Answer,
    Context,
    Evict,
    Holder,
    JobView,
    KeepEvidence,
    MigrationSettings,
    Mode,
    PodView,
    ReleaseLease,
    RequestCheckpoint,
    StopRequests,
    TakeLease,
    TellTenant,
    choose_targets,
    evictions_left,
    judge_eviction,
    migration_key,
    moves_for,
    node_slot_free,
    plan,
)
from responder.records import Migration, MigrationOutcome

KEY = migration_key("GPU-1", "job-uid", 1)
ME = "gpu-node-1-gpu-1-abc"


@st.composite
def pods(draw: st.DrawFn) -> PodView:
    uid = draw(st.sampled_from([f"uid-{i}" for i in range(6)]))
    annotations: dict[str, str] = {}
    if draw(st.booleans()):
        annotations[CHECKPOINT] = draw(st.sampled_from(["annotation", "annotation", "none"]))
    if draw(st.booleans()):
        annotations[TOPOLOGY] = draw(st.sampled_from(["fixed", "shardable"]))
    if draw(st.booleans()):
        annotations[REQUESTED] = KEY
    if draw(st.booleans()):
        annotations[COMMITTED] = draw(st.sampled_from([KEY, "an-old-key"]))
    return PodView(
        namespace="ns",
        name=f"pod-{uid}",
        uid=uid,
        annotations=annotations,
        on_device=draw(st.booleans()),
        finished=draw(st.sampled_from([False, False, True])),
        terminating=draw(st.sampled_from([False, False, True])),
        serving_stopped=draw(st.booleans()),
        gated=draw(st.booleans()),
        ready=draw(st.booleans()),
        running_healthy=draw(st.booleans()),
    )


jobs = st.builds(
    JobView,
    namespace=st.just("ns"),
    owner=st.just("Job/train"),
    owner_uid=st.just("job-uid"),
    pods=st.lists(pods(), max_size=5, unique_by=lambda p: p.uid).map(tuple),
    lease_holder=st.sampled_from([None, ME, "someone-else"]),
)
contexts = st.builds(
    Context,
    now=st.just(1_800_000_000.0),
    action=st.sampled_from(["quarantine", "quarantine", "restrict"]),
    mode=st.sampled_from(list(Mode)),
    identity=st.just(ME),
    key=st.just(KEY),
    requested_at=st.sampled_from([None, 1_800_000_000.0 - 10, 1_800_000_000.0 - 10_000]),
    targets=st.sampled_from([None, ("uid-0", "uid-1"), ("uid-2",)]),
    node_slot_free=st.booleans(),
    namespace_evictions_left=st.integers(min_value=0, max_value=3),
    settings=st.just(MigrationSettings()),
    may_start=st.booleans(),
    started_at=st.sampled_from([None, 1_800_000_000.0 - 60, 1_800_000_000.0 - 3600, 1_800_000_000.0 - 86400]),
)


@given(jobs, contexts)
def test_the_safety_rules_hold_for_any_job(job: JobView, ctx: Context) -> None:
    result = plan(job, ctx)
    evicted = [e for e in result.effects if isinstance(e, Evict)]
    touched = [e for e in result.effects if isinstance(e, Evict | RequestCheckpoint | TakeLease)]
    by_uid = {p.uid: p for p in job.pods}
    if ctx.action == "restrict":
        assert touched == [] and result.outcome == MigrationOutcome.SUCCEEDED
    if ctx.mode == Mode.ALLOW_COMPLETION:
        assert evicted == []
    for e in evicted:
        pod = by_uid[e.uid]
        assert job.lease_holder == ctx.identity
        assert not pod.terminating and not pod.finished
        assert result.targets is not None and e.uid in result.targets
        if ctx.mode == Mode.CHECKPOINT:
            assert pod.annotations.get(COMMITTED) == KEY
            assert pod.annotations.get(CHECKPOINT) == "annotation"
    assert len(evicted) <= ctx.namespace_evictions_left
    stopped_now = {e.pod for e in result.effects if isinstance(e, StopRequests)}
    by_name = {p.name: p for p in job.pods}
    for e in result.effects:
        if isinstance(e, RequestCheckpoint):
            assert job.lease_holder == ctx.identity
            # New requests stopped first; behind the gate, the pod is out of its endpoints.
            asked = by_name[e.pod]
            assert asked.serving_stopped or (e.pod in stopped_now and not asked.gated)
            assert not (asked.gated and asked.ready)
        if isinstance(e, StopRequests):
            assert job.lease_holder == ctx.identity and ctx.mode == Mode.CHECKPOINT
        if isinstance(e, TakeLease):
            assert job.lease_holder is None and ctx.node_slot_free
            assert e.seconds <= ctx.settings.lease_cap_seconds
            # The breaker holds back the start of a move, never one under way.
            assert ctx.may_start or ctx.started_at is not None
    cap = ctx.settings.lease_cap_seconds
    if (
        ctx.started_at is not None
        and ctx.now - ctx.started_at >= cap
        and result.outcome == MigrationOutcome.FAILED
    ):
        # Past the lease cap a move stops: nothing touched, the tenant told, the lease released.
        assert touched == []
        assert {e.pod for e in result.effects if isinstance(e, TellTenant)} == {
            p.name for p in job.pods if p.on_device
        }
        assert any(isinstance(e, ReleaseLease) for e in result.effects) == (job.lease_holder == ctx.identity)
    if (
        result.outcome == MigrationOutcome.WAITING
        and ctx.started_at is not None
        and ctx.action == "quarantine"
    ):
        assert ctx.now - ctx.started_at < cap  # no move waits past its cap
    if result.outcome == MigrationOutcome.UNRECOVERABLE:
        assert evicted == [] and any(isinstance(e, KeepEvidence) for e in result.effects) == any(
            by_uid[u].on_device for u in (result.targets or ()) if u in by_uid and not by_uid[u].finished
        )


@given(jobs)
def test_shardable_jobs_move_only_the_devices_shard(job: JobView) -> None:
    targets = set(choose_targets(job))
    live_on_device = [p for p in job.pods if p.on_device and not p.finished and not p.terminating]
    if live_on_device and all(p.annotations.get(TOPOLOGY) == "shardable" for p in live_on_device):
        assert targets == {p.uid for p in live_on_device}
    else:
        assert targets == {p.uid for p in job.pods if not p.finished and not p.terminating}


def checkpointing(uid: str, on_device: bool) -> PodView:
    return PodView("ns", f"pod-{uid}", uid, {CHECKPOINT: "annotation", TOPOLOGY: "fixed"}, on_device)


def test_a_simulated_move_ends_with_the_recreated_pods_untouched() -> None:
    job = JobView("ns", "Job/train", "job-uid", (checkpointing("a", True), checkpointing("b", False)), None)
    ctx = Context(
        1_800_000_000.0, "quarantine", Mode.CHECKPOINT, ME, KEY, None, None, True, 10, MigrationSettings()
    )
    evicted: list[str] = []
    order: list[tuple[str, str]] = []
    for _ in range(30):
        result = plan(job, ctx)
        ctx = replace(ctx, targets=result.targets, kept=result.kept, now=ctx.now + 5)
        pods = {p.uid: p for p in job.pods}
        for e in result.effects:
            if isinstance(e, TakeLease):
                job = replace(job, lease_holder=e.holder)
            elif isinstance(e, StopRequests):
                order.append(("stop", e.pod))
                ctx = replace(ctx, requested_at=ctx.requested_at or ctx.now)
                pod = next(p for p in pods.values() if p.name == e.pod)
                pods[pod.uid] = replace(pod, serving_stopped=True)
            elif isinstance(e, RequestCheckpoint):
                order.append(("checkpoint", e.pod))
                pod = next(p for p in pods.values() if p.name == e.pod)
                # The workload commits at once (its own idempotent commit).
                pods[pod.uid] = replace(
                    pod, annotations={**pod.annotations, REQUESTED: e.key, COMMITTED: e.key}
                )
            elif isinstance(e, Evict):
                evicted.append(e.uid)
                ctx = replace(ctx, evicted_at=ctx.evicted_at or ctx.now)
                # Evicted: gone; the owner recreates it off the quarantined device, Pending first.
                del pods[e.uid]
                pods["new-" + e.uid] = checkpointing("new-" + e.uid, False)
            elif isinstance(e, ReleaseLease):
                job = replace(job, lease_holder=None)
        if not result.effects and result.detail.startswith("awaiting replacement"):
            # The replacements start, one a pass, on healthy devices.
            waiting = [p for p in pods.values() if p.uid.startswith("new-") and not p.running_healthy]
            pods[waiting[0].uid] = replace(waiting[0], running_healthy=True)
        job = replace(job, pods=tuple(pods.values()))
        if result.outcome == MigrationOutcome.SUCCEEDED:
            break
    assert result.outcome == MigrationOutcome.SUCCEEDED and result.recovered
    assert sorted(evicted) == ["a", "b"]  # fixed topology: the whole job, once each
    # New requests stop before each pod's checkpoint is requested.
    for pod in ("pod-a", "pod-b"):
        assert order.index(("stop", pod)) < order.index(("checkpoint", pod))
    assert job.lease_holder is None


def test_a_flow_waiting_for_commits_looks_again_soon_not_only_at_the_timeout() -> None:
    # Commits are pod annotations the reconciler does not watch: with the recheck at the
    # timeout, a 20-second commit waited the whole 10 minutes.
    job = JobView("ns", "Job/train", "job-uid", (checkpointing("a", True),), ME)
    settings = MigrationSettings(checkpoint_timeout_seconds=600.0)
    ctx = Context(100.0, "quarantine", Mode.CHECKPOINT, ME, KEY, 90.0, ("a",), True, 10, settings)
    waiting = plan(job, ctx)
    assert waiting.outcome == MigrationOutcome.WAITING and waiting.recheck_seconds == CHECKPOINT_POLL_SECONDS
    nearly = plan(job, replace(ctx, now=90.0 + 598.0))
    assert nearly.recheck_seconds == pytest.approx(2.0)


def test_work_without_a_checkpoint_is_unrecoverable_and_kept() -> None:
    pod = PodView("ns", "pod-a", "a", {}, True)
    job = JobView("ns", "Deployment/web", "d-uid", (pod,), None)
    ctx = Context(1.0, "quarantine", Mode.CHECKPOINT, ME, KEY, None, None, True, 10, MigrationSettings())
    result = plan(job, ctx)
    assert result.outcome == MigrationOutcome.UNRECOVERABLE
    assert [type(e) for e in result.effects] == [KeepEvidence, TellTenant]


def test_a_late_checkpoint_is_unrecoverable_and_the_lease_released() -> None:
    pod = checkpointing("a", True)
    job = JobView("ns", "Job/train", "job-uid", (pod,), ME)
    ctx = Context(
        10_000.0, "quarantine", Mode.CHECKPOINT, ME, KEY, 1.0, ("a",), True, 10, MigrationSettings()
    )
    result = plan(job, ctx)
    assert result.outcome == MigrationOutcome.UNRECOVERABLE and "no checkpoint committed" in result.detail
    assert isinstance(result.effects[-1], ReleaseLease)


def test_immediate_mode_evicts_without_a_checkpoint() -> None:
    job = JobView("ns", "Job/train", "job-uid", (PodView("ns", "pod-a", "a", {}, True),), ME)
    ctx = Context(1.0, "quarantine", Mode.IMMEDIATE, ME, KEY, None, None, True, 10, MigrationSettings())
    assert plan(job, ctx).effects == (Evict("ns", "pod-a", "a"),)


@pytest.mark.parametrize("bad", [{"checkpoint_timeout_seconds": 0}, {"lease_cap_seconds": float("inf")}])
def test_settings_refuse_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        MigrationSettings(**bad)  # type: ignore[arg-type]


def test_an_open_breaker_starts_no_move_but_lets_one_under_way_go_on() -> None:
    job = JobView("ns", "Job/train", "job-uid", (checkpointing("uid-0", True),), lease_holder=None)
    ctx = Context(
        now=1_800_000_000.0,
        action="quarantine",
        mode=Mode.CHECKPOINT,
        identity=ME,
        key=KEY,
        requested_at=None,
        targets=None,
        node_slot_free=True,
        namespace_evictions_left=3,
        settings=MigrationSettings(),
        may_start=False,
    )
    held_back = plan(job, ctx)
    assert held_back.outcome == MigrationOutcome.WAITING and held_back.effects == ()
    assert "circuit breaker" in held_back.detail
    # The same move once under way (its lease lapsed meanwhile): the lease is taken again.
    going_on = plan(job, replace(ctx, started_at=ctx.now - 60))
    assert [type(e) for e in going_on.effects] == [TakeLease]
    # With the lease held, a move under way stops new requests and asks for its checkpoint
    # whatever the breaker.
    holding = plan(replace(job, lease_holder=ME), ctx)
    assert [type(e) for e in holding.effects] == [StopRequests, RequestCheckpoint]


@given(
    status=st.sampled_from([None, 200, 201, 403, 404, 409, 422, 429, 500, 502, 503, 504]),
    temporary=st.booleans(),
    several=st.booleans(),
    retry_after=st.one_of(st.none(), st.floats(min_value=0, max_value=600)),
)
def test_an_evictions_answer_is_judged_once_and_for_good_only_when_retrying_cannot_help(
    status: int | None, temporary: bool, several: bool, retry_after: float | None
) -> None:
    message = f"Cannot evict pod as it would violate {SEVERAL_BUDGETS}" if several else "boom"
    verdict = judge_eviction(status, temporary=temporary, message=message, retry_after=retry_after)
    if status == 429:
        assert verdict.answer is Answer.WAIT
        assert verdict.seconds >= max(EVICTION_RETRY_FLOOR_SECONDS, retry_after or 0.0)
    elif status in (200, 201):
        assert verdict.answer is Answer.EVICTED
    elif status in (404, 409):
        assert verdict.answer is Answer.GONE
    elif status is None:
        assert verdict.answer is Answer.RETRY  # no answer at all: never a final verdict
    elif status == 500 and several:
        assert verdict.answer is Answer.FAILED  # the budgets' refusal, whatever the client thinks
    else:
        assert verdict.answer is (Answer.RETRY if temporary else Answer.FAILED)


def test_a_move_past_its_lease_cap_fails_once_and_lets_go() -> None:
    job = JobView("ns", "Job/train", "job-uid", (checkpointing("a", True), checkpointing("b", False)), ME)
    now = 1_800_000_000.0
    ctx = Context(
        now=now,
        action="quarantine",
        mode=Mode.CHECKPOINT,
        identity=ME,
        key=KEY,
        requested_at=now - 30,
        targets=("a", "b"),
        node_slot_free=True,
        namespace_evictions_left=3,
        settings=MigrationSettings(lease_cap_seconds=600),
        started_at=now - 599,
    )
    assert plan(job, ctx).outcome == MigrationOutcome.WAITING
    stopped = plan(job, replace(ctx, started_at=now - 600))
    assert stopped.outcome == MigrationOutcome.FAILED and "lease cap (600 s)" in stopped.detail
    assert stopped.effects == (
        TellTenant(
            "ns",
            "pod-a",
            FAILED_REASON,
            f"the GPU this pod uses is quarantined and moving the pod failed: {stopped.detail}",
        ),
        ReleaseLease("ns", "Job/train"),
    )


def _move(
    namespace: str, *, started: float | None, finished: bool, evictions: tuple[float, ...] = ()
) -> Migration:
    from responder.webhook.intake import rfc3339

    return Migration(
        namespace,
        "Job/x",
        "uid",
        "k",
        started_at=rfc3339(started) if started is not None else "",
        evictions=tuple(rfc3339(t) for t in evictions),
        outcome=MigrationOutcome.SUCCEEDED if finished else MigrationOutcome.WAITING,
    )


moves = st.lists(
    st.builds(
        _move,
        st.sampled_from(["ns", "other"]),
        started=st.one_of(
            st.none(), st.floats(min_value=-2 * HOUR, max_value=0).map(lambda d: 1_800_000_000.0 + d)
        ),
        finished=st.booleans(),
        evictions=st.lists(
            st.floats(min_value=-2 * HOUR, max_value=0).map(lambda d: 1_800_000_000.0 + d), max_size=4
        ).map(tuple),
    ),
    max_size=8,
)


@given(moves, st.integers(min_value=1, max_value=4), st.integers(min_value=1, max_value=6))
def test_the_caps_count_only_what_the_records_hold_within_the_hour(
    on_node: list[Migration], in_flight_limit: int, per_hour_limit: int
) -> None:
    now = 1_800_000_000.0
    free = node_slot_free(on_node, now, in_flight_limit=in_flight_limit, per_hour_limit=per_hour_limit)
    in_flight = sum(1 for m in on_node if m.started_at and not m.outcome.finished)
    recent = sum(1 for m in on_node if m.started_at and now - _at(m.started_at) < HOUR)
    assert free == (in_flight < in_flight_limit and recent < per_hour_limit)
    left = evictions_left("ns", on_node, now, per_hour_limit=per_hour_limit)
    evicted = sum(1 for m in on_node if m.namespace == "ns" for t in m.evictions if now - _at(t) < HOUR)
    assert left == max(0, per_hour_limit - evicted)
    # Finished moves and moves of the other namespace never hold a slot or an eviction back.
    assert node_slot_free(
        [m for m in on_node if m.outcome.finished and not m.started_at],
        now,
        in_flight_limit=1,
        per_hour_limit=1,
    )


def _at(stamp: str) -> float:
    from gpuhealth.kube.meta import parse_rfc3339

    at = parse_rfc3339(stamp)
    assert at is not None
    return at


TRAIN = Holder("ml", "Job/train", "uid-train")


def test_each_episode_moves_the_job_on_the_device_again_under_its_own_key() -> None:
    first = moves_for((), [TRAIN], device="GPU-1", episode=1)
    assert [(m.owner_uid, m.episode, m.key) for m in first] == [
        ("uid-train", 1, migration_key("GPU-1", "uid-train", 1))
    ]
    # Seen again within the episode: no second move, whatever the first one's outcome.
    ended = (replace(first[0], outcome=MigrationOutcome.SUCCEEDED),)
    assert moves_for(ended, [TRAIN], device="GPU-1", episode=1) == ended
    # The device quarantined again with the job (or its replacement) on it: moved again.
    second = moves_for(ended, [TRAIN], device="GPU-1", episode=2)
    assert second[:1] == ended and [(m.episode, m.outcome) for m in second[1:]] == [
        (2, MigrationOutcome.WAITING)
    ]
    assert second[1].key == migration_key("GPU-1", "uid-train", 2) != ended[0].key
    assert len({migration_key(d, "u", e) for d in ("GPU-1", "GPU-2") for e in (1, 2)}) == 4


def test_a_move_under_way_from_an_earlier_episode_goes_on_alone() -> None:
    under_way = moves_for((), [TRAIN], device="GPU-1", episode=1)
    assert moves_for(under_way, [TRAIN], device="GPU-1", episode=2) == under_way


holders = st.lists(st.sampled_from([Holder("ml", f"Job/j{i}", f"uid-{i}") for i in range(4)]), max_size=4)


@given(
    st.lists(
        st.tuples(holders, st.booleans(), st.sampled_from([*MigrationOutcome, None])),
        max_size=20,
    )
)
def test_one_move_per_job_and_episode_and_never_two_flows_for_a_job(
    passes: list[tuple[list[Holder], bool, MigrationOutcome | None]],
) -> None:
    """Passes of a record: the jobs on the device, whether a new episode began before the pass,
    and an outcome the pass's unfinished moves came to (None: unchanged)."""
    moves: tuple[Migration, ...] = ()
    episode = 1
    for on_device, new_episode, outcome in passes:
        episode += new_episode
        moves = moves_for(moves, on_device, device="GPU-1", episode=episode)
        for job in on_device:
            assert any(
                m.owner_uid == job.owner_uid and (m.episode == episode or not m.outcome.finished)
                for m in moves
            )
        pairs = [(m.owner_uid, m.episode) for m in moves]
        assert len(pairs) == len(set(pairs))
        unfinished = [m.owner_uid for m in moves if not m.outcome.finished]
        assert len(unfinished) == len(set(unfinished))
        assert len({m.key for m in moves}) == len(moves)
        if outcome is not None:  # the moves under way come to it; an ended move stays ended
            moves = tuple(m if m.outcome.finished else replace(m, outcome=outcome) for m in moves)


def holding_ctx(**changes: object) -> Context:
    base = Context(
        1_800_000_000.0, "quarantine", Mode.CHECKPOINT, ME, KEY, None, None, True, 10, MigrationSettings()
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_gated_pod_is_asked_for_its_checkpoint_only_once_out_of_its_endpoints() -> None:
    gated = replace(checkpointing("a", True), gated=True, ready=True)
    job = JobView("ns", "Job/train", "job-uid", (gated,), ME)
    first = plan(job, holding_ctx())
    assert [type(e) for e in first.effects] == [StopRequests]
    assert "leaving their Services' endpoints" in first.detail and first.recheck_seconds == 1.0
    # The condition is False, the kubelet has not yet turned Ready False: still no request.
    stopped = replace(gated, serving_stopped=True)
    assert plan(replace(job, pods=(stopped,)), holding_ctx(requested_at=1_800_000_000.0)).effects == ()
    # Out of the endpoints: the checkpoint is requested, nothing stopped twice.
    out = replace(stopped, ready=False)
    then = plan(replace(job, pods=(out,)), holding_ctx(requested_at=1_800_000_000.0))
    assert then.effects == (RequestCheckpoint("ns", "pod-a", KEY),)


def test_a_pod_that_never_leaves_its_endpoints_is_unrecoverable_at_the_checkpoint_timeout() -> None:
    stuck = replace(checkpointing("a", True), gated=True, ready=True, serving_stopped=True)
    job = JobView("ns", "Job/train", "job-uid", (stuck,), ME)
    result = plan(job, holding_ctx(requested_at=1_800_000_000.0 - 600))
    assert result.outcome == MigrationOutcome.UNRECOVERABLE
    assert not any(isinstance(e, Evict | RequestCheckpoint) for e in result.effects)


@pytest.mark.parametrize(("answer", "why"), [(KEY, ""), (f"{KEY}: disk full", "disk full")])
def test_a_failed_checkpoint_ends_the_move_unrecoverable_at_once(answer: str, why: str) -> None:
    pod = replace(
        checkpointing("a", True),
        serving_stopped=True,
        annotations={CHECKPOINT: "annotation", REQUESTED: KEY, CHECKPOINT_FAILED: answer},
    )
    job = JobView("ns", "Job/train", "job-uid", (pod,), ME)
    result = plan(job, holding_ctx(requested_at=1_800_000_000.0 - 1))  # one second, not ten minutes
    assert result.outcome == MigrationOutcome.UNRECOVERABLE
    assert result.detail == "the checkpoint of pod-a failed" + (f": {why}" if why else "")
    kinds = [type(e) for e in result.effects]
    assert kinds == [KeepEvidence, TellTenant, ReleaseLease] and Evict not in kinds
    tell = next(e for e in result.effects if isinstance(e, TellTenant))
    assert tell.reason == "GPUQuarantineUnrecoverable" and "failed" in tell.message


def test_a_failure_answered_to_an_earlier_episode_does_not_end_this_move() -> None:
    old = migration_key("GPU-1", "job-uid", 0)
    pod = replace(
        checkpointing("a", True),
        serving_stopped=True,
        annotations={CHECKPOINT: "annotation", CHECKPOINT_FAILED: old},
    )
    result = plan(JobView("ns", "Job/train", "job-uid", (pod,), ME), holding_ctx())
    assert result.outcome == MigrationOutcome.WAITING
    assert result.effects == (RequestCheckpoint("ns", "pod-a", KEY),)


def test_a_move_succeeds_only_when_the_replacements_run_on_healthy_devices() -> None:
    now = 1_800_000_000.0
    ctx = holding_ctx(targets=("a",), kept=("b",), evicted_at=now - 30)
    other_shard = replace(checkpointing("b", False), running_healthy=True)
    pending = checkpointing("new", False)  # Pending: not yet running
    job = JobView("ns", "Job/train", "job-uid", (other_shard, pending), ME)
    waiting = plan(job, ctx)
    # The shard that was never moved is no replacement; the job's lease is let go meanwhile.
    assert waiting.outcome == MigrationOutcome.WAITING and waiting.replacing
    assert waiting.effects == (ReleaseLease("ns", "Job/train"),)
    assert waiting.detail == "awaiting replacement: 0 of 1 pod(s) run on healthy devices"
    ran = plan(replace(job, pods=(other_shard, replace(pending, running_healthy=True))), ctx)
    assert ran.outcome == MigrationOutcome.SUCCEEDED and ran.recovered
    assert ran.effects == (ReleaseLease("ns", "Job/train"),)
    # Never in time: failed, once the replacement timeout has passed since the first eviction.
    late = plan(job, replace(ctx, evicted_at=now - MigrationSettings().replacement_timeout_seconds))
    assert late.outcome == MigrationOutcome.FAILED and "within 900 s (0 of 1)" in late.detail
    assert not late.recovered


def test_a_replacement_handed_the_quarantined_device_is_moved_by_the_same_move() -> None:
    now = 1_800_000_000.0
    ctx = holding_ctx(targets=("a",), kept=(), evicted_at=now - 30)
    elsewhere = replace(checkpointing("new-1", False), running_healthy=True)
    on_device = checkpointing("new-2", True)
    result = plan(JobView("ns", "Job/train", "job-uid", (elsewhere, on_device), ME), ctx)
    assert result.outcome == MigrationOutcome.WAITING and not result.replacing
    assert result.targets == ("new-2",) and result.kept == ("new-1",)
    assert [type(e) for e in result.effects] == [StopRequests, RequestCheckpoint]


def test_pods_that_end_without_an_eviction_need_no_replacement() -> None:
    done = replace(checkpointing("a", True), finished=True)
    result = plan(JobView("ns", "Job/train", "job-uid", (done,), None), holding_ctx(targets=("a",)))
    assert result.outcome == MigrationOutcome.SUCCEEDED and not result.recovered


def test_a_move_awaiting_its_replacements_holds_no_nodes_slot() -> None:
    # Its pods have left the node: a second device's move there need not wait for the job to be
    # placed elsewhere (a full node may never place it: the first move fails at its timeout).
    started = "2027-01-15T08:00:00.000000Z"
    evicting = Migration("ns", "Job/a", "a", "k1", started_at=started)
    replacing = replace(evicting, replacing_since="2027-01-15T08:01:00.000000Z")
    now = 1_800_000_000.0
    assert not node_slot_free([evicting], now, in_flight_limit=1, per_hour_limit=4)
    assert node_slot_free([replacing], now, in_flight_limit=1, per_hour_limit=4)
