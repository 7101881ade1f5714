"""Containers the simulated node runs as real processes: DCGM's image and gpuhealth's own.

Most simulated containers are modelled (`pod_runner`: a `sleep`, a scripted exit code, the
CUDA sample's verdict). Two images are run for real, because what they decide is the product's
own code or a script the product wrote, and a model of either would be a shortcut that passes
what the real image would fail:

- DCGM's image (`nvcr.io/nvidia/cloud-native/dcgm`): its argv runs under this machine's POSIX
  sh, with DCGM's programs replaced by stand-ins (written here, on PATH first): `nv-hostengine`
  makes a hostengine answer on localhost inside that container, two (virtual) seconds after its
  start; `dcgmi` talks to a hostengine only where one answers (nothing answers at another
  `--host`: the GPU operator's `nvidia-dcgm` is not modelled), fails as dcgmi does without one
  (exit 255, no report), and with one runs the diagnostic on the GPUs the container reached,
  printing a report of DCGM 4.x's JSON shape (`-j`), Fail for a GPU the pod runner found failing;
  `sleep` moves the container's virtual clock instead of waiting (the run's simulated length is
  the pod runner's, `DIAG_SECONDS`).
- gpuhealth's image: `python ...` runs with this interpreter and this checkout (the judge of the
  probe's report: `python -m responder.checks.diag_verdict DIR`).

There is no mount namespace: a container's volume mounts are folders here, and its env values
and arguments that name a mount path are rewritten to them. A run is bounded (`TIMEOUT_SECONDS`).
The programs of DCGM's image in any other image are missing (`missing_program`): the runtime
cannot start such a container.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DCGM_REPOSITORIES = ("nvcr.io/nvidia/cloud-native/dcgm", "nvidia/dcgm", "docker.io/nvidia/dcgm")
GPUHEALTH_REPOSITORY = "gpuhealth"
"""The last path element of gpuhealth's image (`ghcr.io/gpuhealth/gpuhealth`, a local `gpuhealth`)."""
DCGM_PROGRAMS = ("dcgmi", "nv-hostengine")
DIAG_SECONDS = 10.0
"""Simulated seconds a container of DCGM's image runs (the diagnostic) unless the pod's
run-seconds annotation says otherwise."""
JUDGE_SECONDS = 1.0
"""Simulated seconds a container of gpuhealth's image runs (reading a file, a verdict)."""
HOSTENGINE_START_SECONDS = 2
"""Virtual seconds from `nv-hostengine`'s start until it answers."""
TIMEOUT_SECONDS = 30.0
"""Real seconds a container's process may take before it is killed (exit 137)."""
NO_HOST_EXIT = 255
DIAG_ERROR_EXIT = 226
"""dcgmi's exit status for a diagnostic that reported an error (DCGM_ST_NVVS_ERROR, -30)."""


def repository(image: str) -> str:
    """The image reference without its digest or tag."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def image_kind(image: str) -> str | None:
    """`dcgm`, `gpuhealth`, or None for an image whose containers are modelled."""
    repo = repository(image)
    if repo in DCGM_REPOSITORIES:
        return "dcgm"
    if repo.rsplit("/", 1)[-1] == GPUHEALTH_REPOSITORY:
        return "gpuhealth"
    return None


def argv(container: Mapping[str, Any]) -> list[str]:
    return [str(w) for w in (*(container.get("command") or ()), *(container.get("args") or ()))]


def executed(container: Mapping[str, Any]) -> bool:
    """Whether the container runs as a real process (an image of ours, an explicit command)."""
    return image_kind(str(container.get("image") or "")) is not None and bool(container.get("command"))


def missing_program(container: Mapping[str, Any]) -> bool:
    """The container runs a DCGM program its image does not have: the runtime cannot start it."""
    words = argv(container)
    if not words or image_kind(str(container.get("image") or "")) == "dcgm":
        return False
    return os.path.basename(words[0]) in DCGM_PROGRAMS


def usual_seconds(container: Mapping[str, Any]) -> float | None:
    """How long an executed container runs in simulated time; None for a modelled one."""
    if not executed(container):
        return None
    return DIAG_SECONDS if image_kind(str(container.get("image") or "")) == "dcgm" else JUDGE_SECONDS


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU a container reached, as DCGM's diagnostic would find it."""

    uuid: str
    failure: str | None = None
    """Why the diagnostic fails on it (DCGM's words for the test that fails), None: it passes."""


class Sandbox:
    """One pod's folders: its emptyDir volumes, and a state folder per container run."""

    def __init__(self, pod_spec: Mapping[str, Any]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gpuhealth-sim-pod-"))
        self._volumes: dict[str, Path] = {}
        for volume in pod_spec.get("volumes") or ():
            name = str(volume.get("name") or "")
            path = self.root / "volumes" / name
            path.mkdir(parents=True, exist_ok=True)
            self._volumes[name] = path
        self._runs = 0

    def run(self, container: Mapping[str, Any], gpus: tuple[Gpu, ...]) -> int:
        """Run the container's argv for real; its exit status (137 past `TIMEOUT_SECONDS`)."""
        self._runs += 1
        state = self.root / f"run-{self._runs}-{container.get('name', '')}"
        state.mkdir()
        (state / "gpus.json").write_text(json.dumps([{"uuid": g.uuid, "failure": g.failure} for g in gpus]))
        mounts = {
            str(m.get("mountPath")): self._volumes.get(str(m.get("name")), state)
            for m in container.get("volumeMounts") or ()
        }
        words = [_translate(w, mounts) for w in argv(container)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GPUHEALTH_SIM_CONTAINER": str(state)}
        for var in container.get("env") or ():
            if isinstance(var, Mapping) and "value" in var:
                env[str(var["name"])] = _translate(str(var.get("value") or ""), mounts)
        kind = image_kind(str(container.get("image") or ""))
        if kind == "dcgm":
            env["PATH"] = f"{_stubs()}{os.pathsep}{env['PATH']}"
            program = os.path.basename(words[0])
            if program in ("sh", "bash", "dash"):
                words[0] = shutil.which("sh") or "/bin/sh"
            elif program in (*DCGM_PROGRAMS, "sleep"):
                words[0] = str(_stubs() / program)
        elif kind == "gpuhealth":
            if os.path.basename(words[0]) in ("python", "python3"):
                words[0] = sys.executable
            env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
        try:
            done = subprocess.run(words, env=env, cwd=state, capture_output=True, timeout=TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            return 137
        except OSError:
            return 127  # not found or not executable, as a shell reports it
        (state / "stdout").write_bytes(done.stdout)
        (state / "stderr").write_bytes(done.stderr)
        return done.returncode

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _translate(value: str, mounts: Mapping[str, Path]) -> str:
    for path, host in sorted(mounts.items(), key=lambda m: -len(m[0])):
        if value == path or value.startswith(path.rstrip("/") + "/"):
            return str(host) + value[len(path.rstrip("/")) :]
    return value


# ----------------------------------------------------------------------------- the stand-ins

_SLEEP = """#!/bin/sh
clock="$GPUHEALTH_SIM_CONTAINER/clock"
now=$(cat "$clock" 2>/dev/null || echo 0)
echo $((now + ${1%%.*})) >"$clock"
"""
_HOSTENGINE = f"""#!/bin/sh
clock="$GPUHEALTH_SIM_CONTAINER/clock"
now=$(cat "$clock" 2>/dev/null || echo 0)
echo $((now + {HOSTENGINE_START_SECONDS})) >"$GPUHEALTH_SIM_CONTAINER/hostengine"
echo "Started host engine version 4.2.3 using port number: 5555"
"""

_DCGMI = Path(__file__).with_name("dcgmi_standin.py")
"""The stand-in of `dcgmi`, run as a script (it imports nothing of the simulator)."""
_STUBS: Path | None = None


def _stubs() -> Path:
    """The stand-ins' folder, written once per process."""
    global _STUBS
    if _STUBS is None:
        path = Path(tempfile.mkdtemp(prefix="gpuhealth-sim-dcgm-"))
        atexit.register(shutil.rmtree, path, True)
        for name, text in (
            ("sleep", _SLEEP),
            ("nv-hostengine", _HOSTENGINE),
            ("dcgmi", f'#!/bin/sh\nexec "{sys.executable}" -S "{_DCGMI}" "$@"\n'),
        ):
            (path / name).write_text(text)
            (path / name).chmod(0o755)
        _STUBS = path
    return _STUBS
