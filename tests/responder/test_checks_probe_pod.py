"""The probe's pod (responder.checks.probe_pod): a hostengine, the diagnostic, a judge.

Aspects: the probe's Job runs the diagnostic as an init container in the DCGM image, with the
device request (and only it) reaching the card, its settings in the environment and the card's
uuid for `dcgmi diag -i`; the judge container runs gpuhealth's image on the shared emptyDir;
the diagnostic's script, run by a real POSIX sh with stand-ins for `nv-hostengine` and `dcgmi`:
starts a hostengine and waits for it before the diagnostic, writes the report and exit status;
gives up after the wait when no hostengine answers (no report: the judge fails it); with a
configured `host:port` starts no hostengine and talks to that one; the settings refuse a level,
wait or hostengine they cannot use.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.fields import SettingsError
from responder.checks.diag import EXIT_FILE, LOG_FILE, REPORT_FILE, judge
from responder.checks.jobs import JOB, PROBE, CheckSettings
from responder.checks.probe_pod import DIAG_COMMAND, JUDGE_IMAGE, RESULTS, DiagSettings
from tests.responder.test_checks import DRA_LABELS, Client, record
from tests.support.backends import job_checks

SH = shutil.which("sh")


def probe_spec(settings: CheckSettings | None = None, **labels: Any) -> dict[str, Any]:
    client = Client()
    r = record(**labels)
    job_checks(client, settings).start(r, "probe", 1)
    spec: dict[str, Any] = client.objects[(JOB.plural, f"{r.name}-probe-1")]["spec"]["template"]["spec"]
    return spec


def test_the_probe_pod_runs_the_diagnostic_first_and_the_judge_after_it() -> None:
    spec = probe_spec(CheckSettings(device_plugin_route="visible-devices"), uuid="GPU-4a1c")
    (diag,) = spec["initContainers"]
    (judge_c,) = spec["containers"]
    assert (diag["image"], tuple(diag["command"])) == (PROBE.image, DIAG_COMMAND)
    env = {e["name"]: e["value"] for e in diag["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-4a1c"  # the device request is the diagnostic's
    assert {k: v for k, v in env.items() if k.startswith("GPUHEALTH_")} == {
        "GPUHEALTH_RESULTS": RESULTS,
        "GPUHEALTH_DIAG_LEVEL": "2",
        "GPUHEALTH_DIAG_HOSTENGINE": "embedded",
        "GPUHEALTH_DIAG_WAIT_SECONDS": "60",
        "GPUHEALTH_DIAG_GPU": "GPU-4a1c",
    }
    assert judge_c["name"] == "probe" and judge_c["image"] == JUDGE_IMAGE
    assert judge_c["command"] == ["python", "-m", "responder.checks.diag_verdict", RESULTS]
    assert "env" not in judge_c and "resources" not in judge_c  # the judge needs no GPU
    assert diag["volumeMounts"] == [{"name": "results", "mountPath": RESULTS}]
    assert judge_c["volumeMounts"] == [{"name": "results", "mountPath": RESULTS, "readOnly": True}]
    assert spec["volumes"] == [{"name": "results", "emptyDir": {"sizeLimit": "16Mi"}}]
    assert spec["restartPolicy"] == "Never"


def test_a_dra_probe_claims_the_card_in_the_diagnostic_and_names_its_uuid() -> None:
    spec = probe_spec(**DRA_LABELS)
    (diag,) = spec["initContainers"]
    assert diag["resources"]["claims"]
    assert {e["name"]: e["value"] for e in diag["env"]}["GPUHEALTH_DIAG_GPU"] == "GPU-dra-3"
    # The judge names the same claim: the kubelet reports the card for app containers only.
    assert spec["containers"][0]["resources"] == diag["resources"]


def test_the_diagnostic_settings_reach_the_pod() -> None:
    diag = DiagSettings(level=3, hostengine="nvidia-dcgm.gpu-operator.svc:5555", wait_seconds=90,
                        judge_image="registry.local/gpuhealth:1")  # fmt: skip
    spec = probe_spec(CheckSettings(probe=replace(PROBE, diag=diag)), uuid="GPU-4a1c")
    env = {e["name"]: e["value"] for e in spec["initContainers"][0]["env"]}
    names = ("GPUHEALTH_DIAG_LEVEL", "GPUHEALTH_DIAG_HOSTENGINE", "GPUHEALTH_DIAG_WAIT_SECONDS")
    assert [env[n] for n in names] == ["3", "nvidia-dcgm.gpu-operator.svc:5555", "90"]
    assert spec["containers"][0]["image"] == "registry.local/gpuhealth:1"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"level": 0}, "DiagSettings.level must be 1-4"),
        ({"wait_seconds": 0}, "DiagSettings.wait_seconds must be 1-600 seconds"),
        ({"hostengine": "localhost"}, "must be 'embedded' or host:port"),
        ({"hostengine": "a b:5555"}, "must be 'embedded' or host:port"),
        ({"hostengine": "x:0"}, "port out of range"),
        ({"judge_image": " "}, "judge_image must not be empty"),
    ],
)
def test_settings_the_diagnostic_cannot_use_are_refused(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        DiagSettings(**kw)


# ----------------------------------------------------------------------------- the script

REPORT = '{"DCGM Diagnostic": {"test_categories": [{"category": "Integration", "tests": [{"name": "pcie", ' \
    '"results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"}], ' \
    '"test_summary": {"status": "Pass"}}]}]}}'  # fmt: skip

# Stand-ins: nv-hostengine answers after its first "second" (a marker the dcgmi stand-in sees on
# its second call), dcgmi records its argv and prints the report when connected.
HOSTENGINE = """#!/bin/sh
echo started >> "$STUB/hostengine"
"""
DCGMI = """#!/bin/sh
echo "$*" >> "$STUB/dcgmi.calls"
[ -f "$STUB/hostengine" ] || { echo "Error: unable to establish a connection to the host" >&2; exit 255; }
calls=$(wc -l < "$STUB/dcgmi.calls")
[ "$calls" -ge 2 ] || { echo "Error: host engine not ready" >&2; exit 255; }
case "$1" in diag) cat "$STUB/report";; esac
"""
SLEEP = """#!/bin/sh
echo "$1" >> "$STUB/slept"
"""


def run_script(
    tmp_path: Path, hostengine: str = "embedded", wait: int = 5, *, with_hostengine: bool = True
) -> Path:
    bin_dir, out, stub = tmp_path / "bin", tmp_path / "results", tmp_path / "stub"
    for d in (bin_dir, out, stub):
        d.mkdir()
    programs = {"dcgmi": DCGMI, "sleep": SLEEP}
    if with_hostengine:
        programs["nv-hostengine"] = HOSTENGINE
    for name, text in programs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (stub / "report").write_text(REPORT)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STUB": str(stub),
        "GPUHEALTH_RESULTS": str(out),
        "GPUHEALTH_DIAG_LEVEL": "2",
        "GPUHEALTH_DIAG_HOSTENGINE": hostengine,
        "GPUHEALTH_DIAG_WAIT_SECONDS": str(wait),
        "GPUHEALTH_DIAG_GPU": "GPU-4a1c",
    }
    assert SH is not None
    done = subprocess.run([SH, *DIAG_COMMAND[1:]], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.skipif(SH is None, reason="no POSIX sh")
def test_the_script_starts_a_hostengine_waits_for_it_then_runs_the_diagnostic(tmp_path: Path) -> None:
    out = run_script(tmp_path)
    calls = (tmp_path / "stub" / "dcgmi.calls").read_text().splitlines()
    assert calls == [
        "discovery --host localhost -l",  # not yet
        "discovery --host localhost -l",
        "diag --host localhost -i GPU-4a1c -r 2 -j",
    ]
    assert (tmp_path / "stub" / "hostengine").read_text() == "started\n"
    assert (out / EXIT_FILE).read_text() == "0\n"
    assert judge((out / REPORT_FILE).read_text(), 0).passed
    assert "answered after 1 s" in (out / LOG_FILE).read_text()


@pytest.mark.skipif(SH is None, reason="no POSIX sh")
def test_no_hostengine_no_report(tmp_path: Path) -> None:
    out = run_script(tmp_path, wait=3, with_hostengine=False)
    assert not (out / REPORT_FILE).exists()
    assert (out / EXIT_FILE).read_text() == "1\n"
    log = (out / LOG_FILE).read_text()
    assert "nv-hostengine did not start" in log
    assert not judge(None, 1).passed


@pytest.mark.skipif(SH is None, reason="no POSIX sh")
def test_a_configured_hostengine_is_used_and_none_is_started(tmp_path: Path) -> None:
    out = run_script(tmp_path, hostengine="nvidia-dcgm.gpu-operator.svc:5555", wait=3)
    # The stand-in has no hostengine of the node's: nothing answers there, and none was started.
    assert not (tmp_path / "stub" / "hostengine").exists()
    calls = (tmp_path / "stub" / "dcgmi.calls").read_text().splitlines()
    assert set(calls) == {"discovery --host nvidia-dcgm.gpu-operator.svc:5555 -l"} and len(calls) == 4
    assert (tmp_path / "stub" / "slept").read_text().split() == ["1", "1", "1"]
    assert (out / EXIT_FILE).read_text() == "1\n"
    assert (
        "no hostengine answered at nvidia-dcgm.gpu-operator.svc:5555 within 3 s"
        in (out / LOG_FILE).read_text()
    )


def test_the_judge_image_is_the_image_the_manifests_ship() -> None:
    import yaml

    kustomization = Path(__file__).parents[2] / "deploy" / "base" / "kustomization.yaml"
    (image,) = [i for i in yaml.safe_load(kustomization.read_text())["images"] if i["name"] == "gpuhealth"]
    assert f"{image['newName']}:{image['newTag']}" == JUDGE_IMAGE
