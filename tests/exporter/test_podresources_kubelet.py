"""`KubeletPodResources` against a real gRPC server on a unix socket, as the kubelet serves it.

Aspects covered: the reader calls `/v1.PodResourcesLister/GetAllocatableResources` with the empty
request and decodes the answer (encoded by the simulated kubelet's encoder: device-plugin GPUs,
time-slicing replicas, other resources); it calls `List` the same way and decodes each pod's
containers' devices, each method's failures logged on their own; every failure is no answer
(None), counted, logged once per failing streak with a reason an operator can act on: no socket
at the path, a kubelet that does not serve the method (an old kubelet: UNIMPLEMENTED), a kubelet
that refuses the call (UNAVAILABLE), one that does not answer within the deadline, an answer that
is not the message; a kubelet that comes back (started late, or restarted on the same path) is
read again; the flag's forms (`unix:///PATH`) and bad values are refused with the expected forms
named."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from exporter.cli import pod_resources_source
from exporter.podresources import GPU_RESOURCE, Allocatable, Assigned, Assignments
from exporter.podresources_kubelet import SERVICE, KubeletPodResources
from exporter.podresources_reads import ALLOCATABLE
from exporter.settings import ExporterSettings, NvmlSettings, ObserverSettings
from gpuhealth.fields import SettingsError
from simulator.pod_resources import encode_allocatable, encode_list

U0 = "GPU-00000000-0000-0000-0000-000000000000"
U1 = "GPU-11111111-1111-1111-1111-111111111111"
LOGGER = "exporter.podresources_reads"
METHOD = SERVICE + ALLOCATABLE

Handler = Callable[[bytes, grpc.ServicerContext], bytes]


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory: a unix socket path must fit in 107 bytes, pytest's tmp_path may not."""
    path = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Kubelet:
    """A gRPC server on a unix socket serving `v1.PodResourcesLister` methods as given."""

    def __init__(self, path: Path, methods: dict[str, Handler]) -> None:
        self.requests: list[bytes] = []
        handlers = {n: grpc.unary_unary_rpc_method_handler(self._recorded(h)) for n, h in methods.items()}
        self.server = grpc.server(ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", handlers),)
        )
        self.server.add_insecure_port(f"unix://{path}")
        self.server.start()

    def _recorded(self, handler: Handler) -> Handler:
        def serve(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.requests.append(request)
            return handler(request, context)

        return serve

    def stop(self) -> None:
        self.server.stop(None).wait()


@pytest.fixture
def kubelets() -> Iterator[Callable[[Path, dict[str, Handler]], Kubelet]]:
    started: list[Kubelet] = []

    def start(path: Path, methods: dict[str, Handler]) -> Kubelet:
        started.append(Kubelet(path, methods))
        return started[-1]

    yield start
    for kubelet in started:
        kubelet.stop()


def answering(devices: dict[str, list[str]]) -> Handler:
    return lambda request, context: encode_allocatable(devices)


def aborting(code: grpc.StatusCode, details: str) -> Handler:
    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(code, details)
        raise AssertionError("abort returns only by raising")

    return handler


@pytest.fixture
def reader(socket_dir: Path) -> Iterator[KubeletPodResources]:
    source = KubeletPodResources(str(socket_dir / "kubelet.sock"), "gpu-dp-0", timeout=5.0)
    yield source
    source.close()


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_the_answer_is_read_with_the_empty_request_and_decoded(
    reader: KubeletPodResources, socket_dir: Path, kubelets: Any
) -> None:
    devices = {GPU_RESOURCE: [f"{U0}::0", f"{U0}::1"], "example.com/nic": ["nic-0"]}
    kubelet = kubelets(socket_dir / "kubelet.sock", {"GetAllocatableResources": answering(devices)})

    answer = reader.allocatable()

    assert answer == Allocatable(
        {GPU_RESOURCE: frozenset(devices[GPU_RESOURCE]), "example.com/nic": frozenset({"nic-0"})}
    )
    assert answer.lists(U0) and not answer.lists(U1)
    assert kubelet.requests == [b""]
    assert reader.failures == 0
    assert METHOD == "/v1.PodResourcesLister/GetAllocatableResources"


def test_the_pods_devices_are_listed_with_the_empty_request_and_decoded(
    reader: KubeletPodResources, socket_dir: Path, kubelets: Any, caplog: pytest.LogCaptureFixture
) -> None:
    listed = [("team-a", "train-0", [("main", GPU_RESOURCE, [f"{U0}::1"]), ("side", GPU_RESOURCE, [U1])])]
    kubelet = kubelets(
        socket_dir / "kubelet.sock",
        {"List": lambda request, context: encode_list(listed)},  # an old kubelet: List only
    )
    caplog.set_level(logging.INFO, LOGGER)

    assert reader.assignments() == Assignments(
        {
            ("team-a", "train-0"): (
                Assigned("main", GPU_RESOURCE, f"{U0}::1"),
                Assigned("side", GPU_RESOURCE, U1),
            )
        }
    )
    assert kubelet.requests == [b""] and reader.failures == 0
    # The other method's failure is its own: logged with its name, List keeps answering.
    assert reader.allocatable() is None and reader.assignments() is not None
    [message] = warnings(caplog)
    assert "GetAllocatableResources" in message and "idle GPUs keep their evidence" in message


def test_an_empty_answer_is_an_answer_no_gpu_is_allocatable(
    reader: KubeletPodResources, socket_dir: Path, kubelets: Any
) -> None:
    kubelets(socket_dir / "kubelet.sock", {"GetAllocatableResources": answering({})})
    assert reader.allocatable() == Allocatable({})
    assert reader.failures == 0


def test_a_missing_socket_is_no_answer_naming_the_path_and_the_mount(
    reader: KubeletPodResources, socket_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    assert reader.allocatable() is None
    assert reader.failures == 1
    [message] = warnings(caplog)
    assert f"no socket at {socket_dir / 'kubelet.sock'}" in message
    assert f"{socket_dir} is not mounted" in message


def test_an_old_kubelet_without_the_method_is_named_with_the_version_it_needs(
    reader: KubeletPodResources, socket_dir: Path, kubelets: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A kubelet before 1.21 serves v1.PodResourcesLister with List only.
    kubelet = kubelets(socket_dir / "kubelet.sock", {"List": answering({})})
    caplog.set_level(logging.INFO, LOGGER)

    assert reader.allocatable() is None

    assert reader.failures == 1 and kubelet.requests == []
    [message] = warnings(caplog)
    assert f"does not serve {METHOD}" in message
    assert "Kubernetes 1.23 or later" in message and "KubeletPodResourcesGetAllocatable" in message


def test_a_refused_call_is_no_answer_with_the_kubelets_status(
    reader: KubeletPodResources, socket_dir: Path, kubelets: Any, caplog: pytest.LogCaptureFixture
) -> None:
    refusing = aborting(grpc.StatusCode.UNAVAILABLE, "device manager not started")
    kubelets(socket_dir / "kubelet.sock", {"GetAllocatableResources": refusing})
    caplog.set_level(logging.INFO, LOGGER)

    assert reader.allocatable() is None
    assert reader.allocatable() is None

    assert reader.failures == 2
    # Logged once for the failing streak, not once a poll.
    [message] = warnings(caplog)
    assert "UNAVAILABLE: device manager not started" in message


def test_a_kubelet_that_does_not_answer_in_time_costs_one_read(socket_dir: Path, kubelets: Any) -> None:
    release = threading.Event()

    def hanging(request: bytes, context: grpc.ServicerContext) -> bytes:
        release.wait(30)
        return encode_allocatable({})

    kubelets(socket_dir / "kubelet.sock", {"GetAllocatableResources": hanging})
    source = KubeletPodResources(str(socket_dir / "kubelet.sock"), "gpu-dp-0", timeout=0.2)
    try:
        assert source.allocatable() is None
        assert source.failures == 1
    finally:
        release.set()
        source.close()


def test_an_answer_that_is_not_the_message_is_no_answer(
    reader: KubeletPodResources, socket_dir: Path, kubelets: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Field 1 announces 5 bytes and holds 2.
    kubelets(socket_dir / "kubelet.sock", {"GetAllocatableResources": lambda request, context: b"\x0a\x05ab"})
    caplog.set_level(logging.INFO, LOGGER)
    assert reader.allocatable() is None
    assert reader.failures == 1
    [message] = warnings(caplog)
    assert "5 bytes announced, 2 left" in message


def read_until_answered(source: KubeletPodResources, deadline_s: float = 20.0) -> Allocatable:
    """Poll as the observer does until the kubelet answers (its channel reconnects with backoff)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        answer = source.allocatable()
        if answer is not None:
            return answer
        time.sleep(0.1)
    raise AssertionError(f"no answer within {deadline_s} s")


def test_a_kubelet_that_starts_late_or_restarts_is_read_again(
    reader: KubeletPodResources, socket_dir: Path, kubelets: Any, caplog: pytest.LogCaptureFixture
) -> None:
    path = socket_dir / "kubelet.sock"
    caplog.set_level(logging.INFO, LOGGER)
    assert reader.allocatable() is None

    first = kubelets(path, {"GetAllocatableResources": answering({GPU_RESOURCE: [U0, U1]})})
    assert read_until_answered(reader) == Allocatable({GPU_RESOURCE: frozenset({U0, U1})})
    assert any("answer again" in r.getMessage() for r in caplog.records if r.name == LOGGER)

    # The kubelet restarts on the same path, its plugin now reporting U1 Unhealthy.
    first.stop()
    path.unlink(missing_ok=True)
    kubelets(path, {"GetAllocatableResources": answering({GPU_RESOURCE: [U0]})})
    deadline = time.monotonic() + 20.0
    answer = read_until_answered(reader)
    while answer != Allocatable({GPU_RESOURCE: frozenset({U0})}) and time.monotonic() < deadline:
        answer = read_until_answered(reader)
    assert answer == Allocatable({GPU_RESOURCE: frozenset({U0})})


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"socket_path": "var/lib/kubelet/pod-resources/kubelet.sock"}, "absolute path"),
        ({"node": ""}, "node must be a node name"),
        ({"timeout": 0.0}, "timeout must be > 0 seconds"),
    ],
)
def test_bad_construction_is_refused_with_the_reason(kwargs: dict[str, Any], error: str) -> None:
    arguments: dict[str, Any] = {"socket_path": "/run/kubelet.sock", "node": "n", **kwargs}
    with pytest.raises(ValueError, match=error):
        KubeletPodResources(arguments.pop("socket_path"), arguments.pop("node"), **arguments)


def _settings(pod_resources: str) -> ExporterSettings:
    return ExporterSettings(
        observer=ObserverSettings(node_name="gpu-dp-0"),
        nvml=NvmlSettings(source="pynvml"),
        pod_resources=pod_resources,
    )


def test_the_flag_names_the_kubelets_socket(socket_dir: Path) -> None:
    source = pod_resources_source(_settings(f"unix://{socket_dir}/kubelet.sock"))
    assert isinstance(source, KubeletPodResources)
    source.close()


@pytest.mark.parametrize(
    "value", ["unix:var/lib/kubelet/kubelet.sock", "unix://relative/kubelet.sock", "unix://", "grpc:///x"]
)
def test_a_socket_that_is_not_an_absolute_unix_path_is_refused(value: str) -> None:
    with pytest.raises(SettingsError, match=r"none, unix:///PATH \(the kubelet's socket\) or sim:URL"):
        _settings(value)
