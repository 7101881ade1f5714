"""`gpuhealth demo` end to end: the real command, the real servers, the closed loop, a verdict.

Aspects covered: the default scenario (closed-loop) runs through cluster, exporters,
Prometheus, Alertmanager and two enforcing responder replicas, and its journal tells the story:
the fatal XID's device is quarantined by a DeviceTaintRule, the checkpointed job is evicted
once and re-placed on healthy GPUs (migration succeeded), its fatal-XID alert fires within the
pipeline's floor, its Unhealthy alert stays firing until the device recovers (its pods leaving is
no recovery), and it walks probe, canary, stabilizing and ramp to released in one attempt;
the long Unknown is restricted and nothing is evicted for it; the application XID and the
short Unknown get no record; the command says how long it takes, exits 0 with the safety line
and leaves journal.json. Bad input exits 2 with a clear message after `gpuhealth demo: error:`
(a missing scenario, a speed the rules cannot follow, a bad `demo:` or `responder:` section
naming the field); a speed that is not a finite positive number is argparse's usage error,
and `DemoSettings` refuses such values itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from demo.journal import Journal, Kind
from demo.pipeline import DemoSettings
from gpuhealth.fields import SettingsError
from gpuhealth_cli.main import main
from simulator.fleet.objects import gpu_uuid
from tests.support.ladders import check_names, walk

FAILED = gpu_uuid("gpu-dra-0", 3)
RESTRICTED = gpu_uuid("gpu-dra-1", 6)
SHORT_UNKNOWN = gpu_uuid("gpu-dra-1", 1)
APPLICATION_XID = gpu_uuid("gpu-dp-0", 0)
RELEASE_WALK = ["Pending", "Quarantined", *walk()]
"""An uneventful quarantine's phases: the release ladder's walk after it was enforced."""


def gpuhealth(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuhealth", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def walked(journal: Journal, device: str) -> list[str]:
    """The record's phases in order, repeats of one phase folded."""
    phases: list[str] = []
    for entry in journal.of(Kind.PHASE, device=device):
        if not phases or phases[-1] != entry.what:
            phases.append(entry.what)
    return phases


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_the_closed_loop_story_happens_and_every_invariant_holds(tmp_path: Path) -> None:
    result = gpuhealth("demo", "--workdir", str(tmp_path), timeout=420)
    out = result.stdout
    assert result.returncode == 0, out[-6000:] + result.stderr[-3000:]
    assert "scenario closed-loop" in out.splitlines()[0] and "this takes about" in out.splitlines()[0]
    assert "safety: every invariant held" in out
    journal = Journal.from_dict(json.loads((tmp_path / "journal.json").read_text()))
    story = out[-6000:]

    # The fatal XID: quarantined by a DeviceTaintRule, the job moved, the device released.
    assert any(e.detail.get("rule") for e in journal.of(Kind.ENFORCED, device=FAILED)), story
    [migration] = list(journal.of(Kind.MIGRATION, device=FAILED))
    assert migration.what == "succeeded" and migration.detail["job"] == "research/train"
    evicted = [e.what for e in journal.of(Kind.EVICTION)]
    assert len(evicted) == len(set(evicted)) == 2  # fixed topology: both pods, once each
    assert all(e.detail["job"] == "research/train" for e in journal.of(Kind.EVICTION))
    placed = [e for e in journal.of(Kind.NOTE) if e.what == "placed"]
    assert placed and all(FAILED not in e.detail["devices"] for e in placed)
    assert sum(len(e.detail["devices"].split(",")) for e in placed) == 8  # the whole job runs again
    # One attempt, no failure on the way out: the device's Unhealthy alert stays firing until
    # the device recovers (its pods leaving is no recovery), so probing starts only then.
    assert walked(journal, FAILED) == RELEASE_WALK, walked(journal, FAILED)
    [recovered] = [e.at for e in journal.of(Kind.FAULT, device=FAILED) if e.what == "recover"]
    resolutions = journal.of(Kind.ALERT_RESOLVED, device=FAILED)
    resolved = [e.at for e in resolutions if e.what == "GPUDeviceUnhealthy"]
    assert resolved and min(resolved) >= recovered, story
    [probing] = [e.at for e in journal.of(Kind.PHASE, device=FAILED) if e.what == "Probing"]
    assert probing >= recovered
    # The fatal XID alert (no `for:`) fires within the pipeline's floor of its XID.
    [xid] = [e.at for e in journal.of(Kind.FAULT, device=FAILED) if e.what == "xid"]
    fired = [e.at for e in journal.of(Kind.ALERT_FIRING, device=FAILED) if e.what == "GPUDeviceFatalXid"]
    assert fired and min(fired) - xid <= journal.floor_seconds, (min(fired) - xid, journal.floor_seconds)
    checks = {(e.what, e.detail["result"]) for e in journal.of(Kind.CHECK, device=FAILED)}
    assert {(name, "passed") for name in check_names()} <= checks

    # The long Unknown: restricted, its notebook left running.
    restrict = list(journal.of(Kind.PHASE, device=RESTRICTED))
    assert restrict and {e.detail["action"] for e in restrict} == {"restrict"}
    assert "Quarantined" in walked(journal, RESTRICTED)
    assert not [e for e in journal.of(Kind.EVICTION) if e.node == "gpu-dra-1"]
    assert not list(journal.of(Kind.MIGRATION, device=RESTRICTED))

    # The application XID and the short Unknown: nothing recorded, nothing asked of the responder.
    for spared in (APPLICATION_XID, SHORT_UNKNOWN):
        assert not list(journal.of(Kind.PHASE, device=spared)), spared
        assert not [e for e in journal.of(Kind.DELIVERY, device=spared) if e.what == "responder"]
    assert not list(journal.of(Kind.NODE_ACTION))
    started = [e.detail["name"] for e in journal.of(Kind.PROCESS) if e.what == "started"]
    assert {"responder-0", "responder-1", "alertmanager-0"} <= set(started)


def test_demo_rejects_a_missing_scenario_and_a_speed_the_rules_cannot_follow(tmp_path: Path) -> None:
    missing = gpuhealth("demo", "--scenario", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("gpuhealth demo: error: ") and "nope.yaml" in missing.stderr
    too_fast = gpuhealth("demo", "--speed", "100")
    assert too_fast.returncode == 2
    assert "rules at 100x" in too_fast.stderr and "heartbeat_limit" in too_fast.stderr


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"demo": {"kills": [{"at": "1m", "process": "kubelet"}]}}, "demo.kills[0].process: expected one of"),
        ({"demo": {"responders": 9}}, "demo.responders: expected a whole number from 1 to 5"),
        ({"responder": {"policy": {"stabilty": "1m"}}}, "responder.policy.stabilty: unknown key"),
    ],
)
def test_a_bad_demo_or_responder_section_is_a_usage_error_naming_the_field(
    tmp_path: Path, section: dict[str, object], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = {
        "name": "bad",
        "fleet": [{"name": "n", "count": 1, "gpusPerNode": 1, "path": "dra"}],
        **section,
    }
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(scenario))
    assert main(["demo", "--scenario", str(path), "--workdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuhealth demo: error: ") and message in err, err


@pytest.mark.parametrize("speed", ["nan", "inf", "0", "-3", "fast"])
def test_demo_speed_must_be_a_finite_positive_number(speed: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--speed", speed])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "gpuhealth demo: error: argument --speed: " in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("speed", float("nan")),
        ("speed", 0.0),
        ("lead_in_seconds", -1.0),
        ("settle_seconds", float("inf")),
        ("settle_seconds", -1.0),
        ("node_exporters_max", 2.5),
        ("poll_interval_seconds", 0.0),
    ],
)
def test_demo_settings_refuse_values_the_run_cannot_use(field: str, value: float) -> None:
    with pytest.raises(SettingsError, match=f"DemoSettings.{field} must be"):
        DemoSettings(**{field: value})


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_killed_leader_is_replaced_and_duplicate_deliveries_change_nothing(tmp_path: Path) -> None:
    scenario = Path(__file__).with_name("ha-kill-scenario.yaml")
    result = gpuhealth("demo", "--scenario", str(scenario), "--workdir", str(tmp_path), timeout=360)
    out = result.stdout
    assert result.returncode == 0, out[-6000:] + result.stderr[-3000:]
    journal = Journal.from_dict(json.loads((tmp_path / "journal.json").read_text()))
    processes = [(e.what, e.detail["name"], e.detail.get("role", "")) for e in journal.of(Kind.PROCESS)]
    assert ("killed", "alertmanager-1", "") in processes and ("started", "alertmanager-1", "") in processes
    # Either replica may win the first election (and, on a loaded machine, the Lease may change
    # hands before the kill): the kill hits whoever holds it then, and another replica takes over.
    kills = [
        e for e in journal.of(Kind.PROCESS) if e.what == "killed" and e.detail["name"].startswith("responder")
    ]
    assert len(kills) == 1, processes
    kill = kills[0]
    killed = kill.detail["name"]
    assert kill.detail["role"] == "leader", processes
    leaders = [(e.at, e.detail["holder"]) for e in journal.of(Kind.NOTE) if e.what == "leader"]
    before = [holder for at, holder in leaders if at <= kill.at]
    after = [holder for at, holder in leaders if at > kill.at]
    assert before and before[-1] == killed, (kill.at, leaders)
    assert after and after[0] not in ("", killed) and after[0].startswith("responder-"), (kill.at, leaders)
    # The HA pair delivered notifications twice; the device was still quarantined once, its job
    # evicted once.
    sent: dict[tuple[str, str], int] = {}
    for e in journal.of(Kind.DELIVERY):
        if e.what == "responder":
            key = (e.detail["fingerprint"], e.detail["status"])
            sent[key] = sent.get(key, 0) + 1
    assert max(sent.values()) >= 2, sent
    device = gpu_uuid("gpu-dra-0", 1)
    assert [e.detail["record"] for e in journal.of(Kind.PHASE, device=device)][:1]
    assert len({e.detail["record"] for e in journal.of(Kind.PHASE, device=device)}) == 1
    assert len([e for e in journal.of(Kind.ENFORCED, device=device) if e.what == "quarantine"]) == 1
    assert len(list(journal.of(Kind.EVICTION))) == 1
    [migration] = list(journal.of(Kind.MIGRATION, device=device))
    assert migration.what == "succeeded"
    assert "safety: every invariant held" in out
