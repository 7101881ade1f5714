"""When the reconciler passes: the watches that wake it and the thread its passes run in (an executor).

`run_passes` calls a pass (`Reconciler.reconcile_once`, blocking) in a thread of its own (never
the event loop's default executor, where webhook deliveries queue: 100 deliveries at once held
enforcement back 3 s against a real apiserver, bench/results.md, "responder_cluster"), then
sleeps until the pass's next look, or until a watched object changes: any record, gpuhealth's
holder pods (a holder deleted, evicted or refused by someone is filled again at once, not at the
next recheck: until then the kubelet could hand its card to a new pod), and gpuhealth's check
Jobs (a check that ends moves its record up the ladder at once, not at the next recheck, which
a running check puts off until its timeout, at most `max_recheck_seconds`). The watches only wake
the loop; every pass lists what it decides on (`responder.reconcile.reconciler`).

Fencing: when the task is cancelled (the leader's term ended), the pass in flight is told to stop
before its next record or write, and the task returns only once its thread has finished, so
nothing acts for a leader that has stopped leading.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Protocol

from gpuhealth.kube.backoff import BackoffPolicy
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.elector import Term
from gpuhealth.kube.reflector import Events, Listed, Message, Reflector
from gpuhealth.kube.resources import POD, Resource
from responder.checks.jobs import JOB
from responder.enforce.hold import CHECK_LABEL
from responder.enforce.hold_plan import HOLDER_LABEL
from responder.records import QUARANTINES

Pass = Callable[[threading.Event], float | None]
"""One pass, told to stop when its event is set; the seconds until the next one wants to run."""


class WatchSettings(Protocol):
    """The watches' settings (`responder.reconcile.reconciler.ReconcilerSettings`)."""

    @property
    def page_size(self) -> int: ...

    @property
    def watch_timeout_seconds(self) -> int: ...

    @property
    def watch_backoff(self) -> BackoffPolicy: ...


async def run_passes(
    once: Pass,
    term: Term | None,
    *,
    watch_client: KubeClient | None,
    settings: WatchSettings,
    holders_namespace: str | None,
    checks_namespace: str | None = None,
) -> None:
    """Pass after pass until cancelled or `term` ends. `watch_client`: the watches' own client
    (None: passes come only when the last one asked); `holders_namespace`: where holder pods
    live (None: no hold, no holder watch); `checks_namespace`: where the check Jobs run (None: no
    check watch)."""
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    stop = threading.Event()

    def emit(message: Message) -> None:
        if isinstance(message, Listed | Events):
            loop.call_soon_threadsafe(wake.set)

    if watch_client is not None:
        _watch(watch_client, "quarantines", QUARANTINES, emit, stop, settings)
        if holders_namespace is not None:
            _watch(watch_client, "holders", POD, emit, stop, settings, holders_namespace, HOLDER_LABEL)
        if checks_namespace is not None:
            _watch(watch_client, "checks", JOB, emit, stop, settings, checks_namespace, CHECK_LABEL)
    passes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reconcile-pass")
    try:
        while term is None or not term.ending:
            wake.clear()
            next_seconds = await _pass_fenced(once, passes)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(next_seconds):
                    await wake.wait()
    finally:
        passes.shutdown(wait=False)  # the last pass has ended: _pass_fenced waits for it
        stop.set()  # the watchers end with their current watch (or when their client closes)


def _watch(
    client: KubeClient,
    name: str,
    resource: Resource,
    emit: Callable[[Message], None],
    stop: threading.Event,
    settings: WatchSettings,
    namespace: str | None = None,
    label_selector: str | None = None,
) -> None:
    reflector = Reflector(
        client,
        name,
        resource,
        emit=emit,
        stop=stop,
        page_size=settings.page_size,
        watch_timeout_seconds=settings.watch_timeout_seconds,
        backoff=settings.watch_backoff,
        namespace=namespace,
        label_selector=label_selector,
    )
    threading.Thread(target=reflector.run, name=f"{name}-watch", daemon=True).start()


async def _pass_fenced(once: Pass, executor: Executor) -> float | None:
    fence = threading.Event()
    future = asyncio.get_running_loop().run_in_executor(executor, once, fence)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        fence.set()
        # Return only once the thread is done: nothing may act after the term has ended.
        await asyncio.wait([future])
        raise
