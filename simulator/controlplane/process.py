"""One control-plane component as a child process: its log, its readiness, its stop.

Each runs with its output in `<workdir>/<name>.log`. `wait_ready` polls a probe under a
deadline and, when the process exits or the deadline passes, raises `ControlPlaneError`
carrying the tail of the log (what a person needs to see why). `stop` sends SIGTERM, then
SIGKILL after a grace period, and reaps the process. `restart` stops it and starts the same
argv again (same ports, same files, the same log appended to), then awaits the probe it was
last made ready with: the component is the same object before and after, its `pid` the new one.

Each child runs in its own process group (a Ctrl-C at the terminal reaches only us, and we
stop the components in order) with SIGINT and SIGTERM at their defaults, whatever we ignore.
It also gets `PR_SET_PDEATHSIG` (Linux): if this process dies without stopping them (SIGKILL,
a crash), the kernel sends them SIGKILL, so nothing is left behind either way. Not SIGTERM: all
of them get it at once, etcd goes first, and kube-apiserver's graceful shutdown then waits on
its storage for ever (seen on 1.37.2). That signal
follows the *thread* that started them: start a control plane from a thread that lives as long
as it does (the main thread, in the CLI and the tests).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

LOG_TAIL_BYTES = 3000
STOP_GRACE_SECONDS = 10.0
_PR_SET_PDEATHSIG = 1


class ControlPlaneError(RuntimeError):
    """A component could not be started or became unhealthy; the message says why."""


def _child_setup() -> None:  # runs in the child between fork and exec
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def log_tail(path: Path, size: int = LOG_TAIL_BYTES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


class Component:
    """A started child process named `name`; `argv[0]` is its binary."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.probe: Callable[[], bool] | None = None
        """The readiness probe of the last `wait_ready`, which `restart` awaits again."""
        self.starts = 0
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as log:
            if self.starts:
                # A line between two runs' output, so a log tail shows which run said what.
                log.write(
                    f"--- gpuhealth: {self.name} started again (start {self.starts + 1}) ---\n".encode()
                )
                log.flush()
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=_child_setup,  # only prctl runs between fork and exec
            )
        self.starts += 1
        return proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def failure(self, what: str) -> ControlPlaneError:
        return ControlPlaneError(
            f"{self.name}: {what}\n--- {self.log_path} (tail) ---\n{log_tail(self.log_path)}"
        )

    def wait_ready(self, probe: Callable[[], bool], *, timeout: float, interval: float = 0.05) -> float:
        """Poll `probe` until true; the seconds it took. ControlPlaneError on exit or timeout."""
        self.probe = probe
        started = time.monotonic()
        last_error = ""
        while True:
            if not self.running():
                raise self.failure(f"exited with status {self.proc.returncode} before it was ready")
            try:
                if probe():
                    return time.monotonic() - started
            except OSError as exc:
                last_error = f" (last probe error: {exc})"
            if time.monotonic() - started > timeout:
                raise self.failure(f"not ready after {timeout:.0f} s{last_error}")
            time.sleep(interval)

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; returns once the process is reaped."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self, *, timeout: float, grace: float = STOP_GRACE_SECONDS) -> float:
        """Stop, start the same argv again, await the last probe; the seconds until it was ready
        (the stop included). ControlPlaneError when it was never made ready, or is not again."""
        probe = self.probe
        if probe is None:
            raise ControlPlaneError(f"{self.name}: never made ready, so there is no probe to restart on")
        started = time.monotonic()
        self.stop(grace)
        self.proc = self._spawn()
        self.wait_ready(probe, timeout=timeout)
        return time.monotonic() - started
