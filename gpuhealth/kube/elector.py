"""`LeaderElector`: one replica's campaign for a Lease, and the fenced term of work while it leads.

Any gpuhealth service that runs several replicas, of which only one may act, runs its
actuation inside an elector (the responder's reconciler does). The decisions are the pure
ones of `gpuhealth.kube.lease`; this module applies them to the API through the synchronous
`KubeClient`, each call in an executor thread, and owns the leader's tasks:

- `run(lead)` campaigns until it holds the Lease, then starts a `Term`: `lead(term)` runs as
  its first task and may `term.spawn()` more. Every actuation task of the leader lives in
  the term, never elsewhere, so the elector can stop all of them.
- The leader renews every retry period. It stops leading when it has not renewed within the
  renew deadline (the API failing, slow, or unreachable: a hung request does not hold the
  deadline back), or at once when a read shows another holder.
- Fencing: when leadership ends, the term's tasks are cancelled before anything else, the
  elector waits until every one has finished, and only then reports not-leading
  (`on_leading_changed(False)`) and campaigns again.
- Shutdown (cancelling `run`): the tasks are stopped first; only when all have finished is
  the Lease released (holder cleared), so a peer takes over at its next try rather than
  after a lease duration. A failing leader task ends the term the same way and its error
  leaves `run`.

Use (the responder's shape)::

    elector = LeaderElector(client, namespace=pod_namespace, name="gpuhealth-responder",
                            identity=pod_name, on_leading_changed=leader_metrics)

    async def lead(term: Term) -> None:
        term.spawn(breaker_watch())      # more actuation tasks, all fenced together
        await reconciler.run()           # cancelled when leadership ends

    await elector.run(lead)              # in a cleanup_ctx task; cancel it to stop

Time comes from the injected `Clock` (monotonic for deadlines, wall time for the record's
stamps) and waits from an injected `sleep`, so tests drive the elector with `ManualClock`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from gpuhealth.clock import Clock, SystemClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.errors import ApiError, Conflict, NotFound
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
from gpuhealth.kube.resources import LEASE

log = logging.getLogger(__name__)

T = TypeVar("T")

Sleep = Callable[[float], Awaitable[None]]
"""Waits this many seconds (`asyncio.sleep` in production; a ManualClock-driven fake in tests)."""


class Term:
    """One term of leadership: the tasks acting for the leader, stopped together when it ends."""

    def __init__(self, number: int) -> None:
        self.number = number
        """Counts the terms this elector has led, from 1 (for logs and tests)."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ending = False
        self.failure: BaseException | None = None
        """The first error a task of this term raised (the term ends on it)."""
        self._failed = asyncio.Event()

    @property
    def ending(self) -> bool:
        """True once the term is being stopped: no new task may start."""
        return self._ending

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Run `coro` as a task of this term (cancelled and awaited when leadership ends)."""
        if self._ending:
            coro.close()
            raise RuntimeError(f"leader term {self.number} has ended: no new task may start")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        if self._ending:
            log.error("leader task %s failed while stopping: %r", task.get_name(), error)
        elif self.failure is None:
            self.failure = error
            self._failed.set()

    async def _wait_failed(self) -> None:
        await self._failed.wait()

    async def _stop(self) -> None:
        """Cancel every task and return only when all have finished.

        A second cancellation of the caller does not cut the wait short (the whole point is
        that nothing acts for this leader afterwards); it is re-raised once all are done.
        """
        self._ending = True
        interrupted = False
        cancelled: set[asyncio.Task[Any]] = set()
        while pending := {task for task in self._tasks if not task.done()}:
            for task in pending - cancelled:
                # Once each: a second cancel would cut short the cleanup it is doing now.
                task.cancel()
            cancelled |= pending
            try:
                await asyncio.wait(pending)
            except asyncio.CancelledError:
                interrupted = True
        if interrupted:
            raise asyncio.CancelledError


LeadFn = Callable[[Term], Coroutine[Any, Any, None]]
"""The leader's work: started as the first task of each term; may spawn more into it."""


@dataclass(frozen=True, slots=True)
class _Attempt:
    """What one try to acquire or renew found (computed in a thread, applied on the loop)."""

    holding: bool
    """The write landed: we hold the lease."""
    lease: dict[str, Any] | None
    """The Lease as last read or written (its resourceVersion conditions our next write)."""
    observed: Observed | None
    """None when no Lease exists."""


class LeaderElector:
    """One candidate for one Lease; `run(lead)` until cancelled."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        settings: ElectionSettings | None = None,
        clock: Clock | None = None,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
        on_leading_changed: Callable[[bool], None] | None = None,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        """`identity` must be unique among the running candidates (a Pod's name is).

        `on_leading_changed(True)` comes after the lease is held, before the leader's work
        starts; `on_leading_changed(False)` only after every task of the term has finished.
        The responder sets its leader gauge and counts transitions there. The client's read
        timeout should be shorter than the renew deadline, or a hung renewal's thread
        outlives the term (harmless, but it holds a thread).
        """
        if not identity:
            raise ValueError("leader election: the identity must not be empty")
        self._client = client
        self._namespace = namespace
        self._name = name
        self.identity = identity
        self._settings = settings or ElectionSettings()
        self._clock = clock or SystemClock()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._on_leading_changed = on_leading_changed
        self._executor = executor
        self._lease: dict[str, Any] | None = None
        self._observed: Observed | None = None
        self._renewed_at: float | None = None
        self._term: Term | None = None
        self._terms = 0
        self._leading = False

    # ----- what others may read --------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True from the start of a term until all of its tasks have finished."""
        return self._leading

    @property
    def holder(self) -> str:
        """The holder in the record last read or written ("" when none or not yet read)."""
        return self._observed.record.holder_identity if self._observed is not None else ""

    # ----- the loop --------------------------------------------------------------------

    async def run(self, lead: LeadFn) -> None:
        """Campaign and lead until cancelled; a leader task's error ends the term and is raised.

        Returns only by raising: `CancelledError` on shutdown (after the tasks stopped and
        the lease was released), or the failed task's error (after the same).
        """
        try:
            while True:
                await self._campaign()
                term = self._start_term(lead)
                failure = await self._hold(term)
                await self._end_term()
                if failure is not None:
                    log.error("a leader task failed; stopping leadership: %r", failure)
                    raise failure
        finally:
            # Shutdown or failure: the tasks stop first; the lease goes only once all have ended
            # (if this wait is interrupted, the lease is kept and simply expires).
            await self._end_term()
            if self._renewed_at is not None and self._settings.release_on_shutdown:
                await self._release()
            self._renewed_at = None

    async def _campaign(self) -> None:
        """Try every (jittered) retry period until the lease is ours."""
        while True:
            started = self._clock.monotonic()
            attempt = await self._try(leading=False)
            if attempt is not None and attempt.holding:
                self._renewed_at = started
                return
            await self._sleep(next_retry_delay(self._settings, self._rng.random()))

    def _start_term(self, lead: LeadFn) -> Term:
        self._terms += 1
        term = Term(self._terms)
        self._term = term
        record = self._observed.record if self._observed is not None else None
        log.info(
            "%s leads %s/%s (term %d, lease transitions %s)",
            self.identity,
            self._namespace,
            self._name,
            term.number,
            record.lease_transitions if record is not None else "?",
        )
        self._report(True)
        term.spawn(lead(term), name=f"leader-{self._name}-{term.number}")
        return term

    async def _hold(self, term: Term) -> BaseException | None:
        """Renew until leadership is lost (None) or a task of the term fails (its error)."""
        settings = self._settings
        retry = settings.retry_period_seconds
        while True:
            assert self._renewed_at is not None
            deadline = self._renewed_at + settings.renew_deadline_seconds
            if await self._wait_until(min(self._clock.monotonic() + retry, deadline), term):
                return term.failure
            renewed = False
            while not renewed:
                started = self._clock.monotonic()
                if started >= deadline:
                    log.warning("%s: no renewal within the renew deadline; leadership lost", self.identity)
                    self._renewed_at = None
                    return None
                attempt = await self._bounded(self._try(leading=True), deadline, term)
                if term.failure is not None:
                    return term.failure
                if attempt is not None and attempt.holding:
                    self._renewed_at = started
                    renewed = True
                elif self._observed is not None and self.holder != self.identity:
                    holder = f"held by {self.holder}" if self.holder else "released by someone else"
                    log.warning("%s: the lease is %s; leadership lost", self.identity, holder)
                    self._renewed_at = None
                    return None
                elif self._clock.monotonic() < deadline and await self._wait_until(
                    min(self._clock.monotonic() + retry, deadline), term
                ):
                    return term.failure

    async def _end_term(self) -> None:
        """Fencing: cancel the term's tasks, wait for all of them, then report not-leading."""
        term = self._term
        if term is None:
            return
        started = self._clock.monotonic()
        try:
            await term._stop()
        finally:
            # _stop returns or raises only once every task has finished.
            self._term = None
            self._report(False)
            took = self._clock.monotonic() - started
            margin = self._settings.lease_duration_seconds - self._settings.renew_deadline_seconds
            if took > margin:
                log.warning(
                    "%s: the leader's tasks took %.1f s to stop, more than the %.1f s before a peer may "
                    "lead (lease duration minus renew deadline): make them stop sooner when cancelled",
                    self.identity,
                    took,
                    margin,
                )

    def _report(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        if not leading:
            log.info("%s stopped leading %s/%s", self.identity, self._namespace, self._name)
        if self._on_leading_changed is not None:
            try:
                self._on_leading_changed(leading)
            except Exception:  # a metrics hook must not break the election (or the fencing)
                log.exception("on_leading_changed(%s) failed", leading)

    # ----- API calls, each in a thread ---------------------------------------------------

    async def _try(self, *, leading: bool) -> _Attempt | None:
        """One try to acquire or renew; None when the API failed (logged)."""
        lease, observed = self._lease, self._observed
        try:
            attempt = await self._in_thread(lambda: self._attempt(lease, observed, leading=leading))
        except ApiError as exc:
            log.warning("%s: leader election on %s/%s: %s", self.identity, self._namespace, self._name, exc)
            return None
        # Applied here, on the loop, and only by a try that was waited for to the end: one
        # abandoned at the deadline teaches nothing (the next try reads afresh).
        self._lease, self._observed = attempt.lease, attempt.observed
        return attempt

    def _attempt(self, lease: dict[str, Any] | None, observed: Observed | None, *, leading: bool) -> _Attempt:
        """Acquire or renew from what was last seen (runs in a thread; changes no elector state)."""
        client, settings, clock = self._client, self._settings, self._clock
        if leading and lease is not None and observed is not None:
            # The leader renews straight from its last write; a 409 means someone else
            # wrote meanwhile, and only a fresh read tells who.
            decision = decide(
                observed,
                identity=self.identity,
                settings=settings,
                now_wall=clock.now(),
                now_monotonic=clock.monotonic(),
            )
            if decision.action is Action.RENEW and decision.record is not None:
                try:
                    return self._written(client.update(LEASE, _with_record(lease, decision.record)), observed)
                except (Conflict, NotFound):
                    pass  # deleted: recreated below unless someone else was quicker
        try:
            lease = client.get(LEASE, self._name, namespace=self._namespace)
        except NotFound:
            lease = None
        now = clock.monotonic()
        observed = observe(observed, LeaseRecord.from_lease(lease), now) if lease is not None else None
        decision = decide(
            observed, identity=self.identity, settings=settings, now_wall=clock.now(), now_monotonic=now
        )
        if decision.action is Action.WAIT or decision.record is None:
            return _Attempt(False, lease, observed)
        if leading and decision.action is Action.ACQUIRE:
            # The record no longer names us (someone cleared or rewrote it): our term is over
            # whatever we could write now; leading again takes a new term.
            return _Attempt(False, lease, observed)
        try:
            if decision.action is Action.CREATE:
                written = client.create(LEASE, self._new_lease(decision.record), namespace=self._namespace)
            else:
                assert lease is not None
                written = client.update(LEASE, _with_record(lease, decision.record))
        except Conflict:
            # Another candidate wrote first (AlreadyExists is a Conflict too): read again next time.
            return _Attempt(False, lease, observed)
        return self._written(written, observed)

    def _written(self, lease: dict[str, Any], observed: Observed | None) -> _Attempt:
        seen = observe(observed, LeaseRecord.from_lease(lease), self._clock.monotonic())
        return _Attempt(True, lease, seen)

    def _new_lease(self, record: LeaseRecord) -> dict[str, Any]:
        return {
            "apiVersion": LEASE.api_version,
            "kind": "Lease",
            "metadata": {"name": self._name, "namespace": self._namespace},
            "spec": record.to_spec(),
        }

    async def _release(self) -> None:
        """Clear the holder so a peer need not wait out the lease (only after the term ended)."""
        lease, observed = self._lease, self._observed
        if lease is None or observed is None or observed.record.holder_identity != self.identity:
            return
        if not still_leading(self._renewed_at, self._clock.monotonic(), self._settings):
            return  # past the deadline a peer may already hold it; our write would only conflict
        released = _with_record(lease, release_record(observed.record, self._clock.now()))
        deadline = self._clock.monotonic() + self._settings.renew_deadline_seconds
        self._renewed_at = None
        try:
            update = self._in_thread(lambda: self._client.update(LEASE, released))
            written = await self._bounded(update, deadline)
        except ApiError as exc:
            where = f"{self._namespace}/{self._name}"
            log.warning("%s: releasing %s failed (it will expire): %s", self.identity, where, exc)
            return
        if written is not None:
            self._lease = written
            self._observed = observe(observed, LeaseRecord.from_lease(written), self._clock.monotonic())
            log.info("%s released %s/%s", self.identity, self._namespace, self._name)

    # ----- waiting ---------------------------------------------------------------------

    def _in_thread(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        future = asyncio.get_running_loop().run_in_executor(self._executor, fn)
        # A call abandoned at the deadline still ends (within the client's read timeout);
        # its outcome is not wanted, but must be retrieved so asyncio does not log it.
        future.add_done_callback(_consume)
        return future

    async def _bounded(self, work: Awaitable[T], deadline: float, term: Term | None = None) -> T | None:
        """`work`'s result, or None if the deadline (local monotonic) or a term failure came first.

        The call is abandoned, not waited for: its thread cannot be interrupted, and the
        deadline must hold even while a request hangs.
        """
        work_future = asyncio.ensure_future(work)
        waits: set[asyncio.Future[Any]] = {work_future}
        timer = asyncio.ensure_future(self._sleep(max(0.0, deadline - self._clock.monotonic())))
        waits.add(timer)
        failed = None
        if term is not None:
            failed = asyncio.ensure_future(term._wait_failed())
            waits.add(failed)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (timer, failed):
                if waiter is not None:
                    waiter.cancel()
            if not work_future.done():
                work_future.cancel()
        if work_future.done() and not work_future.cancelled():
            return work_future.result()
        return None

    async def _wait_until(self, when: float, term: Term) -> bool:
        """Sleep until `when` (local monotonic); True if a task of the term failed first."""
        if term.failure is not None:
            return True
        timer = asyncio.ensure_future(self._sleep(max(0.0, when - self._clock.monotonic())))
        failed = asyncio.ensure_future(term._wait_failed())
        try:
            await asyncio.wait({timer, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            failed.cancel()
        return term.failure is not None


def _with_record(lease: dict[str, Any], record: LeaseRecord) -> dict[str, Any]:
    """The Lease (at the resourceVersion read, so the write is conditional) carrying `record`."""
    return {**lease, "spec": record.to_spec()}


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
