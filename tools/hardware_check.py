#!/usr/bin/env python3
"""Check the real pieces on a GPU node, and print what each did.

    python tools/hardware_check.py                  # NVML, then probe and canary through docker
    python tools/hardware_check.py --on-host        # the checks' commands run on the host itself
    python tools/hardware_check.py --record         # a markdown block for docs/hardware.md
    python tools/hardware_check.py --json           # the whole report, for the record

Steps, in order (`docs/hardware.md` says what each proves and what it needs):

- `nvidia-smi`: the driver and CUDA versions, for the record;
- `nvml.start`, `nvml.read`, `nvml.xid`: the exporter's NVML adapter (`exporter.nvml_pynvml`)
  through the narrow interface the exporter reads (`gpuhealth.nvml.NvmlSource`): every GPU's
  identity and readings, XID events seen during a short listen, each read timed;
- `docker`, `pull`: where the checks run in containers, whether docker can give them a GPU;
- one step per check rung and GPU (`probe`, `canary`, and any `checks.extra`): the pod the
  responder would create for that card (`responder.checks.jobs.JobChecks.job`, on the
  device-plugin path: no GPU request, `NVIDIA_VISIBLE_DEVICES=<uuid>`), its container run with
  `docker run` or, with `--on-host`, its command run on the host. Read from the responder at run
  time, never copied here, so a changed probe is checked as it ships. A check passes as its Job
  does: its container exits 0.

A step that cannot run here (no pynvml, no driver, no GPU, no docker, no image, no binary)
is SKIPPED with the reason; nothing crashes for a missing piece. Exit 0 when every step that
ran passed, 1 when one failed, 2 for bad usage.

Runs with the project installed (the product's packages only: `gpuhealth`, `exporter`,
`responder`). Commands go through a `Runner` and NVML through a factory, so the tests
(`tests/tools/test_hardware_check.py`) drive it with fakes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TextIO, cast

from gpuhealth.cliargs import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, duration_seconds
from gpuhealth.durations import format_duration
from gpuhealth.kube.api import Api
from gpuhealth.nvml import DeviceReading, NvmlSource, XidEvent
from responder.checks.diag import EXIT_FILE, REPORT_FILE, Verdict, judge
from responder.checks.jobs import CheckSettings, JobChecks
from responder.enforce.backends import Backends
from responder.enforce.node_annotation import (
    DEVICE_PLUGIN,
    VISIBLE_DEVICES,
    VISIBLE_DEVICES_ROUTE,
    NodeAnnotation,
)
from responder.reconcile.policy import PolicySettings
from responder.records import Quarantine, QuarantineSpec, record_name

PASS, FAIL, SKIPPED = "PASS", "FAIL", "SKIPPED"
PROG = "hardware_check"

# Fields of the check's pod that have no meaning for one container on this host; anything else
# the responder adds later is reported as not applied rather than silently dropped.
_CONTAINER_APPLIED = {"name", "image", "command", "args", "env"}
_POD_APPLIED = {"containers", "restartPolicy", "nodeName", "tolerations", "runtimeClassName"}


# ----- what a step came to -------------------------------------------------------------------


@dataclass
class Step:
    """One step's result, as printed and as recorded."""

    name: str
    gpu: str = ""
    status: str = PASS
    reason: str = ""
    """Why it was skipped or failed; for a pass, a short note for the record."""
    command: list[str] | None = None
    exit_code: int | None = None
    seconds: float | None = None
    output_tail: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    """What it saw (readings, events), one line each."""


@dataclass
class Report:
    date: str
    host: str
    mode: str
    driver_version: str = ""
    cuda_version: str = ""
    gpus: list[dict[str, Any]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    def counts(self) -> Counter[str]:
        return Counter(s.status for s in self.steps)

    def exit_code(self) -> int:
        return EXIT_FAILED if self.counts()[FAIL] else EXIT_OK


# ----- running commands ----------------------------------------------------------------------


@dataclass(frozen=True)
class Completed:
    exit_code: int | None
    """None: the command never finished (timed out, or could not start: `error` says which)."""
    output: str
    seconds: float
    error: str = ""


class Runner(Protocol):
    def which(self, name: str) -> str | None:
        """The executable `name` resolves to (a bare name on PATH, or a path), None if none."""
        ...

    def run(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        """Run `argv` to its end or `timeout` seconds, stdout and stderr together; never raises."""
        ...


class SubprocessRunner:
    def which(self, name: str) -> str | None:
        return shutil.which(name)

    def run(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        started = time.monotonic()
        try:
            done = subprocess.run(
                list(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=None if env is None else dict(env),
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            partial = exc.output or b""
            text = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
            seconds = time.monotonic() - started
            return Completed(None, text, seconds, f"timed out after {format_duration(timeout)}")
        except OSError as exc:
            return Completed(None, "", time.monotonic() - started, f"could not start: {exc}")
        return Completed(done.returncode, done.stdout.decode(errors="replace"), time.monotonic() - started)


def _tail(text: str, lines: int) -> list[str]:
    return text.rstrip("\n").splitlines()[-lines:] if lines > 0 and text.strip() else []


# ----- options -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    on_host: bool = False
    docker_gpus: str = "runtime"
    """`runtime`: `--runtime <the checks' RuntimeClass> -e NVIDIA_VISIBLE_DEVICES=...`, as the
    check's pod gets its GPU; `gpus`: `--gpus device=...` (the toolkit's docker integration)."""
    pull: bool = False
    gpus: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    listen_seconds: float = 10.0
    timeout_seconds: float = PolicySettings().probe_timeout_seconds
    tail_lines: int = 20
    settings: CheckSettings = field(default_factory=CheckSettings)


# ----- the check's pod, as the responder builds it -------------------------------------------


class _NoApi:
    """The API client a JobChecks is built with here: building a Job's object reads nothing,
    and this proves it (any call raises)."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"the hardware check talks to no API server (Api.{name} was called)")


@dataclass(frozen=True)
class Container:
    """The check pod's container, in the terms one container run needs."""

    image: str
    entrypoint: tuple[str, ...]
    """Kubernetes `command` (docker's ENTRYPOINT); empty: the image's own."""
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    runtime_class: str
    not_applied: tuple[str, ...]
    results: str = ""
    """The probe's results folder inside the container (its emptyDir's mount path), judged after
    the run by the responder's own judge (`responder.checks.diag`); empty: the exit code decides."""


def check_container(
    settings: CheckSettings, kind: str, node: str, uuid: str, partitions: Sequence[str]
) -> Container:
    """The container of the `kind` check the responder would run for the card `uuid` on `node`
    (a device-plugin record: the pod asks for no GPU and the runtime gives it the card, every
    MIG partition of it where MIG is on)."""
    record = Quarantine(
        name=record_name(node, uuid),
        uid="hardware-check",
        spec=QuarantineSpec(
            node=node,
            device=uuid,
            path=DEVICE_PLUGIN,
            reason="hardware-check",
            actor="person/hardware-check",
            expires_at="",
            uuid=uuid,
            partitions=tuple(partitions),
        ),
    )
    api = cast(Api, _NoApi())
    # The runtime's route: outside Kubernetes there is no kubelet to allocate the card, so the
    # container is given it as the NVIDIA runtime would (`NVIDIA_VISIBLE_DEVICES`, or --gpus).
    node_backend = NodeAnnotation(api, runtime_class=settings.runtime_class, route=VISIBLE_DEVICES_ROUTE)
    job = JobChecks(api, Backends(api, (node_backend,)), settings).job(record, kind, 1)
    pod = job["spec"]["template"]["spec"]
    # The container that uses the card: the probe's diagnostic is an init container (its judge,
    # the pod's container, is run here in-process on what the diagnostic wrote).
    inits = pod.get("initContainers") or []
    first = inits[0] if inits else pod["containers"][0]
    results = next((str(m.get("mountPath")) for m in first.get("volumeMounts") or () if inits), "")
    env, dropped = [], []
    for entry in first.get("env") or ():
        if "value" in entry:
            env.append((str(entry["name"]), str(entry["value"])))
        else:
            dropped.append(f"env {entry.get('name')} (valueFrom)")
    dropped += [f"container.{k}" for k in sorted(first) if k not in _CONTAINER_APPLIED]
    dropped += [f"pod.{k}" for k in sorted(pod) if k not in _POD_APPLIED]
    dropped += [f"container {c.get('name')}" for c in (pod["containers"] if inits else pod["containers"][1:])]
    return Container(
        image=str(first["image"]),
        entrypoint=tuple(str(a) for a in first.get("command") or ()),
        args=tuple(str(a) for a in first.get("args") or ()),
        env=tuple(env),
        runtime_class=str(pod.get("runtimeClassName") or ""),
        not_applied=tuple(d for d in dropped if not (results and d == "container.volumeMounts")),
        results=results,
    )


# ----- the check -----------------------------------------------------------------------------


NvmlFactory = Callable[[], NvmlSource]


def open_pynvml() -> NvmlSource:
    """The exporter's real NVML source; ImportError where nvidia-ml-py is not installed."""
    from exporter.nvml_pynvml import PynvmlSource  # lazily: the rest runs without it

    return PynvmlSource()


@dataclass
class _Gpu:
    uuid: str
    name: str = ""
    partitions: tuple[str, ...] = ()


class HardwareCheck:
    def __init__(
        self,
        options: Options,
        *,
        runner: Runner,
        nvml: NvmlFactory,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        host: str = "",
        progress: Callable[[str], None] = lambda line: None,
        on_step: Callable[[Step], None] = lambda step: None,
    ) -> None:
        self.options = options
        self._runner = runner
        self._nvml = nvml
        self._clock = clock
        self._sleep = sleep
        self._progress = progress
        self._on_step = on_step
        mode = "host" if options.on_host else f"docker ({options.docker_gpus})"
        self.report = Report(now().strftime("%Y-%m-%d"), host or platform.node() or "unknown", mode)

    def _add(self, step: Step) -> Step:
        self.report.steps.append(step)
        self._on_step(step)
        return step

    def run(self) -> Report:
        self._driver()
        found = self._nvml_steps()
        gpus = self._gpus(found)
        self._checks(gpus)
        return self.report

    # -- the driver ---------------------------------------------------------------------------

    def _driver(self) -> None:
        if self._runner.which("nvidia-smi") is None:
            self._add(Step("nvidia-smi", status=SKIPPED, reason="nvidia-smi not found on PATH"))
            return
        argv = ["nvidia-smi"]
        done = self._runner.run(argv, timeout=60)
        step = self._command_step("nvidia-smi", "", argv, done)
        driver = re.search(r"Driver Version:\s*([\w.-]+)", done.output)
        cuda = re.search(r"CUDA Version:\s*([\w.-]+)", done.output)
        self.report.driver_version = driver.group(1) if driver else ""
        self.report.cuda_version = cuda.group(1) if cuda else ""
        step.details = [
            f"driver {self.report.driver_version or 'unknown'}, CUDA {self.report.cuda_version or 'unknown'}"
        ]
        self._add(step)

    # -- NVML, through the exporter's adapter -------------------------------------------------

    def _nvml_steps(self) -> list[DeviceReading] | None:
        """The GPUs NVML found (None: NVML did not run)."""
        try:
            source = self._nvml()
        except ImportError as exc:
            reason = f"pynvml not importable ({exc}): pip install nvidia-ml-py"
            self._add(Step("nvml.start", status=SKIPPED, reason=reason))
            return None
        try:
            return self._nvml_readings(source)
        finally:
            source.close()

    def _timed(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        started = self._clock()
        value = fn()
        return value, self._clock() - started

    def _nvml_readings(self, source: NvmlSource) -> list[DeviceReading] | None:
        started, seconds = self._timed(source.start)
        if not started:
            reason = "NVML did not start: no NVIDIA driver or libnvidia-ml here"
            self._add(Step("nvml.start", status=SKIPPED, reason=reason, seconds=seconds))
            return None
        first, read_seconds = self._timed(source.read)
        readings: list[DeviceReading] = first
        if not readings:
            self._add(Step("nvml.start", status=SKIPPED, reason="NVML found no GPU", seconds=seconds))
            return []
        self._add(Step("nvml.start", seconds=seconds, reason=f"{len(readings)} GPU(s)"))
        lost = [r.uuid for r in readings if not r.reachable]
        read = Step(
            "nvml.read", seconds=read_seconds, details=[line for r in readings for line in _describe(r)]
        )
        if lost:
            read.status, read.reason = FAIL, f"unreachable: {', '.join(lost)}"
        self._add(read)
        self.report.gpus = [_gpu_record(r) for r in readings]
        self._xid(source, readings)
        return readings

    def _xid(self, source: NvmlSource, before: list[DeviceReading]) -> None:
        listen = self.options.listen_seconds
        if listen <= 0:
            self._add(Step("nvml.xid", status=SKIPPED, reason="--listen 0"))
            return
        self._progress(f"listening {format_duration(listen)} for XID events")
        started = self._clock()
        self._sleep(listen)
        drained, drain_seconds = self._timed(source.drain_xid_events)
        events: list[XidEvent] = drained
        after, read_seconds = self._timed(source.read)
        step = Step("nvml.xid", seconds=self._clock() - started)
        step.reason = f"{len(events)} XID event(s) in {format_duration(listen)}"
        step.details = [f"XID {e.xid} on {e.uuid}" for e in events]
        step.details.append(f"drain: {_ms(drain_seconds)}; read again: {_ms(read_seconds)}")
        step.details += _changes(before, after)
        lost = [r.uuid for r in after if not r.reachable]
        if lost:
            step.status, step.reason = FAIL, f"unreachable after the listen: {', '.join(lost)}"
        self._add(step)

    # -- which GPUs the checks run on ---------------------------------------------------------

    def _gpus(self, found: list[DeviceReading] | None) -> list[_Gpu]:
        known = {r.uuid: r for r in found or ()}
        if not self.options.gpus:
            return [_Gpu(r.uuid, r.name or "", tuple(m.uuid for m in r.mig_devices)) for r in found or ()]
        chosen = []
        for uuid in self.options.gpus:
            if found is not None and uuid not in known:
                raise UsageError(
                    f"--gpu {uuid}: NVML found no such GPU (it found {', '.join(known) or 'none'})"
                )
            r = known.get(uuid)
            chosen.append(
                _Gpu(uuid, (r.name or "") if r else "", tuple(m.uuid for m in r.mig_devices) if r else ())
            )
        return chosen

    # -- probe, canary and any other check rung -----------------------------------------------

    def _checks(self, gpus: list[_Gpu]) -> None:
        settings = self.options.settings
        kinds = self.options.checks or tuple(s.name for s in settings.specs())
        if not gpus:
            for kind in kinds:
                reason = "no GPU to run it on: NVML found none (name one with --gpu UUID)"
                self._add(Step(kind, status=SKIPPED, reason=reason))
            return
        node = self.report.host
        plans = {
            (k, g.uuid): check_container(settings, k, node, g.uuid, g.partitions) for k in kinds for g in gpus
        }
        blocked = self._host_blocked(plans) if self.options.on_host else self._docker_blocked(plans)
        for kind in kinds:
            for gpu in gpus:
                container = plans[(kind, gpu.uuid)]
                why = blocked.get(container.image) if not self.options.on_host else blocked.get(kind)
                if why:
                    self._add(Step(kind, gpu=gpu.uuid, status=SKIPPED, reason=why))
                    continue
                self._add(self._run_check(kind, gpu, container))

    def _docker_blocked(self, plans: Mapping[tuple[str, str], Container]) -> dict[str, str]:
        """Why each image's checks cannot run through docker (no entry: they can)."""
        images = sorted({c.image for c in plans.values()})
        docker = self._runner.which("docker")
        if docker is None:
            why = "docker not found on PATH (install it with the NVIDIA container toolkit, or use --on-host)"
            self._add(Step("docker", status=SKIPPED, reason=why))
            return dict.fromkeys(images, why)
        argv = ["docker", "info", "--format", "{{.ServerVersion}} {{json .Runtimes}}"]
        done = self._runner.run(argv, timeout=60)
        if done.exit_code != 0:
            why = "docker cannot reach its daemon (see the docker step)"
            step = self._command_step("docker", "", argv, done)
            step.status, step.reason = (
                SKIPPED,
                "docker info failed: " + (done.error or f"exit {done.exit_code}"),
            )
            self._add(step)
            return dict.fromkeys(images, why)
        version, _, runtimes = done.output.strip().partition(" ")
        step = self._command_step("docker", "", argv, done)
        step.reason = f"server {version}"
        step.output_tail = []
        step.details = [f"runtimes: {', '.join(sorted(_json_keys(runtimes))) or 'unknown'}"]
        self._add(step)
        blocked: dict[str, str] = {}
        if self.options.docker_gpus == "runtime":
            wanted = {c.runtime_class for c in plans.values() if c.runtime_class}
            missing = sorted(wanted - _json_keys(runtimes))
            if missing:
                why = (
                    f"docker has no runtime {', '.join(missing)} (the checks' RuntimeClass): "
                    "nvidia-ctk runtime configure --runtime=docker, or --docker-gpus gpus"
                )
                return dict.fromkeys(images, why)
        for image in images:
            present = self._runner.run(
                ["docker", "image", "inspect", "--format", "{{.Id}}", image], timeout=60
            )
            if present.exit_code == 0:
                continue
            if not self.options.pull:
                blocked[image] = f"image {image} is not present locally: docker pull {image}, or pass --pull"
                continue
            self._progress(f"pulling {image}")
            argv = ["docker", "pull", image]
            pulled = self._command_step(
                "pull", "", argv, self._runner.run(argv, timeout=self.options.timeout_seconds)
            )
            pulled.reason = image if pulled.status == PASS else f"{image}: {pulled.reason}"
            self._add(pulled)
            if pulled.status != PASS:
                blocked[image] = f"image {image} could not be pulled (see the pull step)"
        return blocked

    def _host_blocked(self, plans: Mapping[tuple[str, str], Container]) -> dict[str, str]:
        """Why each check kind cannot run on this host (no entry: it can)."""
        blocked = {}
        for (kind, _), container in plans.items():
            argv = (*container.entrypoint, *container.args)
            if not argv:
                blocked[kind] = f"the {kind} check runs its image's own entrypoint: only docker can run it"
            elif self._runner.which(argv[0]) is None:
                blocked[kind] = (
                    f"{argv[0]} not found on this host (install it, or run the check through docker)"
                )
        return blocked

    def _run_check(self, kind: str, gpu: _Gpu, container: Container) -> Step:
        visible = ",".join(gpu.partitions or (gpu.uuid,))
        if self.options.on_host:
            argv = [*container.entrypoint, *container.args]
            # CUDA takes UUIDs here; DCGM does not read it and sees every GPU of the host.
            env = {**os.environ, **dict(container.env), "CUDA_VISIBLE_DEVICES": visible}
        else:
            argv = self._docker_argv(kind, gpu, container, visible)
            env = None
        folder = tempfile.mkdtemp(prefix=f"gpuhealth-{kind}-") if container.results else ""
        if folder and self.options.on_host:
            env = {**(env or {}), "GPUHEALTH_RESULTS": folder}
        elif folder:
            at = argv.index(container.image)
            argv[at:at] = ["-v", f"{folder}:{container.results}"]
        limit = self.options.timeout_seconds
        self._progress(f"running {kind} on {gpu.uuid} (up to {format_duration(limit)}): {' '.join(argv)}")
        done = self._runner.run(argv, timeout=limit, env=env)
        if done.exit_code is None and not self.options.on_host:
            # The docker client was stopped; its container may still run on the GPU.
            self._runner.run(["docker", "rm", "--force", _container_name(kind, gpu.uuid)], timeout=60)
        step = self._command_step(kind, gpu.uuid, argv, done)
        step.details = (
            [f"not applied outside Kubernetes: {', '.join(container.not_applied)}"]
            if container.not_applied
            else []
        )
        if folder and step.status != FAIL:
            # The diagnostic's container exits 0 whenever it could write its report: the verdict
            # is the judge's, as in the probe's pod.
            verdict = judge_folder(folder, gpus=max(1, len(gpu.partitions)))
            step.details.append(f"judged from DCGM's report: {verdict.reason}")
            if not verdict.passed:
                step.status, step.reason = FAIL, verdict.reason
        return step

    def _docker_argv(self, kind: str, gpu: _Gpu, container: Container, visible: str) -> list[str]:
        argv = ["docker", "run", "--rm", "--name", _container_name(kind, gpu.uuid)]
        env = list(container.env)
        if self.options.docker_gpus == "runtime":
            if container.runtime_class:
                argv += ["--runtime", container.runtime_class]
        else:
            # docker reads the value as CSV: a list of devices must be one quoted field.
            argv += ["--gpus", f'"device={visible}"' if "," in visible else f"device={visible}"]
            env = [(k, v) for k, v in env if k != VISIBLE_DEVICES]
        for name, value in env:
            argv += ["-e", f"{name}={value}"]
        if container.entrypoint:
            argv += ["--entrypoint", container.entrypoint[0]]
        return [*argv, container.image, *container.entrypoint[1:], *container.args]

    def _command_step(self, name: str, gpu: str, argv: Sequence[str], done: Completed) -> Step:
        step = Step(
            name,
            gpu=gpu,
            command=list(argv),
            exit_code=done.exit_code,
            seconds=done.seconds,
            output_tail=_tail(done.output, self.options.tail_lines),
        )
        if done.exit_code != 0:
            step.status = FAIL
            step.reason = done.error or f"exit {done.exit_code}"
        return step


def judge_folder(folder: str, *, gpus: int = 1) -> Verdict:
    """The responder's verdict on what a probe's diagnostic wrote into `folder`."""

    def read(name: str) -> str | None:
        try:
            with open(os.path.join(folder, name), errors="replace") as f:
                return f.read()
        except OSError:
            return None

    try:
        code: int | None = int((read(EXIT_FILE) or "").strip())
    except ValueError:
        code = None
    return judge(read(REPORT_FILE), code, gpus=gpus)


def _container_name(kind: str, uuid: str) -> str:
    return f"gpuhealth-hardware-check-{kind}-{re.sub(r'[^A-Za-z0-9]', '', uuid)}-{os.getpid()}"


def _json_keys(text: str) -> set[str]:
    try:
        value = json.loads(text)
    except ValueError:
        return set()
    return set(value) if isinstance(value, dict) else set()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _fmt(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _describe(r: DeviceReading) -> list[str]:
    if not r.reachable:
        return [f"{r.uuid} (index {r.index}): unreachable: {r.error}"]
    lines = [
        f"{r.uuid} (index {r.index}): {r.name or 'name n/a'}",
        f"  ECC volatile: corrected {_fmt(r.ecc_corrected_volatile)}, "
        f"uncorrected {_fmt(r.ecc_uncorrected_volatile)}",
        f"  remapped rows: correctable {_fmt(r.remapped_rows_correctable)}, uncorrectable "
        f"{_fmt(r.remapped_rows_uncorrectable)}, pending {_fmt(r.remapped_rows_pending)}, "
        f"failure {_fmt(r.remapped_rows_failure)}",
        f"  temperature {_fmt(r.temperature_celsius)} C, power {_fmt(r.power_watts)} W",
    ]
    if r.mig_devices:
        lines.append(f"  MIG devices: {len(r.mig_devices)}")
        lines += [
            f"    {m.uuid} (GI {m.gpu_instance_id}, CI {m.compute_instance_id}, {m.profile or 'profile n/a'})"
            for m in r.mig_devices
        ]
    else:
        lines.append("  MIG devices: none")
    return lines


_COUNTERS = (
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
)


def _changes(before: Sequence[DeviceReading], after: Sequence[DeviceReading]) -> list[str]:
    earlier = {r.uuid: r for r in before}
    lines = []
    for r in after:
        old = earlier.get(r.uuid)
        if old is None:
            lines.append(f"{r.uuid}: new since the first read")
            continue
        for name in _COUNTERS:
            was, now = getattr(old, name), getattr(r, name)
            if was != now:
                lines.append(f"{r.uuid}: {name} {_fmt(was)} -> {_fmt(now)}")
    return lines or ["ECC and row-remap readings unchanged"]


def _gpu_record(r: DeviceReading) -> dict[str, Any]:
    record = asdict(r)
    record["mig_devices"] = [asdict(m) for m in r.mig_devices]
    return record


# ----- output --------------------------------------------------------------------------------


def _seconds_text(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return _ms(seconds) if seconds < 1 else f"{seconds:.1f} s"


def step_text(step: Step) -> list[str]:
    head = f"[{step.status}] {step.name}"
    if step.gpu:
        head += f" {step.gpu}"
    facts = []
    if step.exit_code is not None:
        facts.append(f"exit {step.exit_code}")
    if step.seconds is not None:
        facts.append(_seconds_text(step.seconds))
    if facts:
        head += f"  ({', '.join(facts)})"
    if step.reason:
        head += f": {step.reason}"
    lines = [head]
    if step.command:
        lines.append(f"    $ {' '.join(step.command)}")
    lines += [f"    {line}" for line in step.details]
    lines += [f"    | {line}" for line in step.output_tail]
    return lines


def _counts_text(report: Report) -> str:
    counts = report.counts()
    return f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIPPED]} skipped"


def summary_line(report: Report) -> str:
    counts = report.counts()
    line = _counts_text(report)
    return line + ": nothing was checked" if not counts[PASS] and not counts[FAIL] else line


def _gpu_names(report: Report) -> str:
    names = Counter(str(g.get("name") or "unknown GPU") for g in report.gpus)
    return ", ".join(f"{n}x {name}" for name, n in names.items()) or "no GPU read"


def markdown(report: Report, version: str) -> str:
    """The block an operator pastes under "Results" in docs/hardware.md."""
    counts = report.counts()
    verdict = "failed" if counts[FAIL] else ("passed" if counts[PASS] else "nothing checked")
    lines = [
        f"### {report.date}: {_gpu_names(report)}",
        "",
        f"- Host `{report.host}`; driver {report.driver_version or 'unknown'}, "
        f"CUDA {report.cuda_version or 'unknown'}; gpuhealth {version}; checks through {report.mode}.",
        f"- Result: {verdict} ({_counts_text(report)}).",
        "",
        "| step | GPU | result | time | note |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in report.steps:
        note = s.reason.replace("|", "\\|")
        lines.append(f"| {s.name} | {s.gpu} | {s.status} | {_seconds_text(s.seconds)} | {note} |")
    return "\n".join(lines) + "\n"


def report_json(report: Report) -> str:
    doc = asdict(report)
    doc["summary"] = dict(report.counts())
    doc["exit_code"] = report.exit_code()
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


# ----- the command line ----------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Check the NVML adapter and the responder's probe and canary on this node's real GPUs "
        "(docs/hardware.md). Exit 0: every step that ran passed; 1: one failed; 2: bad usage.",
    )
    p.add_argument(
        "--on-host", action="store_true", help="run the checks' commands on this host, not in docker"
    )
    p.add_argument(
        "--docker-gpus",
        choices=("runtime", "gpus"),
        default="runtime",
        help="how docker gives a check its GPU: 'runtime' (--runtime <RuntimeClass> and "
        "NVIDIA_VISIBLE_DEVICES, as the check's pod gets it; default) or 'gpus' (--gpus device=<uuid>)",
    )
    p.add_argument("--pull", action="store_true", help="docker pull a check's image when it is not present")
    p.add_argument(
        "--gpu", action="append", default=[], metavar="UUID", help="check this GPU only (repeatable)"
    )
    p.add_argument(
        "--check", action="append", default=[], metavar="NAME", help="run this check rung only (repeatable)"
    )
    p.add_argument(
        "--listen",
        type=duration_seconds,
        default=10.0,
        metavar="DURATION",
        help="how long to listen for XID events (default 10s; 0 skips)",
    )
    p.add_argument(
        "--timeout",
        type=duration_seconds,
        default=None,
        metavar="DURATION",
        help="longest a check may run (default: the responder's probe timeout)",
    )
    p.add_argument(
        "--tail", type=int, default=20, metavar="N", help="output lines kept per command (default 20)"
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="the responder's config file: check its images and commands (checks.*) and its probe timeout",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the whole report as JSON")
    out.add_argument("--record", action="store_true", help="print a markdown block for docs/hardware.md")
    return p


def options_from(args: argparse.Namespace) -> Options:
    settings, timeout = CheckSettings(), PolicySettings().probe_timeout_seconds
    if args.config:
        from responder import config
        from responder.settings import ResponderSettings

        # Placeholders: the file is read for its checks and policy; nothing here serves or connects.
        base = ResponderSettings(token="-", identity=PROG, prometheus_url="http://localhost")
        try:
            loaded = config.load(args.config, base)
        except (config.ConfigError, ValueError) as exc:
            raise UsageError(f"--config {exc}") from exc
        settings, timeout = loaded.checks, loaded.reconciler.policy.probe_timeout_seconds
    names = [s.name for s in settings.specs()]
    for kind in args.check:
        if kind not in names:
            raise UsageError(f"--check {kind}: the responder has no such check (it has {', '.join(names)})")
    if args.tail < 0:
        raise UsageError("--tail must be 0 or more")
    if args.listen < 0 or (args.timeout is not None and args.timeout <= 0):
        raise UsageError("--listen must be 0 or more, --timeout more than 0")
    return Options(
        on_host=args.on_host,
        docker_gpus=args.docker_gpus,
        pull=args.pull,
        gpus=tuple(dict.fromkeys(args.gpu)),
        checks=tuple(dict.fromkeys(args.check)),
        listen_seconds=args.listen,
        timeout_seconds=args.timeout if args.timeout is not None else timeout,
        tail_lines=args.tail,
        settings=settings,
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpuhealth")
    except PackageNotFoundError:
        return "unknown"


def main(
    argv: Sequence[str] | None = None,
    *,
    runner: Runner | None = None,
    nvml: NvmlFactory = open_pynvml,
    out: TextIO | None = None,
    err: TextIO | None = None,
    **check_args: Any,
) -> int:
    """Parse, check, print; the exit code. `runner`, `nvml` and `check_args` (HardwareCheck's
    clock, sleep, now, host) are for tests."""
    out, err = out or sys.stdout, err or sys.stderr
    p = parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:  # argparse printed its usage error or the help
        return int(exc.code or 0)
    plain = not (args.json or args.record)

    def progress(line: str) -> None:
        print(f"{PROG}: {line}", file=err, flush=True)

    def on_step(step: Step) -> None:
        if plain:
            print("\n".join(step_text(step)), file=out, flush=True)

    try:
        options = options_from(args)
        check = HardwareCheck(
            options,
            runner=runner or SubprocessRunner(),
            nvml=nvml,
            progress=progress,
            on_step=on_step,
            **check_args,
        )
        report = check.run()
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=err)
        return EXIT_USAGE
    if args.json:
        out.write(report_json(report))
    elif args.record:
        out.write(markdown(report, _version()))
    else:
        print(summary_line(report), file=out)
    return report.exit_code()


if __name__ == "__main__":
    sys.exit(main())
