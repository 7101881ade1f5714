"""The typed client's requests (gpuhealth.kube.client), against a recording fake transport.

Aspects: the method, path, query, body and Content-Type of every verb; list paging and
selectors; lists read one page at a time through a page decoder, and a reflector handing
them on page by page (a list that fails midway starts again with a first page); watch
parameters and the read timeout that outlasts timeoutSeconds; dry-run as `dryRun=All` on
every write (the simulated cluster refuses it, so only here); delete preconditions and
propagationPolicy as DeleteOptions; update refused without a resourceVersion; patch bodies
matched to their patch type; watch events decoded, bookmarks tracked, ERROR events raised
as their error; `close()` ends responses in flight and refuses new requests.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from gpuhealth.kube.client import ClientClosed, KubeClient, PatchType
from gpuhealth.kube.errors import Gone, NotFound, Unavailable
from gpuhealth.kube.pages import Page, decode_page
from gpuhealth.kube.reflector import Listed, ListEnded, ListPage, Message, Reflector, WatchRestarted
from gpuhealth.kube.resources import NODE, POD, STATUS
from gpuhealth.kube.watch import WatchEvent


@dataclass
class Sent:
    method: str
    path: str
    params: list[tuple[str, str]]
    body: Any
    content_type: str | None
    timeout: tuple[float, float]


class FakeResponse:
    def __init__(self, body: bytes = b"", chunks: Sequence[bytes] = ()) -> None:
        self._body, self._chunks = body, chunks
        self.closed = threading.Event()

    def stream(self) -> Iterator[bytes]:
        yield from self._chunks

    def read(self) -> bytes:
        return self._body

    def close(self) -> None:
        self.closed.set()


class FakeTransport:
    """Answers each request with the next scripted response (or raises it), recording what was sent."""

    def __init__(self, *answers: Any) -> None:
        self.answers: deque[Any] = deque(answers)
        self.sent: list[Sent] = []
        self.responses: list[FakeResponse] = []

    def request(
        self,
        method: str,
        path: str,
        params: Sequence[tuple[str, str]] = (),
        *,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: tuple[float, float],
    ) -> FakeResponse:
        decoded = None if body is None else orjson.loads(body)
        self.sent.append(Sent(method, path, list(params), decoded, content_type, timeout))
        answer = self.answers.popleft() if self.answers else {"kind": "Pod", "metadata": {"name": "p"}}
        if isinstance(answer, Exception):
            raise answer
        response = answer if isinstance(answer, FakeResponse) else FakeResponse(orjson.dumps(answer))
        self.responses.append(response)
        return response

    @property
    def last(self) -> Sent:
        return self.sent[-1]


def pod(name: str = "p", rv: str | None = "5") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if rv is not None:
        meta["resourceVersion"] = rv
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


def test_get_and_its_status_subresource() -> None:
    transport = FakeTransport()
    client = KubeClient(transport, connect_timeout_seconds=3, read_timeout_seconds=7)
    assert client.get(POD, "p", namespace="default") == {"kind": "Pod", "metadata": {"name": "p"}}
    assert (transport.last.method, transport.last.path, transport.last.timeout) == (
        "GET",
        "/api/v1/namespaces/default/pods/p",
        (3, 7),
    )
    client.get(NODE, "gpu-0", subresource=STATUS)
    assert transport.last.path == "/api/v1/nodes/gpu-0/status"
    assert all(r.closed.is_set() for r in transport.responses)


def test_list_reads_every_page_with_the_selectors() -> None:
    transport = FakeTransport(
        {"items": [pod("a")], "metadata": {"continue": "t1", "resourceVersion": "10"}},
        {"items": [pod("b")], "metadata": {"resourceVersion": "10"}},
    )
    listed = KubeClient(transport).list(
        POD, namespace="default", label_selector="app=infer", field_selector="spec.nodeName=n", page_size=1
    )
    assert [p["metadata"]["name"] for p in listed.items] == ["a", "b"]
    assert listed.resource_version == "10"
    first, second = transport.sent
    selectors = [("labelSelector", "app=infer"), ("fieldSelector", "spec.nodeName=n"), ("limit", "1")]
    assert first.params == selectors
    assert second.params == [*selectors, ("continue", "t1")]
    assert first.path == "/api/v1/namespaces/default/pods"


@pytest.mark.parametrize(
    "body",
    [[1], {"items": {"a": 1}, "metadata": {"resourceVersion": "1"}}, {"items": [], "metadata": {}}],
)
def test_a_malformed_list_is_refused(body: Any) -> None:
    with pytest.raises(ValueError):
        KubeClient(FakeTransport(body)).list(POD)


def test_pages_are_read_one_at_a_time_through_the_decoder() -> None:
    transport = FakeTransport(
        {"items": [pod("a")], "metadata": {"continue": "t1", "resourceVersion": "10"}},
        {"items": [pod("b")], "metadata": {"resourceVersion": "10"}},
    )
    names: list[bytes] = []

    def names_only(body: bytes) -> Page:
        names.append(body)
        page = decode_page(body)
        return Page([o["metadata"]["name"] for o in page.items], page.continue_token, page.resource_version)

    pages = KubeClient(transport).pages(POD, page_size=1, decode=names_only)
    first = next(pages)
    assert (first.items, first.continue_token, len(transport.sent)) == (["a"], "t1", 1)  # no read ahead
    assert all(r.closed.is_set() for r in transport.responses)
    (last,) = pages
    assert (last.items, last.continue_token, last.resource_version) == (["b"], "", "10")
    assert transport.last.params == [("limit", "1"), ("continue", "t1")]
    assert len(names) == 2


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{", "the body is not JSON"),
        (b"[1]", "the body is not a JSON object"),
        (b'{"items": {"a": 1}}', "malformed body"),
        (b'{"items": [], "metadata": {}}', "no resourceVersion"),
    ],
)
def test_a_malformed_page_names_the_collection_and_the_reason(body: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=f"^list of pods: {reason}"):
        list(KubeClient(FakeTransport(FakeResponse(body))).pages(POD))


@dataclass(frozen=True)
class QuickBackoff:
    initial_seconds: float = 0.001
    max_seconds: float = 0.001
    factor: float = 1.0
    jitter: float = 0.0


def reflect(transport: FakeTransport, *, paged: bool) -> list[Message]:
    """Run a reflector over `transport` until its first list has ended; its messages."""
    client = KubeClient(transport)
    stop = threading.Event()
    messages: list[Message] = []

    def emit(message: Message) -> None:
        messages.append(message)
        if isinstance(message, ListEnded | Listed):
            stop.set()
            client.close()  # the watch that follows is refused: run() returns

    reflector = Reflector(
        client, "pods", POD, emit=emit, stop=stop, page_size=1, watch_timeout_seconds=60,
        backoff=QuickBackoff(), paged=paged,
    )  # fmt: skip
    reflector.run()
    return messages


def test_a_paged_reflector_hands_on_each_page_then_the_end_and_restarts_a_failed_list() -> None:
    transport = FakeTransport(
        {"items": [pod("a")], "metadata": {"continue": "t1", "resourceVersion": "10"}},
        Unavailable("the apiserver went away midway"),
        {"items": [pod("a")], "metadata": {"continue": "t2", "resourceVersion": "12"}},
        {"items": [pod("c")], "metadata": {"resourceVersion": "12"}},
    )
    messages = reflect(transport, paged=True)
    shown = [
        (m.first, [o["metadata"]["name"] for o in m.items]) if isinstance(m, ListPage) else type(m).__name__
        for m in messages
    ]
    assert shown == [(True, ["a"]), "WatchRestarted", (True, ["a"]), (False, ["c"]), "ListEnded"]
    assert isinstance(messages[1], WatchRestarted) and messages[1].reason == "error"


def test_an_unpaged_reflector_hands_on_the_whole_list_at_once() -> None:
    transport = FakeTransport(
        {"items": [pod("a")], "metadata": {"continue": "t1", "resourceVersion": "10"}},
        {"items": [pod("b")], "metadata": {"resourceVersion": "10"}},
    )
    (listed,) = reflect(transport, paged=False)
    assert isinstance(listed, Listed) and [o["metadata"]["name"] for o in listed.items] == ["a", "b"]


def test_create_takes_the_namespace_from_the_object() -> None:
    transport = FakeTransport()
    KubeClient(transport).create(POD, pod(rv=None))
    sent = transport.last
    assert (sent.method, sent.path, sent.content_type, sent.params) == (
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        [],
    )
    assert sent.body == pod(rv=None)
    with pytest.raises(ValueError, match="no namespace"):
        KubeClient(transport).create(POD, {"metadata": {"name": "x"}})


def test_update_puts_the_object_at_its_resource_version_and_refuses_one_without() -> None:
    transport = FakeTransport()
    client = KubeClient(transport)
    client.update(POD, pod(rv="7"), subresource=STATUS)
    assert (transport.last.method, transport.last.path) == ("PUT", "/api/v1/namespaces/default/pods/p/status")
    assert transport.last.body["metadata"]["resourceVersion"] == "7"
    with pytest.raises(ValueError, match="resourceVersion"):
        client.update(POD, pod(rv=None))
    with pytest.raises(ValueError, match="name or namespace"):
        client.update(POD, {"metadata": {"name": "p", "resourceVersion": "1"}})
    assert len(transport.sent) == 1


def test_patch_types_and_their_bodies() -> None:
    transport = FakeTransport()
    client = KubeClient(transport)
    client.patch(POD, "p", {"metadata": {"labels": {"a": None}}}, namespace="default")
    assert (transport.last.method, transport.last.content_type) == ("PATCH", "application/merge-patch+json")
    ops = [{"op": "test", "path": "/metadata/uid", "value": "u1"}, {"op": "remove", "path": "/spec/x"}]
    client.patch(NODE, "gpu-0", ops, patch_type=PatchType.JSON, subresource=STATUS)
    assert (transport.last.path, transport.last.content_type) == (
        "/api/v1/nodes/gpu-0/status",
        "application/json-patch+json",
    )
    assert transport.last.body == ops
    with pytest.raises(TypeError):
        client.patch(NODE, "gpu-0", ops)  # a list is no merge patch
    with pytest.raises(TypeError):
        client.patch(NODE, "gpu-0", {"spec": {}}, patch_type=PatchType.JSON)
    assert len(transport.sent) == 2


def test_delete_sends_preconditions_and_propagation_policy() -> None:
    transport = FakeTransport({"kind": "Status", "status": "Success"})
    KubeClient(transport).delete(
        POD, "p", namespace="default", uid="u1", resource_version="9", propagation_policy="Foreground"
    )
    sent = transport.last
    assert (sent.method, sent.path, sent.content_type) == (
        "DELETE",
        "/api/v1/namespaces/default/pods/p",
        "application/json",
    )
    assert sent.body == {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"uid": "u1", "resourceVersion": "9"},
        "propagationPolicy": "Foreground",
    }
    KubeClient(transport).delete(NODE, "gpu-0")
    assert transport.last.body == {"kind": "DeleteOptions", "apiVersion": "v1"}


def test_delete_sends_a_grace_period_and_refuses_a_negative_one() -> None:
    transport = FakeTransport({"kind": "Status", "status": "Success"})
    KubeClient(transport).delete(POD, "p", namespace="default", grace_period_seconds=0)
    assert transport.last.body == {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
    with pytest.raises(ValueError, match="grace period"):
        KubeClient(transport).delete(POD, "p", namespace="default", grace_period_seconds=-1)
    assert len(transport.sent) == 1


def test_every_write_can_be_a_dry_run() -> None:
    transport = FakeTransport()
    client = KubeClient(transport)
    client.create(POD, pod(rv=None), dry_run=True)
    client.update(POD, pod(), dry_run=True)
    client.patch(POD, "p", {"metadata": {}}, namespace="default", dry_run=True)
    client.delete(POD, "p", namespace="default", dry_run=True)
    assert [s.params for s in transport.sent] == [[("dryRun", "All")]] * 4
    client.create(POD, pod(rv=None))
    assert transport.last.params == []


def test_errors_of_the_transport_reach_the_caller() -> None:
    with pytest.raises(NotFound):
        KubeClient(FakeTransport(NotFound("pods p"))).get(POD, "p", namespace="default")


def event(event_type: str, obj: Any) -> bytes:
    return orjson.dumps({"type": event_type, "object": obj}) + b"\n"


def test_watch_parameters_and_read_timeout() -> None:
    transport = FakeTransport(FakeResponse())
    client = KubeClient(transport, connect_timeout_seconds=2, read_timeout_seconds=30)
    with client.watch(POD, resource_version="40", field_selector="spec.nodeName=n", timeout_seconds=60):
        pass
    sent = transport.last
    assert (sent.method, sent.path, sent.timeout) == ("GET", "/api/v1/pods", (2, 90))
    assert dict(sent.params) == {
        "fieldSelector": "spec.nodeName=n",
        "watch": "true",
        "resourceVersion": "40",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "60",
    }
    assert transport.responses[0].closed.is_set()


def test_watch_yields_events_tracks_bookmarks_and_raises_error_events() -> None:
    bookmark = {"kind": "Pod", "metadata": {"resourceVersion": "12"}}
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
    line = event("ADDED", pod("a", rv="11"))
    chunks = [line[:20], line[20:] + b"{not json\n", event("BOOKMARK", bookmark), event("ERROR", gone)]
    transport = FakeTransport(FakeResponse(chunks=chunks))
    seen: list[WatchEvent] = []
    with KubeClient(transport).watch(POD, resource_version="10") as stream, pytest.raises(Gone):
        for watch_event in stream:
            seen.append(watch_event)
    assert seen == [WatchEvent("ADDED", pod("a", rv="11")), WatchEvent("BOOKMARK", bookmark)]
    assert stream.resource_version == "12"
    assert transport.responses[0].closed.is_set()


def test_close_ends_responses_in_flight_and_refuses_new_requests() -> None:
    transport = FakeTransport(FakeResponse())
    client = KubeClient(transport)
    stream = client.watch(POD)
    client.close()
    assert transport.responses[0].closed.is_set() and client.closed
    with pytest.raises(ClientClosed):
        client.get(POD, "p", namespace="default")
    stream.close()  # closing again is harmless
