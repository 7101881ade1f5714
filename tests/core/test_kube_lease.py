"""The Lease election's pure parts: settings, the record, observing, deciding.

Aspects: settings contradictions refused with the rule they break; the record read from and
written to a Lease spec (MicroTime with six digits, malformed fields read as unset); the
observation clock restarts only when the record changes; each decision (create, renew
keeping acquireTime and transitions, wait while another holds, acquire once expired or
released); expiry judged on the local monotonic clock, never on renewTime; and, with
hypothesis, over any interleaving of reads, conditional writes, releases and time: never
two candidates that both judge themselves leading, and never leading past the renew
deadline without a successful write.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.kube.lease import (
    Action,
    ElectionSettings,
    LeaseRecord,
    Observed,
    decide,
    next_retry_delay,
    observe,
    release_record,
    still_leading,
)
from gpuhealth.kube.meta import rfc3339

T0 = 1_795_000_000.0  # 2026-11-18, a wall time for stamps
DEFAULTS = ElectionSettings()


# ----- settings ---------------------------------------------------------------------------


def test_defaults_are_client_go_s() -> None:
    assert (
        DEFAULTS.lease_duration_seconds,
        DEFAULTS.renew_deadline_seconds,
        DEFAULTS.retry_period_seconds,
    ) == (
        15,
        10.0,
        2.0,
    )
    assert DEFAULTS.jitter_factor == 1.2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"renew_deadline_seconds": 15.0},
            "renew_deadline_seconds (15.0) must be less than lease_duration_seconds",
        ),
        (
            {"retry_period_seconds": 9.0},
            "must be greater than retry_period_seconds times jitter_factor (9.0 * 1.2)",
        ),
        ({"lease_duration_seconds": 0}, "lease_duration_seconds must be a positive number of seconds, got 0"),
        ({"lease_duration_seconds": 15.5}, "lease_duration_seconds must be whole seconds, got 15.5"),
        ({"retry_period_seconds": float("nan")}, "retry_period_seconds must be a positive number"),
        ({"jitter_factor": -1.0}, "jitter_factor must be zero or more"),
    ],
)
def test_contradictory_settings_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match="leader election settings: .*" + _escaped(message)):
        ElectionSettings(**kwargs)  # type: ignore[arg-type]


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_a_whole_float_lease_duration_is_taken_as_an_integer() -> None:
    settings = ElectionSettings(lease_duration_seconds=20.0)  # type: ignore[arg-type]
    assert settings.lease_duration_seconds == 20 and isinstance(settings.lease_duration_seconds, int)


def test_a_candidate_s_wait_is_jittered_within_the_factor() -> None:
    assert next_retry_delay(DEFAULTS, 0.0) == 2.0
    assert next_retry_delay(DEFAULTS, 0.999999) == pytest.approx(4.4, abs=1e-5)


# ----- the record -------------------------------------------------------------------------


def test_micro_time_has_six_fractional_digits_in_utc() -> None:
    assert rfc3339(1_796_032_800.0) == "2026-11-30T10:00:00.000000Z"
    assert rfc3339(1_796_032_800.25) == "2026-11-30T10:00:00.250000Z"


def test_the_record_round_trips_through_a_lease_spec() -> None:
    record = LeaseRecord("responder-0", 15, 1_796_032_800.5, 1_796_032_812.125, 3)
    spec = record.to_spec()
    assert spec == {
        "holderIdentity": "responder-0",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-11-30T10:00:00.500000Z",
        "renewTime": "2026-11-30T10:00:12.125000Z",
        "leaseTransitions": 3,
    }
    assert LeaseRecord.from_lease({"spec": spec}) == record


def test_malformed_fields_read_as_unset() -> None:
    spec = {
        "holderIdentity": 7,
        "leaseDurationSeconds": "15",
        "renewTime": "yesterday",
        "leaseTransitions": -2,
    }
    assert LeaseRecord.from_spec(spec) == LeaseRecord()
    assert LeaseRecord.from_lease({"metadata": {}}) == LeaseRecord()
    assert LeaseRecord.from_lease(None) == LeaseRecord()


# ----- observing and deciding -------------------------------------------------------------


def held(holder: str, transitions: int = 0, *, renew: float = T0, duration: int = 15) -> LeaseRecord:
    return LeaseRecord(holder, duration, T0, renew, transitions)


def test_the_observation_clock_restarts_only_when_the_record_changes() -> None:
    first = observe(None, held("a"), 100.0)
    assert first.observed_at == 100.0
    assert observe(first, held("a"), 110.0) is first
    renewed = observe(first, held("a", renew=T0 + 2), 112.0)
    assert renewed.observed_at == 112.0
    assert renewed.expires_at == 127.0


def test_no_lease_is_created_holding_it() -> None:
    decision = decide(None, identity="b", settings=DEFAULTS, now_wall=T0, now_monotonic=5.0)
    assert decision.action is Action.CREATE
    assert decision.record == LeaseRecord("b", 15, T0, T0, 0)


def test_the_holder_renews_keeping_acquire_time_and_transitions() -> None:
    mine = Observed(LeaseRecord("b", 15, T0 - 60, T0 - 2, 4), observed_at=0.0)
    # Even long past the duration on our clock: a record that names us is ours to renew.
    decision = decide(mine, identity="b", settings=DEFAULTS, now_wall=T0, now_monotonic=500.0)
    assert decision.action is Action.RENEW
    assert decision.record == LeaseRecord("b", 15, T0 - 60, T0, 4)


def test_a_candidate_waits_while_another_holds_an_unexpired_lease() -> None:
    theirs = Observed(held("a", 2), observed_at=100.0)
    for now in (100.0, 114.999):
        decision = decide(theirs, identity="b", settings=DEFAULTS, now_wall=T0, now_monotonic=now)
        assert decision.action is Action.WAIT
        assert decision.record is None
        assert decision.expires_at == 115.0


def test_a_candidate_acquires_once_expired_on_its_own_clock() -> None:
    theirs = Observed(held("a", 2), observed_at=100.0)
    decision = decide(theirs, identity="b", settings=DEFAULTS, now_wall=T0 + 30, now_monotonic=115.0)
    assert decision.action is Action.ACQUIRE
    assert decision.record == LeaseRecord("b", 15, T0 + 30, T0 + 30, 3)


def test_renew_time_is_never_compared_with_the_local_clock() -> None:
    # The holder's clock is an hour ahead or behind: only our own observation times count.
    for skew in (-3600.0, 3600.0):
        theirs = Observed(held("a", renew=T0 + skew), observed_at=100.0)
        waiting = decide(theirs, identity="b", settings=DEFAULTS, now_wall=T0, now_monotonic=101.0)
        assert waiting.action is Action.WAIT
        acquiring = decide(theirs, identity="b", settings=DEFAULTS, now_wall=T0, now_monotonic=115.0)
        assert acquiring.action is Action.ACQUIRE


def test_a_released_lease_is_free_at_once() -> None:
    released = release_record(held("a", 5), T0 + 1)
    assert released == LeaseRecord("", 1, T0 + 1, T0 + 1, 5)
    seen = observe(None, released, 100.0)
    decision = decide(seen, identity="b", settings=DEFAULTS, now_wall=T0 + 1, now_monotonic=100.0)
    assert decision.action is Action.ACQUIRE
    assert decision.record is not None and decision.record.lease_transitions == 6


def test_a_record_without_a_duration_expires_once_observed() -> None:
    seen = observe(None, LeaseRecord("a"), 100.0)
    decision = decide(seen, identity="b", settings=DEFAULTS, now_wall=T0, now_monotonic=100.0)
    assert decision.action is Action.ACQUIRE


def test_leading_ends_at_the_renew_deadline() -> None:
    assert still_leading(50.0, 59.999, DEFAULTS)
    assert not still_leading(50.0, 60.0, DEFAULTS)
    assert not still_leading(None, 0.0, DEFAULTS)


# ----- the safety property ----------------------------------------------------------------


@dataclass
class Candidate:
    identity: str
    offset: float
    """Its monotonic clock's origin: clocks agree on rate, never on reading."""
    read_rv: int | None = None
    """The resourceVersion it last read (None: read that no Lease exists)."""
    has_read: bool = False
    observed: Observed | None = None
    renewed_at: float | None = None
    """Its own monotonic time at its last successful write (None: not holding)."""


@dataclass
class Server:
    record: LeaseRecord | None = None
    rv: int = 0
    leaders: list[str] = field(default_factory=list)


election_settings = st.builds(
    lambda duration, deadline_fraction, retry_fraction: ElectionSettings(
        lease_duration_seconds=duration,
        renew_deadline_seconds=duration * deadline_fraction,
        retry_period_seconds=duration * deadline_fraction * retry_fraction / 1.2,
    ),
    st.integers(1, 60),
    st.floats(0.2, 0.95),
    st.floats(0.05, 0.95),
)

steps = st.lists(
    st.tuples(
        # "try" is the elector's step (read, decide, write at once); "read" and "write" apart
        # model a decision made on a stale read.
        st.sampled_from(["try", "try", "advance", "advance", "read", "write", "release"]),
        st.integers(0, 1) | st.integers(0, 2),
        # Time steps as a share of the lease duration, so every test case meets expiries.
        st.one_of(st.sampled_from([0.1, 0.3, 0.5, 0.7, 1.0]), st.floats(0.0, 1.5)),
    ),
    max_size=80,
)


@settings(max_examples=600, deadline=None)
@given(
    election=election_settings,
    offsets=st.lists(st.floats(-1e6, 1e6), min_size=3, max_size=3),
    program=steps,
)
def test_never_two_leaders_and_never_leading_past_the_deadline(
    election: ElectionSettings, offsets: list[float], program: list[tuple[str, int, float]]
) -> None:
    """Reads, conditional writes, releases and time in any order, with clocks of any origin."""
    server = Server()
    candidates = [Candidate(f"c{i}", offset) for i, offset in enumerate(offsets)]
    now = 0.0  # true time; each candidate sees now + its offset
    last_success: dict[str, float] = {}
    for step, who, amount in program:
        me = candidates[who]
        for op in ("read", "write") if step == "try" else (step,):
            now = _apply(op, me, server, election, now, amount, last_success)
        leading = [c for c in candidates if still_leading(c.renewed_at, now + c.offset, election)]
        assert len(leading) <= 1, f"two leaders at {now}: {[c.identity for c in leading]}"
        for c in leading:
            assert now < last_success[c.identity] + election.renew_deadline_seconds + 1e-6


def _apply(
    op: str,
    me: Candidate,
    server: Server,
    election: ElectionSettings,
    now: float,
    amount: float,
    last_success: dict[str, float],
) -> float:
    """One step of the model; returns the true time after it."""
    local = now + me.offset
    if op == "advance":
        now += amount * election.lease_duration_seconds
    elif op == "read":
        me.has_read = True
        me.read_rv = server.rv if server.record is not None else None
        if server.record is None:
            me.observed = None
        else:
            me.observed = observe(me.observed, server.record, local)
    elif op == "write" and me.has_read:
        # Decided now from its last read, however stale; the write is conditional on it.
        decision = decide(
            me.observed, identity=me.identity, settings=election, now_wall=T0 + now, now_monotonic=local
        )
        if decision.record is None:
            return now
        expected_absent = decision.action is Action.CREATE
        current_matches = (
            (server.record is None)
            if expected_absent
            else (server.record is not None and server.rv == me.read_rv)
        )
        if current_matches:
            server.record = decision.record
            server.rv += 1
            me.read_rv = server.rv
            me.observed = observe(me.observed, decision.record, local)
            me.renewed_at = local  # the write started (and landed) now
            last_success[me.identity] = now
        else:
            # 409: a leader that sees someone else's write would step down at once; the
            # property must hold even without that, so its leadership just runs out.
            pass
    elif op == "release" and still_leading(me.renewed_at, local, election):
        # The elector releases only after its tasks stopped: it no longer leads.
        me.renewed_at = None
        assert me.observed is not None
        if server.record is not None and server.rv == me.read_rv:
            server.record = release_record(me.observed.record, T0 + now)
            server.rv += 1
            me.read_rv = server.rv
            me.observed = observe(me.observed, server.record, local)
    return now
