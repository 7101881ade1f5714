"""Which device each pod got, for the hold, where the kubelet does not say (`hold_devices`,
`hold_allocations`).

Aspects: the query asks for one node's device-plugin allocations by namespace, pod and device,
its label values escaped; an answer is parsed into each pod's devices, unreadable samples
dropped and an error answer, a refused connection or a server error raised as unavailable; the
exporter is asked only while a running pod that asks for devices has no kubelet report, once
per node per pass however many holds read it, and what it named is kept for the pod's life (an
outage after it does not undo a hold); a failed or missing answer is "not known yet", said in
the sources tried; it is not read for a MIG card, on a time-sliced node, or where it names one
GPU for two pods (its series name no partition or replica). Through `DeviceHold` with a fake API:
a card is held by the holder the exporter says got it on a kubelet that reports nothing, and,
with neither source naming a device, `AllocationUnreadable` names both.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import count
from typing import Any

import pytest

from gpuhealth.kube.api import ObjectList
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.resources import NODE, POD, Resource
from responder.enforce.hold import DeviceHold, device_ids, holds
from responder.enforce.hold_allocations import PrometheusAllocations, allocation_query, parse_allocations
from responder.enforce.hold_devices import EXPORTER, KUBELET, AllocationsUnavailable, PodDevices, PodKey
from responder.enforce.hold_plan import Card, HoldState
from responder.enforce.node_annotation import DEVICE_PLUGIN
from responder.records import Quarantine, QuarantineSpec

WHOLE = Card("GPU-1")
"""A whole GPU, unshared: the card of the readings below."""


def vector(*samples: dict[str, str]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [0, "1"]} for m in samples]},
    }


def pod(
    name: str, *, uid: str = "", phase: str = "Running", gpus: int = 1, reported: str = ""
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {"cpu": "1"}
    status: dict[str, Any] = {"phase": phase}
    if reported:
        status["containerStatuses"] = [
            {
                "name": "c",
                "allocatedResourcesStatus": [
                    {"name": "nvidia.com/gpu", "resources": [{"resourceID": reported, "health": "Healthy"}]}
                ],
            }
        ]
    return {
        "metadata": {"name": name, "namespace": "team", "uid": uid or f"uid-{name}"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": status,
    }


class Answers:
    """An `AllocationSource` with a set answer per node, counting the questions."""

    def __init__(self, answer: Mapping[PodKey, tuple[str, ...]] | None = None) -> None:
        self.answer = dict(answer or {})
        self.failing = False
        self.asked: list[str] = []

    def devices(self, node: str) -> dict[PodKey, tuple[str, ...]]:
        self.asked.append(node)
        if self.failing:
            raise AllocationsUnavailable("connection refused")
        return dict(self.answer)


# The query and its answer.


def test_the_query_asks_for_one_nodes_device_plugin_allocations() -> None:
    query = allocation_query('n"1\\')
    assert query == 'max by (namespace, pod, device) (gpu_device_allocation_info{node="n\\"1\\\\", claim=""})'


def test_an_answer_gives_each_pods_devices_sorted_and_drops_unreadable_samples() -> None:
    body = vector(
        {"namespace": "team", "pod": "a", "device": "GPU-2"},
        {"namespace": "team", "pod": "a", "device": "GPU-1"},
        {"namespace": "other", "pod": "a", "device": "GPU-3"},
        {"namespace": "team", "pod": "b"},
        {"namespace": "team", "pod": "", "device": "GPU-4"},
    )
    body["data"]["result"].append("not a sample")
    assert parse_allocations(body, "q") == {("team", "a"): ("GPU-1", "GPU-2"), ("other", "a"): ("GPU-3",)}


@pytest.mark.parametrize(
    "body",
    [
        {"status": "error", "error": "bad query"},
        {"status": "success", "data": {"resultType": "matrix", "result": []}},
        {"status": "success"},
        ["not", "an", "object"],
    ],
)
def test_an_answer_that_is_not_a_vector_is_unavailable(body: Any) -> None:
    with pytest.raises(AllocationsUnavailable, match="query q"):
        parse_allocations(body, "q")


class Prometheus(BaseHTTPRequestHandler):
    status = 200
    queries: list[str] = []

    def do_GET(self) -> None:
        params = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        Prometheus.queries.append(f"{urllib.parse.urlparse(self.path).path} {params['query'][0]}")
        body = json.dumps(vector({"namespace": "team", "pod": "a", "device": "GPU-1"})).encode()
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    Prometheus.queries = []
    Prometheus.status = 200
    server = ThreadingHTTPServer(("127.0.0.1", 0), Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_prometheus_is_asked_one_instant_query_for_the_node(prometheus: str) -> None:
    assert PrometheusAllocations(prometheus).devices("n1") == {("team", "a"): ("GPU-1",)}
    assert Prometheus.queries == [f"/api/v1/query {allocation_query('n1')}"]


def test_a_server_error_or_a_refused_connection_is_unavailable(prometheus: str) -> None:
    Prometheus.status = 503
    with pytest.raises(AllocationsUnavailable, match="503"):
        PrometheusAllocations(prometheus).devices("n1")
    with pytest.raises(AllocationsUnavailable):
        PrometheusAllocations("http://127.0.0.1:9", timeout_seconds=1.0).devices("n1")


# When and how the exporter is read.


def test_a_node_whose_kubelet_reports_every_device_is_never_asked() -> None:
    answers = Answers()
    devices = PodDevices(device_ids, answers)
    pods = [pod("a", reported="GPU-0"), pod("web", gpus=0), pod("new", phase="Pending")]
    seen = devices.read("n1", pods, 1.0, WHOLE)
    assert answers.asked == [] and seen.tried == (KUBELET,)
    assert seen.of(pods[0]) == ("GPU-0",) and seen.of(pods[2]) == ()


def test_a_running_pod_without_a_report_is_read_from_the_exporter_once_per_node_and_pass() -> None:
    answers = Answers({("team", "a"): ("GPU-1",)})
    devices = PodDevices(device_ids, answers)
    pods = [pod("a"), pod("b", reported="GPU-0")]
    first = devices.read("n1", pods, 1.0, WHOLE)
    again = devices.read("n1", [*pods, pod("c")], 1.0, WHOLE)  # a second hold on the node, same pass
    assert answers.asked == ["n1"]
    assert first.of(pods[0]) == ("GPU-1",) and first.of(pods[1]) == ("GPU-0",)
    assert first.tried == (KUBELET, f"{EXPORTER} (answered)")
    assert again.of(pod("c")) == () and again.tried == (KUBELET, f"{EXPORTER} (no series yet for c)")
    devices.read("n1", [*pods, pod("c")], 2.0, WHOLE)
    assert answers.asked == ["n1", "n1"]  # the next pass asks again for c
    # The moves and the release's wait read the node in the same pass a moment later: one answer.
    devices.read("n1", [*pods, pod("c")], 2.3, WHOLE)
    assert answers.asked == ["n1", "n1"]


def test_what_the_exporter_named_is_kept_for_the_pods_life() -> None:
    answers = Answers({("team", "a"): ("GPU-1",)})
    devices = PodDevices(device_ids, answers)
    devices.read("n1", [pod("a")], 1.0, WHOLE)
    answers.failing = True
    assert devices.read("n1", [pod("a")], 2.0, WHOLE).of(pod("a")) == ("GPU-1",)
    assert answers.asked == ["n1"]  # nothing left to ask
    # Another node's pass forgets none of this node's pods.
    devices.read("n2", [], 2.5, WHOLE)
    assert devices.read("n1", [pod("a")], 2.6, WHOLE).of(pod("a")) == ("GPU-1",)
    # The pod gone, then one of that name again: a new pod, asked about anew.
    devices.read("n1", [], 3.0, WHOLE)
    again = devices.read("n1", [pod("a", uid="other")], 4.0, WHOLE)
    assert again.of(pod("a", uid="other")) == ()
    assert again.tried == (KUBELET, f"{EXPORTER} (no answer: connection refused)")


def test_without_a_source_or_on_a_time_sliced_node_only_the_kubelet_is_read() -> None:
    alone = PodDevices(device_ids).read("n1", [pod("a")], 1.0, WHOLE)
    assert alone.of(pod("a")) == () and alone.tried == (KUBELET, f"{EXPORTER} (not configured)")
    answers = Answers({("team", "a"): ("GPU-1",)})
    sliced = PodDevices(device_ids, answers).read("n1", [pod("a")], 1.0, Card("GPU-1", replicas=4))
    assert sliced.of(pod("a")) == () and answers.asked == []
    assert "time-sliced" in sliced.tried[1]
    unshared = PodDevices(device_ids, answers).read("n1", [pod("a")], 1.0, Card("GPU-1", replicas=1))
    assert unshared.of(pod("a")) == ("GPU-1",)  # GPU feature discovery's label of an unshared GPU
    mig = PodDevices(device_ids, answers).read("n1", [pod("a")], 1.0, Card("GPU-1", partitions=("MIG-1",)))
    assert mig.of(pod("a")) == () and "MIG card" in mig.tried[1]


def test_an_answer_naming_one_gpu_for_two_pods_is_not_used() -> None:
    """A GPU shared without the replicas label: the series cannot tell its replicas apart."""
    answers = Answers({("team", "a"): ("GPU-1",)})
    devices = PodDevices(device_ids, answers)
    assert devices.read("n1", [pod("a")], 1.0, WHOLE).of(pod("a")) == ("GPU-1",)
    answers.answer[("team", "b")] = ("GPU-1",)
    seen = devices.read("n1", [pod("a"), pod("b")], 2.0, WHOLE)
    assert seen.of(pod("a")) == () and seen.of(pod("b")) == ()
    assert "GPU-1 named for several pods" in seen.tried[1]


# Through the hold.

NS = "gpuhealth-system"
CARD = "GPU-1"


class MemoryApi:
    """What `DeviceHold` calls of the API, over a dict; holders are named as the API names them."""

    def __init__(self, gpus: int) -> None:
        self.node: dict[str, Any] = {
            "metadata": {"name": "n1", "labels": {}, "annotations": {}},
            "status": {
                "allocatable": {"nvidia.com/gpu": str(gpus)},
                "capacity": {"nvidia.com/gpu": str(gpus)},
            },
        }
        self.pods: dict[str, dict[str, Any]] = {}
        self._names = count()

    def get(self, resource: Resource, name: str, **_: Any) -> dict[str, Any]:
        assert resource == NODE and name == "n1"
        return json.loads(json.dumps(self.node))

    def list(
        self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None, **_: Any
    ) -> ObjectList:
        assert resource == POD
        items = list(self.pods.values())
        if label_selector is not None:
            key, _, value = label_selector.partition("=")
            items = [p for p in items if p["metadata"].get("labels", {}).get(key) == value]
        return ObjectList(json.loads(json.dumps(items)), "1")

    def create(self, resource: Resource, obj: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        name = f"{obj['metadata']['generateName']}{next(self._names)}"
        made = {**json.loads(json.dumps(obj)), "status": {"phase": "Pending"}}
        made["metadata"].update(name=name, uid=f"uid-{name}")
        self.pods[name] = made
        return made

    def delete(self, resource: Resource, name: str, **_: Any) -> dict[str, Any]:
        if name not in self.pods:
            raise NotFound(f"pod {name}")
        return self.pods.pop(name)

    def update(self, resource: Resource, obj: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        self.node = json.loads(json.dumps(obj))
        return self.node

    def start(self) -> list[str]:
        """The kubelet of an old node: every holder running, no device reported."""
        for p in self.pods.values():
            p["status"] = {"phase": "Running"}
        return sorted(self.pods)


def quarantine() -> Quarantine:
    spec = QuarantineSpec(
        node="n1",
        device=CARD,
        path=DEVICE_PLUGIN,
        reason="XID 79",
        actor="alert/GPUDeviceUnhealthy",
        expires_at="2099-01-01T00:00:00Z",
        uuid=CARD,
    )
    return Quarantine(name="n1-gpu-1", spec=spec, uid="record-uid")


def test_a_card_is_held_through_the_exporter_where_the_kubelet_reports_nothing() -> None:
    api = MemoryApi(gpus=2)
    answers = Answers()
    hold = DeviceHold(api, NS, allocations=answers)  # type: ignore[arg-type]
    record = quarantine()
    assert (decided := hold.sync(record, True, 0.0)) is not None
    assert decided.state is HoldState.FILLING and decided.create == 2
    first, second = api.start()
    decided = hold.sync(record, True, 1.0)
    assert decided is not None and decided.state is HoldState.FILLING  # the series not scraped yet
    answers.answer = {(NS, first): ("GPU-0",), (NS, second): (CARD,)}
    decided = hold.sync(record, True, 2.0)
    assert decided is not None and decided.state is HoldState.HELD, decided.message
    assert sorted(api.pods) == [second]
    assert holds(api.node) == {CARD: "held"}
    # The hold stands through an outage of Prometheus: the holder's device is known.
    answers.failing = True
    decided = hold.sync(record, True, 500.0)
    assert decided is not None and decided.state is HoldState.HELD and sorted(api.pods) == [second]


def test_a_hold_neither_source_can_read_says_which_sources_were_tried() -> None:
    api = MemoryApi(gpus=1)
    answers = Answers()
    answers.failing = True
    hold = DeviceHold(api, NS, allocations=answers)  # type: ignore[arg-type]
    record = quarantine()
    hold.sync(record, True, 0.0)
    api.start()
    decided = hold.sync(record, True, 30.0)
    assert decided is not None and decided.state is HoldState.FILLING
    decided = hold.sync(record, True, 91.0)  # 61 s after the holder was first seen
    assert decided is not None and decided.state is HoldState.UNREADABLE
    assert KUBELET in decided.message
    assert f"{EXPORTER} (no answer: connection refused)" in decided.message
    assert api.pods == {}
