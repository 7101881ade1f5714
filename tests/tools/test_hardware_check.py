"""The hardware check script (`tools/hardware_check.py`), driven with a fake NVML source and a
fake command runner: no GPU, no docker.

Aspects covered: it runs as a script with the project installed; the NVML steps print every GPU's
identity and readings, the XID events of the listen window and each read's timing, and fail on
an unreachable GPU; the checks run the container the responder builds for that card (its image,
command and NVIDIA_VISIBLE_DEVICES read from `responder.checks.jobs` at run time, or from a
responder config file), through docker either way it can give a GPU, or on the host; each check
prints its command, exit code, duration and output tail; a step that cannot run is SKIPPED with
its reason; a timed-out container is removed; `--json` and `--record` carry the same steps;
exit 0 only when every step that ran passed, 1 when one failed, 2 for bad usage.
"""

from __future__ import annotations

import datetime
import io
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.nvml import DeviceReading, MigDevice, XidEvent
from responder.checks.diag import EXIT_FILE, REPORT_FILE
from responder.checks.jobs import CANARY, PROBE
from tests.responder.test_checks_diag import v4_report, v4_result
from tools import hardware_check as hc

REPO = Path(__file__).resolve().parents[2]
GPU_A = "GPU-0a0a0a0a-1111-2222-3333-444444444444"
GPU_B = "GPU-0b0b0b0b-1111-2222-3333-444444444444"
NVIDIA_SMI = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 570.86.15              Driver Version: 570.86.15      CUDA Version: 12.8     |
+-----------------------------------------------------------------------------------------+
"""
RUNTIMES = 'v27.5.1 {"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}'


def reading(uuid: str, index: int, **kw: Any) -> DeviceReading:
    base: dict[str, Any] = {
        "name": "NVIDIA H100 80GB HBM3",
        "ecc_corrected_volatile": 0,
        "ecc_uncorrected_volatile": 0,
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "temperature_celsius": 31.0,
        "power_watts": 70.5,
    }
    base.update(kw)
    return DeviceReading(uuid=uuid, index=index, reachable=True, **base)


@dataclass
class FakeNvml:
    """An `NvmlSource`: one list of readings per read() call (the last repeats), XID events for
    the drain after the listen window."""

    reads: list[list[DeviceReading]]
    events: list[XidEvent] = field(default_factory=list)
    starts: bool = True
    closed: bool = False
    calls: list[str] = field(default_factory=list)

    def start(self) -> bool:
        self.calls.append("start")
        return self.starts

    def read(self) -> list[DeviceReading]:
        self.calls.append("read")
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]

    def drain_xid_events(self) -> list[XidEvent]:
        self.calls.append("drain")
        return self.events

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeRunner:
    """Answers commands by their first words; `installed` is what `which` finds."""

    answers: dict[tuple[str, ...], hc.Completed] = field(default_factory=dict)
    installed: set[str] = field(default_factory=lambda: {"nvidia-smi", "docker"})
    calls: list[tuple[list[str], Mapping[str, str] | None, float]] = field(default_factory=list)

    def which(self, name: str) -> str | None:
        return f"/usr/bin/{name}" if name in self.installed else None

    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> hc.Completed:
        self.calls.append((list(argv), env, timeout))
        for length in range(len(argv), 0, -1):
            answer = self.answers.get(tuple(argv[:length]))
            if answer is not None:
                self._report(argv, env, answer)
                return answer
        answer = hc.Completed(0, "", 0.5)
        self._report(argv, env, answer)
        return answer

    def _report(self, argv: Sequence[str], env: Mapping[str, str] | None, done: hc.Completed) -> None:
        """The probe's diagnostic, as DCGM's would: its report and exit status in the results
        folder (mounted with -v, or named by GPUHEALTH_RESULTS on the host), Pass when it exited 0."""
        folder = (env or {}).get("GPUHEALTH_RESULTS", "")
        if "-v" in argv:
            folder = argv[list(argv).index("-v") + 1].split(":", 1)[0]
        if not folder or done.exit_code is None:
            return
        status = "Pass" if done.exit_code == 0 else "Fail"
        Path(folder, REPORT_FILE).write_text(v4_report({"memory": [v4_result(status)]}))
        Path(folder, EXIT_FILE).write_text(str(0 if done.exit_code == 0 else 226))

    def argv(self, first: str) -> list[list[str]]:
        """Every command run whose words include `first` (e.g. an image name)."""
        return [argv for argv, _, _ in self.calls if first in argv]


def docker_ready() -> FakeRunner:
    return FakeRunner(
        answers={
            ("nvidia-smi",): hc.Completed(0, NVIDIA_SMI, 0.08),
            ("docker", "info"): hc.Completed(0, RUNTIMES, 0.1),
        }
    )


class Clock:
    """Each call is 2 ms after the previous one; sleeps move it on."""

    def __init__(self) -> None:
        self.t = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        self.t += 0.002
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


@dataclass
class Run:
    code: int
    out: str
    err: str


def run(
    argv: Sequence[str],
    *,
    nvml: FakeNvml | None = None,
    runner: FakeRunner | None = None,
    clock: Clock | None = None,
) -> Run:
    out, err = io.StringIO(), io.StringIO()
    clock = clock or Clock()
    source = nvml or FakeNvml([[reading(GPU_A, 0)]])
    code = hc.main(
        list(argv),
        runner=runner or docker_ready(),
        nvml=lambda: source,
        out=out,
        err=err,
        clock=clock,
        sleep=clock.sleep,
        now=lambda: datetime.datetime(2026, 12, 6, 9, 30, tzinfo=datetime.UTC),
        host="gpu-node-1",
    )
    return Run(code, out.getvalue(), err.getvalue())


def lines_of(text: str, head: str) -> list[str]:
    """The lines of the step whose first line starts with `head`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(head))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")), len(lines))
    return lines[start:end]


# ----- as a script ---------------------------------------------------------------------------


def test_it_runs_as_a_script_with_the_project_installed() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "hardware_check.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--on-host" in done.stdout and "--record" in done.stdout and "--json" in done.stdout


# ----- NVML ----------------------------------------------------------------------------------


def test_the_nvml_steps_print_each_gpu_its_readings_the_xid_window_and_timings() -> None:
    mig = (MigDevice("MIG-aaaa", 1, 0, "1g.10gb"), MigDevice("MIG-bbbb", 2, 0, "1g.10gb"))
    first = [reading(GPU_A, 0), reading(GPU_B, 1, mig_devices=mig, ecc_corrected_volatile=3)]
    second = [reading(GPU_A, 0), reading(GPU_B, 1, mig_devices=mig, ecc_corrected_volatile=5)]
    nvml = FakeNvml([first, second], events=[XidEvent(GPU_B, 79, 1.0)])
    clock = Clock()
    result = run(["--listen", "7s", "--check", "canary"], nvml=nvml, clock=clock)

    assert lines_of(result.out, "[PASS] nvml.start")[0] == "[PASS] nvml.start  (2.0 ms): 2 GPU(s)"
    read = lines_of(result.out, "[PASS] nvml.read")
    assert read[0] == "[PASS] nvml.read  (2.0 ms)"
    assert f"    {GPU_A} (index 0): NVIDIA H100 80GB HBM3" in read
    assert "      ECC volatile: corrected 3, uncorrected 0" in read
    assert "      remapped rows: correctable 0, uncorrectable 0, pending no, failure no" in read
    assert "      MIG devices: 2" in read
    assert "        MIG-aaaa (GI 1, CI 0, 1g.10gb)" in read
    xid = lines_of(result.out, "[PASS] nvml.xid")
    assert xid[0].endswith(": 1 XID event(s) in 7s")
    assert f"    XID 79 on {GPU_B}" in xid
    assert "    drain: 2.0 ms; read again: 2.0 ms" in xid
    assert f"    {GPU_B}: ecc_corrected_volatile 3 -> 5" in xid
    assert clock.slept == [7.0]
    assert nvml.calls == ["start", "read", "drain", "read"]
    assert nvml.closed
    assert result.code == 0


def test_an_unreachable_gpu_fails_the_read_and_the_run() -> None:
    lost = DeviceReading(uuid=GPU_B, index=1, reachable=False, error="GPU is lost")
    result = run(["--listen", "0", "--gpu", GPU_A], nvml=FakeNvml([[reading(GPU_A, 0), lost]]))
    read = lines_of(result.out, "[FAIL] nvml.read")
    assert read[0].endswith(f": unreachable: {GPU_B}")
    assert f"    {GPU_B} (index 1): unreachable: GPU is lost" in read
    assert "[SKIPPED] nvml.xid: --listen 0" in result.out
    assert result.code == 1


def test_without_pynvml_or_a_driver_nvml_is_skipped_with_the_reason() -> None:
    def missing() -> hc.NvmlSource:
        raise ImportError("No module named 'pynvml'")

    out, err = io.StringIO(), io.StringIO()
    code = hc.main(["--listen", "0"], runner=FakeRunner(installed={"docker"}), nvml=missing, out=out, err=err)
    assert (
        "[SKIPPED] nvml.start: pynvml not importable (No module named 'pynvml'): pip install nvidia-ml-py"
        in (out.getvalue())
    )
    # No GPU known, so the checks cannot run either; nothing ran, nothing failed.
    assert (
        "[SKIPPED] probe: no GPU to run it on: NVML found none (name one with --gpu UUID)" in out.getvalue()
    )
    assert out.getvalue().rstrip().endswith("0 failed, 4 skipped: nothing was checked")
    assert code == 0

    no_driver = run(["--listen", "0"], nvml=FakeNvml([[]], starts=False))
    assert (
        "[SKIPPED] nvml.start  (2.0 ms): NVML did not start: no NVIDIA driver or libnvidia-ml here"
        in no_driver.out
    )


# ----- the checks, as the responder ships them -----------------------------------------------


def test_docker_runs_the_probe_and_canary_the_responder_builds_for_that_card() -> None:
    runner = docker_ready()
    result = run(["--listen", "0"], runner=runner)
    for spec in (PROBE, CANARY):
        (argv,) = [a for a in runner.argv(spec.image) if a[:2] == ["docker", "run"]]
        # What the responder's check pod runs on the card: for the probe its diagnostic (an init
        # container running DCGM's script), for the canary the CUDA sample.
        container = hc.check_container(hc.CheckSettings(), spec.name, "node", GPU_A, ())
        image_at = argv.index(spec.image)
        assert argv[image_at + 1 :] == [*container.entrypoint[1:], *container.args]
        assert argv[argv.index("--entrypoint") + 1] == container.entrypoint[0]
        assert argv[argv.index("--runtime") + 1] == "nvidia"  # the checks' RuntimeClass
        env = [argv[i + 1] for i, word in enumerate(argv[:image_at]) if word == "-e"]
        assert (
            f"NVIDIA_VISIBLE_DEVICES={GPU_A}" in env and "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env
        )
        step = lines_of(result.out, f"[PASS] {spec.name} {GPU_A}")
        assert step[0] == f"[PASS] {spec.name} {GPU_A}  (exit 0, 500.0 ms)"
        assert step[1].startswith("    $ docker run --rm --name ")  # the command as run (first line)
    # The probe's diagnostic wrote its report into a mounted folder, judged as its pod's judge does.
    (probe,) = [a for a in runner.argv(PROBE.image) if a[:2] == ["docker", "run"]]
    assert probe[probe.index("-v") + 1].endswith(":/results")
    assert "judged from DCGM's report: passed" in result.out
    assert result.out.rstrip().endswith("6 passed, 0 failed, 1 skipped")  # nvml.xid: --listen 0
    assert result.code == 0


def test_a_mig_card_is_given_as_all_its_partitions_either_way_docker_gives_a_gpu() -> None:
    mig = (MigDevice("MIG-aaaa", 1, 0, "3g.40gb"), MigDevice("MIG-bbbb", 2, 0, "3g.40gb"))
    nvml = FakeNvml([[reading(GPU_A, 0, mig_devices=mig)]])
    runner = docker_ready()
    run(["--listen", "0", "--check", "probe"], nvml=nvml, runner=runner)
    (argv,) = [a for a in runner.argv(PROBE.image) if a[:2] == ["docker", "run"]]
    assert "NVIDIA_VISIBLE_DEVICES=MIG-aaaa,MIG-bbbb" in argv

    runner = docker_ready()
    run(["--listen", "0", "--check", "probe", "--docker-gpus", "gpus"], nvml=nvml, runner=runner)
    (argv,) = [a for a in runner.argv(PROBE.image) if a[:2] == ["docker", "run"]]
    assert argv[argv.index("--gpus") + 1] == '"device=MIG-aaaa,MIG-bbbb"'  # one CSV field
    assert "--runtime" not in argv
    assert not [word for word in argv if word.startswith("NVIDIA_VISIBLE_DEVICES=")]


def test_the_checks_come_from_the_responder_config_file_when_one_is_given(tmp_path: Path) -> None:
    config = tmp_path / "responder.yaml"
    config.write_text(
        "checks:\n"
        "  probe_image: registry.local/dcgm:4\n"
        "  probe_level: 1\n"
        "  runtime_class: nvidia-cdi\n"
        "policy:\n"
        "  probe_timeout: 3m\n"
    )
    runner = FakeRunner(
        answers={
            ("nvidia-smi",): hc.Completed(0, NVIDIA_SMI, 0.08),
            ("docker", "info"): hc.Completed(0, 'v27 {"nvidia-cdi":{},"runc":{}}', 0.1),
        }
    )
    run(["--listen", "0", "--check", "probe", "--config", str(config)], runner=runner)
    (argv,) = [a for a in runner.argv("registry.local/dcgm:4") if a[:2] == ["docker", "run"]]
    # The probe's diagnostic at the configured level, in the configured image and runtime.
    assert "GPUHEALTH_DIAG_LEVEL=1" in argv
    assert argv[argv.index("--entrypoint") + 1].endswith("sh")
    assert argv[argv.index("--runtime") + 1] == "nvidia-cdi"
    (timeout,) = [t for a, _, t in runner.calls if a[:2] == ["docker", "run"]]
    assert timeout == 180.0


def test_a_failed_check_prints_its_exit_code_and_output_tail_and_fails_the_run() -> None:
    runner = docker_ready()
    output = "".join(f"line {n}\n" for n in range(1, 31)) + "Test FAILED\n"
    runner.answers[("docker", "run", "--rm", "--name", hc._container_name("canary", GPU_A))] = hc.Completed(
        2, output, 3.25
    )
    result = run(["--listen", "0", "--tail", "3"], runner=runner)
    step = lines_of(result.out, f"[FAIL] canary {GPU_A}")
    assert step[0] == f"[FAIL] canary {GPU_A}  (exit 2, 3.2 s): exit 2"
    assert step[-3:] == ["    | line 29", "    | line 30", "    | Test FAILED"]
    assert f"[PASS] probe {GPU_A}" in result.out
    assert result.out.rstrip().endswith("5 passed, 1 failed, 1 skipped")
    assert result.code == 1


def test_a_check_that_times_out_fails_and_its_container_is_removed() -> None:
    runner = docker_ready()
    name = hc._container_name("probe", GPU_A)
    runner.answers[("docker", "run", "--rm", "--name", name)] = hc.Completed(
        None, "running\n", 60.0, "timed out after 1m"
    )
    result = run(["--listen", "0", "--check", "probe", "--timeout", "1m"], runner=runner)
    assert (
        lines_of(result.out, f"[FAIL] probe {GPU_A}")[0]
        == f"[FAIL] probe {GPU_A}  (60.0 s): timed out after 1m"
    )
    assert ["docker", "rm", "--force", name] in [argv for argv, _, _ in runner.calls]
    assert result.code == 1


def test_what_cannot_run_is_skipped_with_its_reason() -> None:
    no_docker = FakeRunner(
        answers={("nvidia-smi",): hc.Completed(0, NVIDIA_SMI, 0.1)}, installed={"nvidia-smi"}
    )
    result = run(["--listen", "0"], runner=no_docker)
    assert (
        "[SKIPPED] docker: docker not found on PATH (install it with the NVIDIA container toolkit"
        in result.out
    )
    assert f"[SKIPPED] probe {GPU_A}: docker not found on PATH" in result.out
    assert result.code == 0

    no_runtime = docker_ready()
    no_runtime.answers[("docker", "info")] = hc.Completed(0, 'v27 {"runc":{}}', 0.1)
    result = run(["--listen", "0"], runner=no_runtime)
    assert f"[SKIPPED] probe {GPU_A}: docker has no runtime nvidia (the checks' RuntimeClass): " in result.out
    assert "nvidia-ctk runtime configure --runtime=docker, or --docker-gpus gpus" in result.out

    no_image = docker_ready()
    no_image.answers[("docker", "image", "inspect")] = hc.Completed(1, "Error: No such image", 0.1)
    result = run(["--listen", "0", "--check", "canary"], runner=no_image)
    reason = f"image {CANARY.image} is not present locally: docker pull {CANARY.image}, or pass --pull"
    assert f"[SKIPPED] canary {GPU_A}: {reason}" in result.out
    assert not no_image.argv("pull")

    result = run(["--listen", "0", "--check", "canary", "--pull"], runner=no_image)
    assert f"[PASS] pull  (exit 0, 500.0 ms): {CANARY.image}" in result.out
    assert f"[PASS] canary {GPU_A}" in result.out

    no_smi = docker_ready()
    no_smi.installed = {"docker"}
    assert "[SKIPPED] nvidia-smi: nvidia-smi not found on PATH" in run(["--listen", "0"], runner=no_smi).out


def test_on_the_host_the_commands_run_directly_on_that_card_or_are_skipped_where_missing() -> None:
    runner = docker_ready()
    runner.installed = {"nvidia-smi", PROBE.command[0]}
    result = run(["--listen", "0", "--on-host"], runner=runner)
    ((argv, env, _),) = [c for c in runner.calls if c[0][0] == PROBE.command[0]]
    assert argv == list(PROBE.command)
    assert env is not None and env["CUDA_VISIBLE_DEVICES"] == GPU_A and env["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert f"[PASS] probe {GPU_A}" in result.out
    assert f"[SKIPPED] canary {GPU_A}: {CANARY.command[0]} not found on this host" in result.out
    assert not runner.argv("docker")


# ----- the record ----------------------------------------------------------------------------


def test_json_carries_every_step_with_command_exit_code_and_timing() -> None:
    runner = docker_ready()
    result = run(["--listen", "0", "--json"], runner=runner)
    doc = json.loads(result.out)
    assert doc["driver_version"] == "570.86.15" and doc["cuda_version"] == "12.8"
    assert doc["date"] == "2026-12-06" and doc["host"] == "gpu-node-1"
    assert [g["uuid"] for g in doc["gpus"]] == [GPU_A]
    probe = next(s for s in doc["steps"] if s["name"] == "probe")
    assert probe["status"] == "PASS" and probe["exit_code"] == 0 and probe["seconds"] == 0.5
    assert probe["command"][:2] == ["docker", "run"] and probe["gpu"] == GPU_A
    assert doc["summary"] == {"PASS": 6, "SKIPPED": 1} and doc["exit_code"] == 0


def test_record_prints_a_markdown_block_to_paste_into_the_docs() -> None:
    runner = docker_ready()
    runner.answers[("docker", "run", "--rm", "--name", hc._container_name("probe", GPU_A))] = hc.Completed(
        1, "diag failed\n", 118.4
    )
    result = run(["--listen", "0", "--record"], runner=runner)
    lines = result.out.splitlines()
    assert lines[0] == "### 2026-12-06: 1x NVIDIA H100 80GB HBM3"
    assert lines[2].startswith("- Host `gpu-node-1`; driver 570.86.15, CUDA 12.8; gpuhealth ")
    assert lines[3] == "- Result: failed (5 passed, 1 failed, 1 skipped)."
    assert "| nvml.read |  | PASS | 2.0 ms |  |" in lines
    assert f"| probe | {GPU_A} | FAIL | 118.4 s | exit 1 |" in lines
    assert f"| canary | {GPU_A} | PASS | 500.0 ms |  |" in lines
    assert result.code == 1


# ----- usage ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--check", "smoke"], "--check smoke: the responder has no such check (it has probe, canary)"),
        (["--gpu", "GPU-nope"], f"--gpu GPU-nope: NVML found no such GPU (it found {GPU_A})"),
        (["--listen", "soon"], "argument --listen"),
        (["--json", "--record"], "not allowed with argument"),
        (["--config", "/nonexistent/responder.yaml"], "--config /nonexistent/responder.yaml"),
    ],
)
def test_bad_usage_exits_2_with_one_error_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run(["--listen", "0", *argv] if "--listen" not in argv else argv)
    assert result.code == 2
    assert message in result.err + capsys.readouterr().err
