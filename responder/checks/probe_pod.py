"""The probe's pod: DCGM's diagnostic with a hostengine to talk to, and a judge of its report.

`dcgmi` is only a client of `nv-hostengine` (port 5555): run alone as a container's command in
the DCGM image it finds no hostengine and fails, so a probe built that way fails on every real
node and never releases a card. The pod therefore has two parts:

- an init container `diag` in the DCGM image, running `DIAG_SCRIPT` (POSIX sh): it starts its
  own `nv-hostengine` (`hostengine: embedded`; the daemon lives as long as the container) or
  uses the one configured (`host:port`, the GPU operator's `nvidia-dcgm` Service: never a
  second hostengine beside it), waits until `dcgmi discovery -l` answers (bounded), runs
  `dcgmi diag -r LEVEL -j` on the quarantined card (`-i <uuid>` where the record knows it) and
  writes the report, its exit status and a log into an emptyDir. It exits 0 whenever it could
  write there: the verdict is the judge's, which sees every way the diagnostic went wrong;
- the container `probe` in gpuhealth's own image, running `python -m
  responder.checks.diag_verdict /results`: the verdict (`responder.checks.diag`), one line in
  the pod's log, exit 0 or 1, so the Job's status is the probe's result as for any check.

The device request (the claim, or `NVIDIA_VISIBLE_DEVICES`) goes on the diagnostic's container,
the one that uses the card; the judge needs none. Pure: builds dicts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpuhealth import fields, yaml_keys
from gpuhealth.fields import SettingsError
from responder.checks.diag import EXIT_FILE, LOG_FILE, REPORT_FILE

EMBEDDED = "embedded"
"""`hostengine` value: the diagnostic's container starts its own `nv-hostengine`."""
JUDGE_IMAGE = "ghcr.io/gpuhealth/gpuhealth:0.1.0"
"""The shipped gpuhealth image (deploy/base/kustomization.yaml `images:`); an overlay that pins
another must set `checks.judge_image` to it too (kustomize rewrites manifests, not this)."""
RESULTS = "/results"
"""Where both containers mount the pod's emptyDir."""
RESULTS_VOLUME = "results"
DIAG_CONTAINER = "diag"

_HOST_PORT = re.compile(
    r"(?P<host>[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})"
)

# The diagnostic container's program. POSIX sh (the DCGM image's /bin/sh is dash); every
# value comes from the environment, so the text is a constant and nothing is interpolated.
# `nv-hostengine` forks into the background and returns; the daemon goes with the container.
DIAG_SCRIPT = f"""\
out="$GPUHEALTH_RESULTS"
log="$out/{LOG_FILE}"
say() {{ echo "$*" >>"$log"; echo "$*" >&2; }}
fail() {{ say "$*"; echo 1 >"$out/{EXIT_FILE}"; exit 0; }}
: >"$log" || exit 1
if [ "$GPUHEALTH_DIAG_HOSTENGINE" = {EMBEDDED} ]; then
  say "starting nv-hostengine"
  nv-hostengine >>"$log" 2>&1 || fail "nv-hostengine did not start (exit $?)"
  set -- --host localhost
else
  set -- --host "$GPUHEALTH_DIAG_HOSTENGINE"
fi
waited=0
until dcgmi discovery "$@" -l >/dev/null 2>>"$log"; do
  if [ "$waited" -ge "$GPUHEALTH_DIAG_WAIT_SECONDS" ]; then
    fail "no hostengine answered at $2 within $GPUHEALTH_DIAG_WAIT_SECONDS s"
  fi
  sleep 1
  waited=$((waited + 1))
done
if [ -n "$GPUHEALTH_DIAG_GPU" ]; then set -- "$@" -i "$GPUHEALTH_DIAG_GPU"; fi
say "hostengine at $2 answered after $waited s; dcgmi diag $* -r $GPUHEALTH_DIAG_LEVEL -j"
dcgmi diag "$@" -r "$GPUHEALTH_DIAG_LEVEL" -j >"$out/{REPORT_FILE}" 2>>"$log"
echo $? >"$out/{EXIT_FILE}"
"""
DIAG_COMMAND = ("/bin/sh", "-c", DIAG_SCRIPT, "gpuhealth-diag")
"""The diagnostic container's argv (`gpuhealth-diag` is the script's $0 in its messages)."""


def _level(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4:
        raise yaml_keys.Invalid(f"{value!r} must be a dcgmi diag level, 1 to 4")
    return value


def _hostengine(value: Any) -> str:
    try:
        return DiagSettings(hostengine=value).hostengine
    except (SettingsError, TypeError, AttributeError):
        raise yaml_keys.Invalid(
            f"{value!r} must be {EMBEDDED!r} or host:port (e.g. nvidia-dcgm.gpu-operator.svc:5555)"
        ) from None


@dataclass(frozen=True, slots=True)
class DiagSettings:
    """How the probe runs DCGM's diagnostic and who judges it."""

    level: int = field(default=2, metadata=yaml_keys.key("checks.probe_level", _level))
    """`dcgmi diag -r`: 2 (about two minutes: software, PCIe, memory, a short stress) catches
    what quarantines; 3 and 4 take 30 minutes to hours, longer than a check should hold a card."""
    hostengine: str = field(default=EMBEDDED, metadata=yaml_keys.key("checks.probe_hostengine", _hostengine))
    """`embedded`: the pod starts its own nv-hostengine (a stock node, or dcgm-exporter with its
    embedded engine). `host:port`: use that hostengine and start none, e.g. the GPU operator's
    standalone DCGM, `nvidia-dcgm.gpu-operator.svc:5555` (node-local traffic): DCGM discourages
    two hostengines on one node."""
    wait_seconds: float = field(default=60.0, metadata=yaml_keys.key("checks.probe_wait", yaml_keys.duration))
    """How long the diagnostic's container waits for the hostengine to answer before it gives up
    (the probe fails). nv-hostengine answers within seconds of its start."""
    judge_image: str = field(
        default=JUDGE_IMAGE, metadata=yaml_keys.key("checks.judge_image", yaml_keys.text)
    )
    """The image of the container that judges the report: gpuhealth's own (`diag_verdict`)."""

    def __post_init__(self) -> None:
        fields.within(self, "level", "(dcgmi diag -r)", 1, 4, whole=True)
        fields.within(self, "wait_seconds", "seconds", 1, 600)
        if self.hostengine != EMBEDDED and not _HOST_PORT.fullmatch(self.hostengine):
            raise SettingsError(
                f"DiagSettings.hostengine must be {EMBEDDED!r} or host:port (e.g. "
                f"nvidia-dcgm.gpu-operator.svc:5555), got {self.hostengine!r}"
            )
        if _HOST_PORT.fullmatch(self.hostengine) and not 0 < int(self.hostengine.rsplit(":", 1)[1]) < 65536:
            raise SettingsError(f"DiagSettings.hostengine: port out of range in {self.hostengine!r}")
        if not self.judge_image.strip():
            raise SettingsError("DiagSettings.judge_image must not be empty")


def diag_pod(
    image: str,
    command: tuple[str, ...],
    judge_name: str,
    diag: DiagSettings,
    gpu: str,
    request: dict[str, Any],
) -> dict[str, Any]:
    """The probe pod's spec (before the device request's pod fields): the diagnostic's init
    container in `image` (with `request`'s container fields), the judge container named
    `judge_name`, their emptyDir. `gpu`: the card's uuid for `dcgmi diag -i` (empty: none)."""
    mount = {"name": RESULTS_VOLUME, "mountPath": RESULTS}
    env = [
        {"name": "GPUHEALTH_RESULTS", "value": RESULTS},
        {"name": "GPUHEALTH_DIAG_LEVEL", "value": str(diag.level)},
        {"name": "GPUHEALTH_DIAG_HOSTENGINE", "value": diag.hostengine},
        {"name": "GPUHEALTH_DIAG_WAIT_SECONDS", "value": str(round(diag.wait_seconds))},
        {"name": "GPUHEALTH_DIAG_GPU", "value": gpu},
    ]
    run: dict[str, Any] = {"name": DIAG_CONTAINER, "image": image, "command": list(command)}
    run.update(request)
    run["env"] = [*env, *(request.get("env") or ())]
    run["volumeMounts"] = [*(request.get("volumeMounts") or ()), mount]
    judge = {
        "name": judge_name,
        "image": diag.judge_image,
        "command": ["python", "-m", "responder.checks.diag_verdict", RESULTS],
        "volumeMounts": [{**mount, "readOnly": True}],
    }
    if request.get("resources"):
        # The device plugin's GPU, or the DRA claim, on the judge too: the kubelet reports
        # devices for app containers only (`allocatedResourcesStatus`; the API server refuses
        # one naming a resource or claim that container does not ask for), and hands an app
        # container what its init containers had, so the judge gets the diagnostic's card back
        # and says which card the probe reached.
        judge["resources"] = request["resources"]
    return {
        "restartPolicy": "Never",
        "initContainers": [run],
        "containers": [judge],
        "volumes": [{"name": RESULTS_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}],
    }
