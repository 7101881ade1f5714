"""The elector's loop, driven by a ManualClock over an in-memory Lease API.

Aspects: acquiring an absent Lease and renewing every retry period (acquireTime kept); a
candidate waiting out another's lease from its own observation, whatever the holder's
renewTime says; two candidates starting together (one leads); fencing when renewals fail
(tasks cancelled at the renew deadline, not before, and not-leading reported only after they
finished); a hung renewal not holding the deadline back; a Conflict showing another holder
ending leadership at once, and so does a cleared record (a deleted one is recreated);
work slow to stop reported; shutdown stopping the work before releasing, and a peer taking
the released lease at its next try; a second cancellation neither cutting the wait for the
work short nor releasing; a failing leader task ending the term (released, error
raised); a new term after a loss; no task spawned into an ended term.

API calls run through an executor that runs them inline, or holds them (a hung request),
so every step is deterministic: `FakeTime.advance` moves the clock and wakes due sleepers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import random
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from gpuhealth.kube.elector import LeaderElector, Term
from gpuhealth.kube.errors import AlreadyExists, ApiError, Conflict, NotFound, Unavailable
from gpuhealth.kube.lease import ElectionSettings, LeaseRecord
from gpuhealth.kube.resources import LEASE

NS, NAME = "gpuhealth", "responder-leader"


class FakeLeases:
    """The Lease API of one apiserver: conditional updates, 409s, injected failures."""

    def __init__(self, events: list[str]) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 100
        self.events = events
        self.fail: ApiError | None = None
        self._lock = threading.Lock()

    def get(self, resource: Any, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        assert resource is LEASE and namespace == NS
        with self._lock:
            self._maybe_fail()
            if name not in self.objects:
                raise NotFound(f'leases.coordination.k8s.io "{name}" not found')
            return copy.deepcopy(self.objects[name])

    def create(self, resource: Any, obj: dict[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        with self._lock:
            self._maybe_fail()
            name = obj["metadata"]["name"]
            if name in self.objects:
                raise AlreadyExists(f'leases.coordination.k8s.io "{name}" already exists')
            return self._store(copy.deepcopy(obj))

    def update(self, resource: Any, obj: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._maybe_fail()
            name = obj["metadata"]["name"]
            if name not in self.objects:
                raise NotFound(f'leases.coordination.k8s.io "{name}" not found')
            if obj["metadata"]["resourceVersion"] != self.objects[name]["metadata"]["resourceVersion"]:
                raise Conflict(f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}"')
            return self._store(copy.deepcopy(obj))

    def put(self, record: LeaseRecord) -> None:
        """Another party writes the Lease directly."""
        with self._lock:
            self._store({"metadata": {"name": NAME, "namespace": NS}, "spec": record.to_spec()})

    def record(self) -> LeaseRecord:
        return LeaseRecord.from_lease(self.objects.get(NAME))

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[obj["metadata"]["name"]] = obj
        self.events.append(f"lease held by {obj['spec'].get('holderIdentity')!r}")
        return copy.deepcopy(obj)

    def _maybe_fail(self) -> None:
        if self.fail is not None:
            raise self.fail


class InlineExecutor(concurrent.futures.Executor):
    """Runs calls at once, or, while `hold` is set, leaves them in flight like a hung request."""

    def __init__(self) -> None:
        self.hold = False
        self.held: list[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # like a thread: a running call cannot be cancelled
        call = lambda: fn(*args, **kwargs)  # noqa: E731
        if self.hold:
            self.held.append((future, call))
        else:
            _complete(future, call)
        return future

    def finish_held(self) -> None:
        held, self.held = self.held, []
        for future, call in held:
            _complete(future, call)


def _complete(future: concurrent.futures.Future[Any], call: Callable[[], Any]) -> None:
    try:
        future.set_result(call())
    except BaseException as exc:
        future.set_exception(exc)


class FakeTime:
    """The elector's `sleep`, on a ManualClock: sleepers wake when `advance` passes their time."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.sleepers: list[tuple[float, asyncio.Future[None]]] = []

    async def sleep(self, seconds: float) -> None:
        entry = (self.clock.monotonic() + seconds, asyncio.get_running_loop().create_future())
        self.sleepers.append(entry)
        try:
            await entry[1]
        finally:
            self.sleepers.remove(entry)

    async def advance(self, seconds: float) -> None:
        """Move the clock by `seconds`, stopping at each sleeper's time to let it run."""
        target = self.clock.monotonic() + seconds
        while True:
            await settle()
            due = [when for when, future in self.sleepers if not future.done() and when <= target]
            if not due:
                break
            self.clock.advance(max(0.0, min(due) - self.clock.monotonic()))
            for when, future in self.sleepers:
                if when <= self.clock.monotonic() and not future.done():
                    future.set_result(None)
        self.clock.advance(max(0.0, target - self.clock.monotonic()))
        await settle()


async def settle() -> None:
    """Let every ready task run until all wait on the fake clock or a held call."""
    for _ in range(50):
        await asyncio.sleep(0)


class Work:
    """A leader's work that records its life and, once cancelled, finishes when let."""

    def __init__(self, name: str, events: list[str]) -> None:
        self.name = name
        self.events = events
        self.terms: list[Term] = []
        self.may_finish = asyncio.Event()
        self.may_finish.set()

    async def __call__(self, term: Term) -> None:
        self.terms.append(term)
        self.events.append(f"{self.name} started term {term.number}")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.events.append(f"{self.name} cancelled")
            await self.may_finish.wait()
            self.events.append(f"{self.name} finished")
            raise


class Harness:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.clock = ManualClock()
        self.time = FakeTime(self.clock)
        self.api = FakeLeases(self.events)
        self.executor = InlineExecutor()
        self.tasks: list[asyncio.Task[None]] = []

    def elector(self, identity: str, **settings: Any) -> LeaderElector:
        return LeaderElector(
            self.api,  # type: ignore[arg-type]
            namespace=NS,
            name=NAME,
            identity=identity,
            settings=ElectionSettings(**settings),
            clock=self.clock,
            sleep=self.time.sleep,
            rng=random.Random(identity),
            on_leading_changed=lambda leading: self.events.append(f"{identity} leading={leading}"),
            executor=self.executor,
        )

    async def start(self, identity: str, **settings: Any) -> tuple[LeaderElector, Work]:
        elector = self.elector(identity, **settings)
        work = Work(identity, self.events)
        self.tasks.append(asyncio.create_task(elector.run(work)))
        await settle()
        return elector, work

    async def stop_all(self) -> None:
        self.executor.hold = False
        self.executor.finish_held()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            # Each test asserts the outcome it cares about; here they only must end.
            with contextlib.suppress(BaseException):
                await task


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = Harness()
    yield harness
    await harness.stop_all()


def since(events: list[str], mark: int) -> list[str]:
    return events[mark:]


async def test_acquires_an_absent_lease_and_renews_every_retry_period(h: Harness) -> None:
    a, _ = await h.start("a")
    assert a.is_leader
    assert h.events == ["lease held by 'a'", "a leading=True", "a started term 1"]
    first = h.api.record()
    assert first == LeaseRecord("a", 15, h.clock.now(), h.clock.now(), 0)
    await h.time.advance(2.0)
    renewed = h.api.record()
    assert renewed.renew_time == first.renew_time + 2.0
    assert (renewed.acquire_time, renewed.lease_transitions) == (first.acquire_time, 0)


@pytest.mark.parametrize("skew", [-3600.0, 0.0, 3600.0])
async def test_a_candidate_waits_out_the_lease_from_its_own_observation(h: Harness, skew: float) -> None:
    # The old holder is gone; its last renewTime says nothing on our clock, whatever its skew.
    h.api.put(LeaseRecord("gone", 15, h.clock.now() - 100, h.clock.now() + skew, 4))
    b, work = await h.start("b")
    assert not b.is_leader and b.holder == "gone"
    await h.time.advance(14.9)
    assert not b.is_leader and work.terms == []
    await h.time.advance(0.1 + 2.0 * 2.2)  # the lease's end, plus at most one jittered retry
    assert b.is_leader and [t.number for t in work.terms] == [1]
    assert h.api.record().holder_identity == "b"
    assert h.api.record().lease_transitions == 5


async def test_two_candidates_starting_together_one_leads(h: Harness) -> None:
    a = h.elector("a")
    b = h.elector("b")
    wa, wb = Work("a", h.events), Work("b", h.events)
    h.tasks += [asyncio.create_task(a.run(wa)), asyncio.create_task(b.run(wb))]
    for _ in range(10):
        await h.time.advance(2.0)
        assert [a.is_leader, b.is_leader].count(True) == 1
    assert {a.holder, b.holder} == {h.api.record().holder_identity}


async def test_failing_renewals_fence_the_work_at_the_renew_deadline(h: Harness) -> None:
    a, work = await h.start("a")
    work.may_finish.clear()
    h.api.fail = Unavailable("PUT leases: 503 Service Unavailable")
    await h.time.advance(9.9)
    assert a.is_leader and "a cancelled" not in h.events
    mark = len(h.events)
    await h.time.advance(0.1)
    # Cancelled at the deadline; still reported leading while its task has not finished.
    assert since(h.events, mark) == ["a cancelled"]
    assert a.is_leader
    work.may_finish.set()
    await settle()
    assert since(h.events, mark) == ["a cancelled", "a finished", "a leading=False"]
    assert not a.is_leader


async def test_a_hung_renewal_does_not_hold_the_deadline_back(h: Harness) -> None:
    a, _ = await h.start("a")
    h.executor.hold = True
    mark = len(h.events)
    await h.time.advance(9.9)
    assert a.is_leader and h.executor.held, "a renewal is in flight"
    await h.time.advance(0.1)
    assert since(h.events, mark) == ["a cancelled", "a finished", "a leading=False"]


async def test_a_conflict_showing_another_holder_ends_leadership_at_once(h: Harness) -> None:
    a, _ = await h.start("a")
    h.api.put(LeaseRecord("x", 15, h.clock.now(), h.clock.now(), 1))
    mark = len(h.events)
    await h.time.advance(2.0)  # the next renewal: 409, read, another holder
    assert since(h.events, mark) == ["a cancelled", "a finished", "a leading=False"]
    assert a.holder == "x"
    assert h.api.record().holder_identity == "x", "the loser wrote nothing"


async def test_a_lease_cleared_under_the_leader_ends_its_term(h: Harness) -> None:
    a, work = await h.start("a")
    h.api.put(LeaseRecord("", 1, h.clock.now(), h.clock.now(), 0))
    mark = len(h.events)
    await h.time.advance(2.0)
    # Not taken back within the term: a cleared record no longer protects the work.
    assert since(h.events, mark)[:3] == ["a cancelled", "a finished", "a leading=False"]
    await h.time.advance(2.0 * 2.2)
    assert a.is_leader and [t.number for t in work.terms] == [1, 2]
    assert h.api.record().lease_transitions == 1


async def test_a_deleted_lease_is_recreated_within_the_term(h: Harness) -> None:
    a, work = await h.start("a")
    del h.api.objects[NAME]
    await h.time.advance(2.0)
    assert a.is_leader and len(work.terms) == 1
    assert h.api.record().holder_identity == "a"


async def test_work_slow_to_stop_is_reported(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    a, work = await h.start("a")
    work.may_finish.clear()
    h.api.fail = Unavailable("503")
    await h.time.advance(10.0)
    assert "a cancelled" in h.events and a.is_leader
    await h.time.advance(6.0)  # past the 5 s between the renew deadline and the lease's end
    work.may_finish.set()
    await settle()
    assert not a.is_leader
    assert "the leader's tasks took 6.0 s to stop, more than the 5.0 s" in caplog.text


async def test_shutdown_stops_the_work_then_releases(h: Harness) -> None:
    _, work = await h.start("a")
    work.may_finish.clear()
    task = h.tasks[0]
    task.cancel()
    await settle()
    assert h.events[-1] == "a cancelled"
    assert h.api.record().holder_identity == "a", "never released while its work runs"
    mark = len(h.events)
    work.may_finish.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert since(h.events, mark) == ["a finished", "a leading=False", "lease held by ''"]
    released = h.api.record()
    assert (released.holder_identity, released.lease_duration_seconds, released.lease_transitions) == (
        "",
        1,
        0,
    )


async def test_a_second_cancellation_still_waits_for_the_work_and_keeps_the_lease(h: Harness) -> None:
    _, work = await h.start("a")
    work.may_finish.clear()
    task = h.tasks[0]
    task.cancel()
    await settle()
    task.cancel()  # an impatient shutdown
    await settle()
    assert not task.done(), "the elector waits for its work whatever the caller's hurry"
    mark = len(h.events)
    work.may_finish.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Not released: the shutdown was cut short, so the lease simply expires.
    assert since(h.events, mark) == ["a finished", "a leading=False"]
    assert h.api.record().holder_identity == "a"


async def test_a_peer_takes_a_released_lease_at_its_next_try(h: Harness) -> None:
    a, _ = await h.start("a")
    b, work_b = await h.start("b")
    assert a.is_leader and not b.is_leader
    h.tasks[0].cancel()
    await settle()
    assert h.api.record().holder_identity == ""
    await h.time.advance(2.0 * 2.2)  # one jittered retry, far less than the 15 s lease
    assert b.is_leader and len(work_b.terms) == 1
    assert h.api.record().lease_transitions == 1


async def test_a_failing_leader_task_ends_the_term_releases_and_raises(h: Harness) -> None:
    elector = h.elector("a")

    async def lead(term: Term) -> None:
        async def broken() -> None:
            await h.time.sleep(3.0)
            raise RuntimeError("reconciler bug")

        term.spawn(broken())
        await Work("a", h.events)(term)

    task = asyncio.create_task(elector.run(lead))
    await h.time.advance(3.0)
    with pytest.raises(RuntimeError, match="reconciler bug"):
        await task
    assert h.events[-4:] == ["a cancelled", "a finished", "a leading=False", "lease held by ''"]


async def test_after_a_loss_it_campaigns_and_leads_a_new_term(h: Harness) -> None:
    a, work = await h.start("a")
    h.api.fail = Unavailable("GET leases: connection refused")
    await h.time.advance(10.0)
    assert not a.is_leader
    h.api.fail = None
    await h.time.advance(2.0 * 2.2)
    # The record still names it: it takes its own lease back, in a new term.
    assert a.is_leader and [t.number for t in work.terms] == [1, 2]


async def test_no_task_starts_in_an_ended_term(h: Harness) -> None:
    _, work = await h.start("a")
    h.api.fail = Unavailable("timeout")
    await h.time.advance(10.0)
    term = work.terms[0]
    assert term.ending
    coro = asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="leader term 1 has ended"):
        term.spawn(coro)


def test_an_empty_identity_is_refused() -> None:
    with pytest.raises(ValueError, match="identity must not be empty"):
        LeaderElector(object(), namespace=NS, name=NAME, identity="")  # type: ignore[arg-type]
