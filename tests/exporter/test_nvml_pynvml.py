"""`PynvmlSource` over a substituted `pynvml` (no GPU or driver on these machines).

Aspects covered: no library / no driver -> start() False with one log line, nothing read;
the real module on this machine imports and starts cleanly either way; full readings and
their conversions (milliwatts to watts, flags to bools); NOT_SUPPORTED readings absent and
logged once; GPU_IS_LOST and UNKNOWN make only that device unreachable; a GPU unreadable at
start is resolved later; the XID thread (events mapped to UUIDs by handle, other event
types ignored, wait errors backed off, register NOT_SUPPORTED skipped, bounded queue);
close() stops the thread, frees the event set and shuts NVML down, once; a MIG-enabled card
lists its MIG devices (UUID, instance ids, profile from the device name; free slots skipped), a
card with MIG off or without MIG support none.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from exporter.nvml_pynvml import PynvmlSettings, PynvmlSource, _handle_key
from gpuhealth.clock import ManualClock
from gpuhealth.nvml import DeviceReading, MigDevice, XidEvent

FAST = PynvmlSettings(xid_wait_seconds=0.02, error_backoff_seconds=0.01)


@dataclass(frozen=True)
class Handle:
    index: int


@dataclass(frozen=True)
class MigHandle:
    parent: int
    slot: int


@dataclass
class Gpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    ecc: tuple[int, int] = (5, 1)
    rows: tuple[int, int, int, int] = (3, 0, 1, 0)
    temperature: int = 64
    milliwatts: int = 512_250
    errors: dict[str, Exception] = field(default_factory=dict)
    """By function name: what that call raises for this GPU."""
    mig: tuple[str | None, ...] = ()
    """MIG mode on: the MIG UUID in each slot (None: a free slot); empty: MIG off."""


class FakeNvml:
    """The pynvml functions the source calls, over a list of fake GPUs."""

    def __init__(self, gpus: list[Gpu]) -> None:
        self.gpus = gpus
        self.init_error: Exception | None = None
        self.handle_errors: dict[int, Exception] = {}
        self.register_errors: dict[int, Exception] = {}
        self.registered: list[Handle] = []
        self.script: queue.Queue[Any] = queue.Queue()
        self.calls: list[str] = []
        self.waiting = threading.Event()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in (
            "nvmlInit",
            "nvmlShutdown",
            "nvmlDeviceGetCount",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetName",
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetRemappedRows",
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetPowerUsage",
            "nvmlEventSetCreate",
            "nvmlEventSetFree",
            "nvmlDeviceRegisterEvents",
            "nvmlEventSetWait_v2",
            "nvmlDeviceGetMigMode",
            "nvmlDeviceGetMaxMigDeviceCount",
            "nvmlDeviceGetMigDeviceHandleByIndex",
            "nvmlDeviceGetGpuInstanceId",
            "nvmlDeviceGetComputeInstanceId",
        ):
            monkeypatch.setattr(pynvml, name, getattr(self, name))

    def _gpu(self, handle: Handle, call: str) -> Gpu:
        gpu = self.gpus[handle.index]
        if call in gpu.errors:
            raise gpu.errors[call]
        return gpu

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        if index in self.handle_errors:
            raise self.handle_errors[index]
        return Handle(index)

    def nvmlDeviceGetUUID(self, handle: Handle | MigHandle) -> str:
        if isinstance(handle, MigHandle):
            return str(self.gpus[handle.parent].mig[handle.slot])
        return self._gpu(handle, "uuid").uuid

    def nvmlDeviceGetName(self, handle: Handle | MigHandle) -> str:
        if isinstance(handle, MigHandle):
            return f"{self.gpus[handle.parent].name} MIG 1g.10gb"
        return self._gpu(handle, "name").name

    def nvmlDeviceGetMigMode(self, handle: Handle) -> tuple[int, int]:
        mode = (
            pynvml.NVML_DEVICE_MIG_ENABLE
            if self._gpu(handle, "mig_mode").mig
            else pynvml.NVML_DEVICE_MIG_DISABLE
        )
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        return len(self._gpu(handle, "mig_count").mig)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, slot: int) -> MigHandle:
        if self.gpus[handle.index].mig[slot] is None:
            raise pynvml.NVMLError_NotFound()
        return MigHandle(handle.index, slot)

    def nvmlDeviceGetGpuInstanceId(self, handle: MigHandle) -> int:
        return 1 + handle.slot

    def nvmlDeviceGetComputeInstanceId(self, handle: MigHandle) -> int:
        return 0

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter_type: int) -> int:
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        gpu = self._gpu(handle, "ecc")
        return gpu.ecc[0] if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else gpu.ecc[1]

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        return self._gpu(handle, "rows").rows

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(handle, "temperature").temperature

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return self._gpu(handle, "power").milliwatts

    def nvmlEventSetCreate(self) -> str:
        self.calls.append("set-create")
        return "event-set"

    def nvmlEventSetFree(self, event_set: str) -> None:
        assert event_set == "event-set"
        self.calls.append("set-free")

    def nvmlDeviceRegisterEvents(self, handle: Handle, types: int, event_set: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError
        assert event_set == "event-set"
        if handle.index in self.register_errors:
            raise self.register_errors[handle.index]
        self.registered.append(handle)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        """Scripted items first (event data or an exception to raise), then timeouts."""
        try:
            item = self.script.get_nowait()
        except queue.Empty:
            self.waiting.set()
            time.sleep(timeout_ms / 1000)
            raise pynvml.NVMLError_Timeout() from None
        if isinstance(item, Exception):
            raise item
        return item

    def xid(self, index: int, xid: int, event_type: int = pynvml.nvmlEventTypeXidCriticalError) -> None:
        self.script.put(SimpleNamespace(device=Handle(index), eventType=event_type, eventData=xid))


def gpus(n: int) -> list[Gpu]:
    return [Gpu(uuid=f"GPU-{i:04d}") for i in range(n)]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(gpus(2))
    fake.install(monkeypatch)
    return fake


@pytest.fixture
def source(nvml: FakeNvml) -> Any:
    src = PynvmlSource(FAST, clock=ManualClock(start=1_800_000_000.0))
    yield src
    src.close()


def wait_for_events(src: PynvmlSource, count: int, timeout: float = 5.0) -> list[XidEvent]:
    events: list[XidEvent] = []
    deadline = time.monotonic() + timeout
    while len(events) < count and time.monotonic() < deadline:
        events += src.drain_xid_events()
        time.sleep(0.005)
    return events


@pytest.mark.parametrize(
    "error",
    [pynvml.NVMLError_LibraryNotFound(), pynvml.NVMLError_DriverNotLoaded()],
    ids=["library", "driver"],
)
def test_without_nvml_start_is_false_logged_once_and_nothing_is_read(
    nvml: FakeNvml, error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    nvml.init_error = error
    src = PynvmlSource(FAST)
    with caplog.at_level(logging.WARNING, logger="exporter.nvml_pynvml"):
        assert src.start() is False
        assert src.start() is False
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"NVML not available: {error}; NVML readings disabled"]
    assert (src.read(), src.drain_xid_events()) == ([], [])
    src.close()
    assert "shutdown" not in nvml.calls


def test_the_real_module_imports_and_starts_cleanly_on_this_machine() -> None:
    src = PynvmlSource(FAST)
    try:
        started = src.start()
        readings = src.read()
        assert all(isinstance(r, DeviceReading) for r in readings)
        if not started:  # no driver here: readings simply absent
            assert readings == []
    finally:
        src.close()


def test_full_readings_are_converted_to_plain_data(source: PynvmlSource, nvml: FakeNvml) -> None:
    assert source.start() is True
    assert source.read() == [
        DeviceReading(
            uuid=f"GPU-{i:04d}",
            index=i,
            reachable=True,
            name="NVIDIA H100 80GB HBM3",
            ecc_corrected_volatile=5,
            ecc_uncorrected_volatile=1,
            remapped_rows_correctable=3,
            remapped_rows_uncorrectable=0,
            remapped_rows_pending=True,
            remapped_rows_failure=False,
            temperature_celsius=64.0,
            power_watts=512.25,
        )
        for i in range(2)
    ]


def test_not_supported_readings_are_absent_and_logged_once(
    source: PynvmlSource, nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    nvml.gpus[1].errors = {
        "ecc": pynvml.NVMLError_NotSupported(),
        "rows": pynvml.NVMLError_NotSupported(),
        "power": pynvml.NVMLError_NoPermission(),
    }
    source.start()
    with caplog.at_level(logging.WARNING, logger="exporter.nvml_pynvml"):
        first = source.read()
        second = source.read()
    assert first == second
    assert first[0].ecc_corrected_volatile == 5
    assert first[1] == DeviceReading(
        uuid="GPU-0001", index=1, reachable=True, name="NVIDIA H100 80GB HBM3", temperature_celsius=64.0
    )
    assert len(caplog.records) == 4  # corrected, uncorrected, rows, power: once each across two reads


@pytest.mark.parametrize(
    ("error", "text"),
    [(pynvml.NVMLError_GpuIsLost(), "GPU is lost"), (pynvml.NVMLError_Unknown(), "Unknown Error")],
    ids=["lost", "unknown"],
)
def test_a_fatal_error_makes_only_that_device_unreachable(
    source: PynvmlSource, nvml: FakeNvml, error: Exception, text: str
) -> None:
    source.start()
    nvml.gpus[0].errors = {"temperature": error}
    readings = source.read()
    assert readings[0] == DeviceReading(uuid="GPU-0000", index=0, reachable=False, error=text)
    assert readings[1].reachable is True
    assert readings[1].temperature_celsius == 64.0
    nvml.gpus[0].errors = {}
    assert source.read()[0].reachable is True  # it answers again


def test_a_gpu_unreadable_at_start_is_resolved_later(source: PynvmlSource, nvml: FakeNvml) -> None:
    nvml.handle_errors[1] = pynvml.NVMLError_GpuIsLost()
    assert source.start() is True
    assert [r.uuid for r in source.read()] == ["GPU-0000"]  # no UUID, no reading
    del nvml.handle_errors[1]
    assert [r.uuid for r in source.read()] == ["GPU-0000", "GPU-0001"]
    assert nvml.registered == [Handle(0), Handle(1)]


def test_xid_events_are_collected_by_the_thread_with_uuid_and_time(
    source: PynvmlSource, nvml: FakeNvml
) -> None:
    source.start()
    nvml.xid(1, 79)
    nvml.xid(0, 13, event_type=0x1)  # single-bit ECC event type: not an XID, ignored
    nvml.xid(0, 48)
    events = wait_for_events(source, 2)
    assert events == [
        XidEvent(uuid="GPU-0001", xid=79, timestamp=1_800_000_000.0),
        XidEvent(uuid="GPU-0000", xid=48, timestamp=1_800_000_000.0),
    ]
    assert nvml.waiting.wait(5)  # then it keeps waiting (timeouts) with nothing more to drain
    assert source.drain_xid_events() == []


def test_event_wait_errors_back_off_and_the_thread_goes_on(
    source: PynvmlSource, nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    nvml.script.put(pynvml.NVMLError_GpuIsLost())
    nvml.script.put(pynvml.NVMLError_GpuIsLost())
    nvml.xid(0, 79)
    with caplog.at_level(logging.WARNING, logger="exporter.nvml_pynvml"):
        source.start()
        events = wait_for_events(source, 1)
    assert [e.xid for e in events] == [79]
    assert sum("event wait failed" in r.getMessage() for r in caplog.records) == 1


def test_devices_without_xid_support_are_skipped(
    source: PynvmlSource, nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    nvml.register_errors[0] = pynvml.NVMLError_NotSupported()
    with caplog.at_level(logging.WARNING, logger="exporter.nvml_pynvml"):
        assert source.start() is True
    assert nvml.registered == [Handle(1)]
    assert "XID events not watched on GPU-0000" in caplog.text
    assert len(source.read()) == 2  # readings are unaffected


def test_no_thread_without_any_watched_device(source: PynvmlSource, nvml: FakeNvml) -> None:
    nvml.register_errors = {0: pynvml.NVMLError_NotSupported(), 1: pynvml.NVMLError_NotSupported()}
    before = threading.active_count()
    source.start()
    assert threading.active_count() == before


def test_undrained_events_are_bounded_oldest_dropped(
    nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    src = PynvmlSource(PynvmlSettings(xid_wait_seconds=0.02, xid_queue_limit=2), clock=ManualClock())
    for xid in (31, 43, 79):
        nvml.xid(0, xid)
    with caplog.at_level(logging.WARNING, logger="exporter.nvml_pynvml"):
        src.start()
        assert nvml.waiting.wait(5)  # the three events were consumed
        events = src.drain_xid_events()
    src.close()
    assert [e.xid for e in events] == [43, 79]
    assert "1 dropped" in caplog.text


def test_close_stops_the_thread_frees_the_set_and_shuts_down_once(nvml: FakeNvml) -> None:
    src = PynvmlSource(FAST)
    src.start()
    assert any(t.name == "nvml-xid" for t in threading.enumerate())
    src.close()
    src.close()
    assert not any(t.name == "nvml-xid" for t in threading.enumerate())
    assert nvml.calls == ["init", "set-create", "set-free", "shutdown"]
    assert src.read() == []


def test_start_after_close_finds_the_devices_anew(nvml: FakeNvml) -> None:
    src = PynvmlSource(FAST)
    src.start()
    src.close()
    assert src.start() is True
    try:
        assert [r.uuid for r in src.read()] == ["GPU-0000", "GPU-0001"]
    finally:
        src.close()
    assert nvml.calls.count("init") == nvml.calls.count("shutdown") == 2


def test_real_handles_are_matched_by_address() -> None:
    device = pynvml.struct_c_nvmlDevice_t()
    first, second = ctypes.pointer(device), ctypes.pointer(device)
    assert first is not second
    assert _handle_key(first) == _handle_key(second) == ctypes.addressof(device)
    assert _handle_key(Handle(3)) == Handle(3)


@pytest.mark.parametrize(
    "kwargs", [{"xid_wait_seconds": 0}, {"xid_queue_limit": 0}, {"error_backoff_seconds": -1.0}]
)
def test_bad_settings_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        PynvmlSettings(**kwargs)


def test_a_mig_card_lists_its_mig_devices(source: PynvmlSource, nvml: FakeNvml) -> None:
    nvml.gpus[0].mig = ("MIG-a", None, "MIG-c")
    nvml.gpus[1].errors = {"mig_mode": pynvml.NVMLError_NotSupported()}  # a card without MIG
    source.start()
    card, plain = source.read()
    assert card.mig_devices == (
        MigDevice(uuid="MIG-a", gpu_instance_id=1, compute_instance_id=0, profile="1g.10gb"),
        MigDevice(uuid="MIG-c", gpu_instance_id=3, compute_instance_id=0, profile="1g.10gb"),
    )
    assert (plain.reachable, plain.mig_devices) == (True, ())
