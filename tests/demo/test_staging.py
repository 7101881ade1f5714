"""How the demo stages a scenario (demo.staging, demo.pipeline.responder_document).

Aspects: the `demo:` section's defaults and every field read; each bad field is refused with
its path (unknown keys, ranges, a kill's process and times, a follower kill with one replica);
kills come sorted by time. The responders' config: defaults with the scenario's overrides on
top, durations divided by the speed and per-hour rates multiplied by it (property: scaling
back gives the original within a millisecond, whole-number rates never get stricter), values
that are neither pass through, and the result is what the responder's own loader accepts; a
bad override is a StagingError naming `responder.<section>.<key>`; every duration of the
shipped config is scaled (none is missed); the shipped closed-loop scenario stages without
error. Release requests (device, reason, actor, via) and health-source outages are read,
sorted, refused with their field when bad (overlapping outages too), and the run settles after
the last of them; a move's deadline is the checkpoint timeout at the run's speed plus a
grace period and a pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from demo.pipeline import RESPONDER_CONFIG, move_deadline_seconds, responder_document
from demo.staging import (
    CHECK_WALL_SECONDS,
    DEFAULT_SETTLE_SECONDS,
    DURATION_KEYS,
    UNSCALED_DURATION_KEYS,
    Kill,
    Outage,
    ReleaseAsk,
    Staging,
    StagingError,
    merged,
    scaled_document,
    staging,
)
from gpuhealth.durations import parse_duration
from simulator.fleet.programs import TIMEOUT_SECONDS
from simulator.scenario import resolve

DEFAULTS = yaml.safe_load(RESPONDER_CONFIG.read_text())


def test_defaults_and_every_field() -> None:
    assert staging(None) == Staging()
    assert staging({}) == Staging(responders=2, alertmanagers=1, speed=None, settle=DEFAULT_SETTLE_SECONDS)
    stage = staging(
        {
            "responders": 3,
            "alertmanagers": 2,
            "speed": 30,
            "settle": "1m30s",
            "kills": [
                {"at": "5m", "process": "alertmanager"},
                {"at": "2m30s", "process": "responder-leader", "restart": "30s"},
            ],
        }
    )
    assert stage == Staging(
        3,
        2,
        30.0,
        90.0,
        (Kill(150.0, "responder-leader", 30.0), Kill(300.0, "alertmanager", None)),
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("three", "demo: expected a mapping"),
        ({"replicas": 2}, "demo.replicas: unknown field"),
        ({"responders": 0}, "demo.responders: expected a whole number from 1 to 5"),
        ({"responders": True}, "demo.responders: expected a whole number"),
        ({"alertmanagers": 3}, "demo.alertmanagers: expected a whole number from 1 to 2"),
        ({"speed": 0}, "demo.speed: expected a number above 0"),
        ({"speed": float("inf")}, "demo.speed: expected a number above 0"),
        ({"settle": 30}, "demo.settle: write a unit"),
        ({"settle": "soon"}, "demo.settle:"),
        ({"kills": {"at": "1m"}}, "demo.kills: expected a list"),
        ({"kills": ["exporter"]}, "demo.kills[0]: expected a mapping"),
        ({"kills": [{"process": "exporter"}]}, "demo.kills[0].at: required"),
        ({"kills": [{"at": "1m"}]}, "demo.kills[0].process: required"),
        ({"kills": [{"at": "1m", "process": "prometheus"}]}, "demo.kills[0].process: expected one of"),
        ({"kills": [{"at": "1m", "process": "exporter", "when": 1}]}, "demo.kills[0].when: unknown field"),
        ({"kills": [{"at": "1m", "process": "exporter", "restart": "0s"}]}, "demo.kills[0].restart:"),
        (
            {"responders": 1, "kills": [{"at": "1m", "process": "responder-follower"}]},
            "demo.kills[0].process: a responder-follower needs demo.responders of 2",
        ),
        ({"exporter": "nvml"}, "demo.exporter: expected one of node, cluster, got 'nvml'"),
    ],
)
def test_a_bad_demo_section_names_the_field(section: Any, message: str) -> None:
    with pytest.raises(StagingError) as error:
        staging(section)
    assert str(error.value).startswith(message), str(error.value)


def test_the_exporter_mode_is_chosen_by_size_unless_the_scenario_names_it() -> None:
    assert staging({}).exporter is None
    assert staging({"exporter": "cluster"}).exporter == "cluster"
    assert staging({"exporter": "node"}).exporter == "node"
    assert staging(resolve("dcgm-exporter-source").demo).exporter == "cluster"


def test_overrides_go_on_top_of_the_defaults_section_by_section() -> None:
    doc = merged(DEFAULTS, {"policy": {"stability": "2m"}, "intake": {"expiry": "1h"}})
    assert doc["policy"]["stability"] == "2m"
    assert doc["policy"]["ramp"] == DEFAULTS["policy"]["ramp"]  # the rest of the section kept
    assert doc["intake"] == {**DEFAULTS["intake"], "expiry": "1h"}
    assert DEFAULTS["policy"]["stability"] == "30m"  # the defaults themselves untouched
    with pytest.raises(StagingError, match="responder: expected a mapping"):
        merged(DEFAULTS, ["policy"])  # type: ignore[arg-type]


def test_scaling_divides_durations_and_multiplies_rates() -> None:
    doc = scaled_document(DEFAULTS, 20)
    assert doc["policy"]["stability"] == "1m30s"  # 30m / 20
    assert doc["policy"]["probe_timeout"] == "30s"
    assert doc["migration"]["lease_margin"] == "3s"
    assert doc["new_quarantines"]["per_hour"] == 2400.0
    assert doc["migration"]["node_per_hour"] == 80
    assert doc["migration"]["namespace_evictions_per_hour"] == 400
    # Neither durations nor rates: untouched.
    assert doc["breaker"]["rate_fraction"] == DEFAULTS["breaker"]["rate_fraction"]
    assert doc["new_quarantines"]["burst"] == DEFAULTS["new_quarantines"]["burst"]
    assert doc["checks"] == DEFAULTS["checks"]
    with pytest.raises(StagingError, match="speed: expected a number above 0"):
        scaled_document(DEFAULTS, 0)
    with pytest.raises(StagingError, match=r"responder.policy.ramp: .*unit"):
        scaled_document({"policy": {"ramp": 60}}, 2)


def test_a_check_timeout_is_never_scaled_below_the_wall_time_a_check_takes() -> None:
    doc = {
        "policy": {"probe_timeout": "1m", "canary_timeout": "20s", "stability": "1m"},
        "reset": {"timeout": "15m"},
    }
    scaled = scaled_document(doc, 20)
    assert CHECK_WALL_SECONDS == TIMEOUT_SECONDS  # the simulated node's bound on a container's process
    assert scaled["policy"]["probe_timeout"] == "30s"  # 3 s at 20x: floored
    assert scaled["policy"]["canary_timeout"] == "20s"  # never above what the config says
    assert scaled["reset"]["timeout"] == "45s"  # 15m / 20: above the floor, scaled
    assert scaled["policy"]["stability"] == "3s"  # a window is the cluster's time: scaled as ever


@given(
    seconds=st.floats(min_value=1.0, max_value=30 * 86400.0),
    speed=st.floats(min_value=0.5, max_value=200.0),
    per_hour=st.integers(min_value=1, max_value=10_000),
)
def test_scaling_round_trips_and_never_makes_a_whole_rate_stricter(
    seconds: float, speed: float, per_hour: int
) -> None:
    doc = {"policy": {"stability": f"{seconds}s"}, "migration": {"node_per_hour": per_hour}}
    scaled = scaled_document(doc, speed)
    back = parse_duration(scaled["policy"]["stability"]) * speed
    assert back == pytest.approx(seconds, abs=0.001 * speed + 1e-9)
    assert scaled["migration"]["node_per_hour"] >= per_hour * speed
    assert scaled["migration"]["node_per_hour"] < per_hour * speed + 1


def test_every_duration_key_is_one_the_responder_reads() -> None:
    for section, key in DURATION_KEYS:
        assert key in DEFAULTS[section], (section, key)


def test_the_responder_document_is_what_the_responder_loads(tmp_path: Path) -> None:
    scenario = resolve("closed-loop")
    doc = responder_document(scenario, 10)
    assert doc["policy"]["stability"] == "12s"  # the scenario's 2m at 10x
    assert doc["policy"]["ramp"] == "6s"
    assert doc["policy"]["max_backoff"] == "16h48m"  # a default, scaled too


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"policy": {"stabilty": "1m"}}, "responder.policy.stabilty: unknown key"),
        ({"policy": {"stability": "-"}}, "responder.policy.stability:"),
        ({"breaker": {"rate_fraction": 2}}, "responder.breaker.rate_fraction:"),
        ({"migration": "fast"}, "responder.migration: expected a mapping"),
        ({"policy": {"backoff": "10d"}}, "policy.backoff"),  # above max_backoff: the settings' own check
    ],
)
def test_a_bad_responder_override_is_a_staging_error_naming_the_field(
    overrides: dict[str, Any], message: str
) -> None:
    scenario = resolve(
        {
            "name": "bad",
            "fleet": [{"name": "n", "count": 1, "gpusPerNode": 1, "path": "dra"}],
            "responder": overrides,
        }
    )
    with pytest.raises(StagingError) as error:
        responder_document(scenario, 10)
    assert message in str(error.value), str(error.value)


def test_a_kill_names_the_process_it_means() -> None:
    from demo.journal import Journal
    from demo.observer import Observer
    from demo.pipeline import Process, Running

    names = [
        "alertmanager-0",
        "alertmanager-1",
        "exporter-gpu-dra-0",
        "exporter-gpu-dp-0",
        "responder-0",
        "responder-1",
    ]
    processes = {name: Process(name, ["true"], Path("/dev/null"), None) for name in names}
    observer = Observer(Journal("t", "", 1.0, {}))
    run = Running(None, None, None, processes, observer.journal, observer, 0.0, Path("."))  # type: ignore[arg-type]
    observer.leader = "responder-1"
    assert run.resolve("responder-leader") == "responder-1"
    assert run.resolve("responder-follower") == ""  # no follower is alive (none started here)
    assert run.resolve("exporter") == "exporter-gpu-dp-0"  # the first by name
    assert run.resolve("alertmanager") == "alertmanager-1"  # the last of the pair
    assert run.resolve("responder-0") == "responder-0"  # a name is itself
    observer.leader = "someone-else"
    assert run.resolve("responder-leader") == ""


def test_every_duration_of_the_shipped_config_is_scaled() -> None:
    for section, body in DEFAULTS.items():
        for key, value in (body or {}).items() if isinstance(body, dict) else ():
            if isinstance(value, str) and value[:1].isdigit():
                assert (section, key) in DURATION_KEYS | UNSCALED_DURATION_KEYS, (section, key)


def test_release_requests_and_outages_are_read_sorted_and_counted_in_the_run() -> None:
    stage = staging(
        {
            "kills": [{"at": "1m", "process": "exporter", "restart": "30s"}],
            "releaseRequests": [
                {"at": "5m", "node": "gpu-dp-0", "gpu": 1, "reason": "riser", "via": "patch", "actor": "ana"},
                {"at": "4m", "node": "gpu-dra-0", "gpu": 0, "reason": "fixed"},
            ],
            "healthSourceDown": [{"at": "8m", "for": "1m"}, {"at": "2m", "for": "3m"}],
        }
    )
    assert stage.release_requests == (
        ReleaseAsk(240.0, "gpu-dra-0", 0, "fixed"),
        ReleaseAsk(300.0, "gpu-dp-0", 1, "riser", actor="ana", via="patch"),
    )
    assert stage.health_source_down == (Outage(120.0, 180.0), Outage(480.0, 60.0))
    assert stage.last_action == 540.0
    assert Staging().last_action == 0.0


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"releaseRequests": {"at": "1m"}}, "demo.releaseRequests: expected a list"),
        (
            {"releaseRequests": [{"at": "1m", "node": "n", "gpu": 0}]},
            "demo.releaseRequests[0].reason: required",
        ),
        (
            {"releaseRequests": [{"at": "1m", "node": "n", "gpu": 0, "reason": "r", "via": "kubectl"}]},
            "demo.releaseRequests[0].via: expected one of command, patch",
        ),
        (
            {"releaseRequests": [{"at": "1m", "node": "n", "gpu": -1, "reason": "r"}]},
            "demo.releaseRequests[0].gpu: expected a whole number",
        ),
        (
            {"releaseRequests": [{"at": "1m", "node": "", "gpu": 0, "reason": "r"}]},
            "demo.releaseRequests[0].node:",
        ),
        ({"healthSourceDown": [{"at": "1m"}]}, "demo.healthSourceDown[0].for: required"),
        ({"healthSourceDown": [{"at": "1m", "for": "0s"}]}, "demo.healthSourceDown[0].for:"),
        (
            {"healthSourceDown": [{"at": "1m", "for": "1m", "why": 1}]},
            "demo.healthSourceDown[0].why: unknown field",
        ),
        (
            {"healthSourceDown": [{"at": "1m", "for": "2m"}, {"at": "2m", "for": "1m"}]},
            "demo.healthSourceDown: the outage at 120s starts before the one at 60s ends",
        ),
    ],
)
def test_a_bad_release_request_or_outage_names_the_field(section: Any, message: str) -> None:
    with pytest.raises(StagingError) as error:
        staging(section)
    assert message in str(error.value)


def test_a_moves_deadline_is_the_checkpoint_timeout_at_speed_plus_grace_and_a_pass() -> None:
    document = scaled_document(merged(DEFAULTS, {"migration": {"checkpoint_timeout": "2m"}}), 20.0)
    # 2 minutes of simulated time, the pod's 30 s grace period, one 5 s pass at 20x.
    assert move_deadline_seconds(document, 20.0) == pytest.approx(120.0 + 30.0 + 100.0)
