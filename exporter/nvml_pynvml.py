"""`NvmlSource` over the real NVML library through `pynvml` (package nvidia-ml-py).

The only module that imports `pynvml`. It turns NVML calls into the plain data of
`gpuhealth.nvml`: a `DeviceReading` per GPU and `XidEvent`s from a background thread that
waits on an NVML event set.

Error policy, per reading: NVML says a reading is not supported (or not permitted, or the
driver lacks the function) -> that reading is None, logged once per device and reading.
Any other NVML error on a device (GPU_IS_LOST first of all) -> the device is unreachable:
`DeviceReading(reachable=False, error=...)`, its other readings dropped. Without a driver
or library, `start()` returns False after one log line and every call returns nothing.

NVML calls are synchronous and can stall while a GPU falls off the bus: call `read()` from
a worker thread, not the event loop.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

from gpuhealth.clock import Clock, SystemClock
from gpuhealth.nvml import DeviceReading, MigDevice, XidEvent

log = logging.getLogger(__name__)

T = TypeVar("T")

# A reading that fails with one of these is absent (None); the device itself is fine.
_READING_ABSENT = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_NoPermission,
    pynvml.NVMLError_FunctionNotFound,
)


@dataclass(frozen=True)
class PynvmlSettings:
    """How the pynvml source waits for XID events."""

    xid_wait_seconds: float = 1.0
    """One nvmlEventSetWait call's timeout (NVML takes whole milliseconds); also about the
    longest `close()` waits for the thread."""
    xid_queue_limit: int = 10_000
    """Events kept until drained; beyond it the oldest are dropped (logged). An XID storm
    must not grow memory without bound when nobody drains."""
    error_backoff_seconds: float = 1.0
    """Pause after an event-wait error other than a timeout, so a broken set never spins."""

    def __post_init__(self) -> None:
        if not 0.001 <= self.xid_wait_seconds < 3600:  # also refuses NaN
            raise ValueError(f"xid_wait_seconds must be 0.001 to 3600, got {self.xid_wait_seconds}")
        if self.xid_queue_limit <= 0:
            raise ValueError(f"xid_queue_limit must be > 0, got {self.xid_queue_limit}")
        if not 0 <= self.error_backoff_seconds < 3600:
            raise ValueError(f"error_backoff_seconds must be 0 to 3600, got {self.error_backoff_seconds}")


def _text(value: str | bytes) -> str:
    # nvidia-ml-py decodes strings on Python 3; older bindings returned bytes.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _handle_key(handle: Any) -> Any:
    """A hashable key for a device handle that equals for two handles of the same device.

    Real handles are ctypes pointers into NVML's device table: the event data carries a new
    pointer object with the same address. Substituted (test) handles are used as they are.
    """
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str


class PynvmlSource:
    """Reads this node's GPUs through NVML; see the module docstring for the error policy."""

    def __init__(self, settings: PynvmlSettings | None = None, *, clock: Clock | None = None) -> None:
        self._settings = settings or PynvmlSettings()
        self._clock: Clock = clock or SystemClock()
        self._started = False
        self._unavailable_logged = False
        self._devices: list[_Device] = []
        self._unresolved: list[int] = []
        self._by_handle: dict[Any, str] = {}
        self._logged: set[tuple[str, ...]] = set()
        self._events: collections.deque[XidEvent] = collections.deque()
        self._events_lock = threading.Lock()
        self._dropped = 0
        self._event_set: Any = None
        self._registered = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> bool:
        """Initialise NVML, find the GPUs and start the XID thread; False without NVML."""
        if self._started:
            return True
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            if not self._unavailable_logged:
                self._unavailable_logged = True
                log.warning("NVML not available: %s; NVML readings disabled", exc)
            return False
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            log.warning("NVML not available: cannot count devices: %s; NVML readings disabled", exc)
            self._shutdown()
            return False
        self._started = True
        self._stop.clear()
        # A restart after close() finds the devices anew (handles are void after shutdown).
        self._devices, self._by_handle, self._registered = [], {}, 0
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("NVML event set unavailable: %s; XID events disabled", exc)
            self._event_set = None
        self._unresolved = list(range(count))
        self._resolve_pending()
        log.info("NVML started: %d device(s), %d watched for XID events", count, self._registered)
        return True

    def close(self) -> None:
        """Stop the XID thread, free the event set and shut NVML down (safe to call twice)."""
        if not self._started:
            return
        self._started = False
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self._settings.xid_wait_seconds + 1.0)
            if thread.is_alive():
                # Freeing the set or shutting NVML down under a waiting call could crash the
                # process; the daemon thread ends with it instead.
                log.warning("NVML XID thread did not stop in time; leaving NVML initialised")
                return
        if self._event_set is not None:
            self._call_quietly(pynvml.nvmlEventSetFree, self._event_set)
            self._event_set = None
        self._shutdown()

    def _shutdown(self) -> None:
        self._call_quietly(pynvml.nvmlShutdown)

    @staticmethod
    def _call_quietly(fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except pynvml.NVMLError as exc:
            log.debug("%s failed: %s", getattr(fn, "__name__", fn), exc)

    # -- devices -----------------------------------------------------------------------

    def _resolve_pending(self) -> None:
        """Get handle and UUID of devices not resolved yet (a GPU lost at start has none).

        Until a device is resolved it has no reading: without its UUID nothing could say
        which GPU a reading belongs to.
        """
        still: list[int] = []
        for index in self._unresolved:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError as exc:
                self._log_once(("resolve", str(index), str(exc)), "NVML device %d unreadable: %s", index, exc)
                still.append(index)
                continue
            self._devices.append(_Device(index, handle, uuid))
            self._by_handle[_handle_key(handle)] = uuid
            self._register_xid(handle, uuid)
        self._unresolved = still
        self._devices.sort(key=lambda d: d.index)

    def _register_xid(self, handle: Any, uuid: str) -> None:
        if self._event_set is None:
            return
        try:
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set)
        except pynvml.NVMLError as exc:
            self._log_once(("xid", uuid), "XID events not watched on %s: %s", uuid, exc)
            return
        self._registered += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._xid_loop, name="nvml-xid", daemon=True)
            self._thread.start()

    def read(self) -> list[DeviceReading]:
        """Current readings of every resolved device; never raises for a device's errors."""
        if not self._started:
            return []
        if self._unresolved:
            self._resolve_pending()
        return [self._read_device(d) for d in self._devices]

    def _read_device(self, d: _Device) -> DeviceReading:
        handle = d.handle
        try:
            name = self._reading(d, "name", pynvml.nvmlDeviceGetName, handle)
            corrected = self._reading(
                d,
                "ecc_corrected",
                pynvml.nvmlDeviceGetTotalEccErrors,
                handle,
                pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
            uncorrected = self._reading(
                d,
                "ecc_uncorrected",
                pynvml.nvmlDeviceGetTotalEccErrors,
                handle,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
            rows = self._reading(d, "remapped_rows", pynvml.nvmlDeviceGetRemappedRows, handle)
            temperature = self._reading(
                d, "temperature", pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
            )
            milliwatts = self._reading(d, "power", pynvml.nvmlDeviceGetPowerUsage, handle)
            mig_devices = self._mig_devices(d)
        except pynvml.NVMLError as exc:
            # GPU_IS_LOST, UNKNOWN, RESET_REQUIRED...: the device is not readable at all.
            self._log_once(("lost", d.uuid, str(exc)), "NVML device %s unreachable: %s", d.uuid, exc)
            return DeviceReading(uuid=d.uuid, index=d.index, reachable=False, error=str(exc))
        correctable, uncorrectable, pending, failure = rows if rows is not None else (None,) * 4
        return DeviceReading(
            uuid=d.uuid,
            index=d.index,
            reachable=True,
            name=_text(name) if name is not None else None,
            ecc_corrected_volatile=None if corrected is None else int(corrected),
            ecc_uncorrected_volatile=None if uncorrected is None else int(uncorrected),
            remapped_rows_correctable=None if correctable is None else int(correctable),
            remapped_rows_uncorrectable=None if uncorrectable is None else int(uncorrectable),
            remapped_rows_pending=None if pending is None else bool(pending),
            remapped_rows_failure=None if failure is None else bool(failure),
            temperature_celsius=None if temperature is None else float(temperature),
            power_watts=None if milliwatts is None else milliwatts / 1000.0,
            mig_devices=mig_devices,
        )

    def _mig_devices(self, d: _Device) -> tuple[MigDevice, ...]:
        """The card's MIG devices while MIG mode is on: their UUIDs (what the device plugin and
        the DRA driver name them by) and instance ids. Read every poll: the MIG manager may
        repartition a card while the exporter runs. A card without MIG support has none."""
        mode = self._reading(d, "mig_mode", pynvml.nvmlDeviceGetMigMode, d.handle)
        if mode is None or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            return ()
        out = []
        for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(d.handle))):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(d.handle, slot)
            except pynvml.NVMLError_NotFound:
                continue  # a free slot: no instance created there
            name = _text(pynvml.nvmlDeviceGetName(mig))
            out.append(
                MigDevice(
                    uuid=_text(pynvml.nvmlDeviceGetUUID(mig)),
                    gpu_instance_id=int(pynvml.nvmlDeviceGetGpuInstanceId(mig)),
                    compute_instance_id=int(pynvml.nvmlDeviceGetComputeInstanceId(mig)),
                    # NVML names a MIG device "<card> MIG <profile>" ("... MIG 1g.10gb").
                    profile=name.rpartition(" MIG ")[2] if " MIG " in name else "",
                )
            )
        return tuple(out)

    def _reading(self, d: _Device, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except _READING_ABSENT as exc:
            self._log_once(("absent", d.uuid, what), "NVML %s of %s not available: %s", what, d.uuid, exc)
            return None

    def _log_once(self, key: tuple[str, ...], message: str, *args: Any) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)

    # -- XID events --------------------------------------------------------------------

    def _xid_loop(self) -> None:
        settings = self._settings
        event_set = self._event_set
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, round(settings.xid_wait_seconds * 1000))
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as exc:
                # A lost GPU can make the wait itself fail; back off instead of spinning.
                self._log_once(("wait", str(exc)), "NVML event wait failed: %s; retrying", exc)
                self._stop.wait(settings.error_backoff_seconds)
                continue
            except Exception:
                log.exception("NVML XID thread failed; XID events disabled")
                return
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            uuid = self._event_uuid(data.device)
            if uuid is None:
                self._log_once(
                    ("orphan", str(data.eventData)),
                    "XID %s from an unidentified device ignored",
                    data.eventData,
                )
                continue
            self._push(XidEvent(uuid=uuid, xid=int(data.eventData), timestamp=self._clock.now()))

    def _event_uuid(self, handle: Any) -> str | None:
        uuid = self._by_handle.get(_handle_key(handle))
        if uuid is not None:
            return uuid
        try:  # not one of ours by address: ask NVML (fails for a GPU that is already lost)
            return _text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError:
            return None

    def _push(self, event: XidEvent) -> None:
        with self._events_lock:
            if len(self._events) >= self._settings.xid_queue_limit:
                self._events.popleft()
                self._dropped += 1
                if self._dropped == 1 or self._dropped % 1000 == 0:
                    log.warning("XID events not drained in time: %d dropped so far", self._dropped)
            self._events.append(event)

    def drain_xid_events(self) -> list[XidEvent]:
        """XID events seen since the previous call, oldest first."""
        with self._events_lock:
            events = list(self._events)
            self._events.clear()
        return events
