"""The list-then-watch loop of one collection, run in a reader thread, reporting as messages.

Protocol: list (in pages) and hand the whole list on, then watch from the list's
resourceVersion, resuming from the last version seen (bookmarks included) whenever a
watch ends. On 410 Gone, as an HTTP status or as an ERROR event inside the stream, list
again (the consumer then replaces what it knew) after a backoff pause that grows only while
watches expire without delivering anything: an apiserver whose watch cache lags its lists
would otherwise get full lists in a loop. Any other failure backs off with jitter
(`Backoff`, the one throttling helper) and resumes from the same version. A normal end of a
watch (its timeoutSeconds, jittered so a fleet does not reconnect in step) resumes at once.

What it sees goes to `emit` as frozen messages, one per chunk read rather than one per
event, so a consumer on another thread (an asyncio loop) pays one hand-over per read.
Decoding is the consumer's choice (`decode` for watch lines, `decode_page` for list pages,
`resource_version`): the exporter decodes pods straight into its typed Structs; the default
gives plain dicts.

A list is handed on whole (`Listed`) by default. With `paged=True` it goes page by page as
each arrives (`ListPage`s, then `ListEnded`), so a consumer that folds each page never holds
the whole collection: a 10,000-node fleet's pods, claims and slices are about 300 MiB as
dicts, and holding them at once left the exporter's heap that much larger for good (the
allocator cannot return memory that later objects keep partly in use). The semantics are
the same: a list replaces what the consumer knew, once it has ended; a list that fails
midway is started again, and its new first page says so.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from gpuhealth.kube import meta
from gpuhealth.kube.backoff import Backoff, BackoffPolicy
from gpuhealth.kube.client import ClientClosed, KubeClient
from gpuhealth.kube.errors import Gone, error_from_status
from gpuhealth.kube.pages import PageDecoder, decode_page
from gpuhealth.kube.resources import Resource
from gpuhealth.kube.watch import Event, decode_event

log = logging.getLogger(__name__)

# Why a watch was restarted (a metric label in the services: a fixed vocabulary).
RESTART_EXPIRED: Final = "expired"
"""410 Gone: our resourceVersion is too old; a relist follows."""
RESTART_CLOSED: Final = "closed"
"""The server ended the watch (its timeoutSeconds); resumed at once."""
RESTART_ERROR: Final = "error"
"""A connection or HTTP failure; resumed after a backoff."""


@dataclass(frozen=True, slots=True)
class Listed:
    """A complete list: it replaces whatever the consumer knew of the collection."""

    resource: str
    items: list[Any]


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a list in progress (a `paged` reflector): its items, to apply as they come.

    `first`: a new list begins (a relist, or a list that failed midway started again): what
    the consumer noted of an earlier, unfinished one no longer counts.
    """

    resource: str
    items: list[Any]
    first: bool


@dataclass(frozen=True, slots=True)
class ListEnded:
    """The list whose pages came before is complete: it replaces whatever the consumer knew,
    so what none of its pages named is gone."""

    resource: str


@dataclass(frozen=True, slots=True)
class Events:
    """The change events (no bookmarks) of one chunk read from a watch, in order."""

    resource: str
    events: list[Event]


@dataclass(frozen=True, slots=True)
class WatchRestarted:
    resource: str
    reason: str
    """RESTART_EXPIRED, RESTART_CLOSED or RESTART_ERROR."""


@dataclass(frozen=True, slots=True)
class ParseFailed:
    """A watch line that was not an event, skipped."""

    resource: str
    reason: str
    """`watch.INVALID_JSON` or `watch.MALFORMED_EVENT` (or the decoder's own reason)."""


Message = Listed | ListPage | ListEnded | Events | WatchRestarted | ParseFailed


class Reflector:
    """Lists and watches one collection until `stop` is set; `run()` blocks (a reader thread).

    `name` labels its messages. Stopping: set `stop`, then close the client, which ends a
    blocked read at once (a closed client alone also ends it).
    """

    def __init__(
        self,
        client: KubeClient,
        name: str,
        resource: Resource,
        *,
        emit: Callable[[Message], None],
        stop: threading.Event,
        page_size: int,
        watch_timeout_seconds: int,
        backoff: BackoffPolicy,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        decode: Callable[[bytes], Event | str] = decode_event,
        decode_page: PageDecoder = decode_page,
        resource_version: Callable[[Any], str | None] = meta.resource_version,
        paged: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._name = name
        self._resource = resource
        self._emit = emit
        self._stop = stop
        self._page_size = page_size
        self._watch_timeout = watch_timeout_seconds
        self._rng = rng or random.Random()
        self._backoff = Backoff(backoff, self._rng)
        self._namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._decode = decode
        self._decode_page = decode_page
        self._resource_version = resource_version
        self._paged = paged

    def run(self) -> None:
        name, emit, backoff, stop = self._name, self._emit, self._backoff, self._stop
        rv: str | None = None
        while not stop.is_set():
            try:
                if rv is None:
                    rv = self._list()
                rv = self._watch(rv)
                backoff.reset()
            except Gone:
                # The watch resets the backoff on every delivery, so this pause grows only
                # while watches expire without delivering anything.
                rv = None
                emit(WatchRestarted(name, RESTART_EXPIRED))
                stop.wait(backoff.next_delay())
                continue
            except ClientClosed:
                return
            except Exception as exc:
                if stop.is_set():
                    return
                delay = backoff.next_delay()
                log.warning("%s: %s; retrying in %.1f s", name, exc, delay)
                emit(WatchRestarted(name, RESTART_ERROR))
                stop.wait(delay)
                continue
            if stop.is_set():
                return
            emit(WatchRestarted(name, RESTART_CLOSED))

    def _list(self) -> str:
        """List in pages, handing them on as the mode says; the resourceVersion to watch from."""
        name, emit, paged = self._name, self._emit, self._paged
        items: list[Any] = []
        first = True
        for page in self._client.pages(
            self._resource,
            namespace=self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            page_size=self._page_size,
            decode=self._decode_page,
        ):
            if paged:
                emit(ListPage(name, page.items, first))
                first = False
            else:
                items.extend(page.items)
            if not page.continue_token:
                assert page.resource_version is not None  # the client checks the last page
                emit(ListEnded(name) if paged else Listed(name, items))
                return page.resource_version
        raise AssertionError("a list ends with its last page")  # pragma: no cover

    def _watch(self, rv: str) -> str:
        """Stream one watch; the resourceVersion to resume from when it ends normally."""
        name, emit, decode, version_of = self._name, self._emit, self._decode, self._resource_version
        timeout = int(self._watch_timeout * (0.9 + 0.2 * self._rng.random())) or 1
        stream = self._client.watch(
            self._resource,
            resource_version=rv,
            namespace=self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            timeout_seconds=timeout,
        )
        with stream:
            for lines in stream.batches():
                batch: list[Event] = []
                for line in lines:
                    event = decode(line)
                    if isinstance(event, str):
                        emit(ParseFailed(name, event))
                        continue
                    event_type, obj = event
                    if event_type == "ERROR":
                        raise error_from_status(obj)
                    new_rv = version_of(obj)
                    if new_rv is not None:
                        rv = new_rv
                    if event_type != "BOOKMARK":
                        batch.append(event)
                if batch:
                    emit(Events(name, batch))
                self._backoff.reset()
        return rv
