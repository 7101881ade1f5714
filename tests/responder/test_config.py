"""`gpuhealth responder --config FILE` (responder.config): the tunables as a YAML document.

Aspects: the shipped `deploy/responder-config.yaml` loads to exactly the default settings;
every section lands where it belongs in the settings tree; keys left out keep their defaults;
contradictions are the settings' own checks worded with the file's key paths, and changes to
one settings class are applied together (raising a cap and a value above the old cap is no
contradiction); unknown keys, bare-number durations, bad fractions, modes and headers are
ConfigError naming the file and key path (property: any document is settings or ConfigError,
never another exception); on the command line a bad file is a usage error (exit 2).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from responder.checks.jobs import PROBE
from responder.checks.probe_pod import DiagSettings
from responder.config import ConfigError, apply, load
from responder.migrate.plan import Mode
from responder.settings import ResponderSettings

EXAMPLE = Path(__file__).parents[2] / "deploy" / "responder-config.yaml"
BASE = ResponderSettings(token="t", identity="replica", prometheus_url="http://prometheus:9090")


def doc(**sections: Any) -> dict[str, Any]:
    return dict(sections)


def test_the_shipped_example_is_exactly_the_defaults() -> None:
    assert load(EXAMPLE, BASE) == BASE
    text = EXAMPLE.read_text()
    for section in ("policy", "breaker", "new_quarantines", "migration", "checks", "intake"):
        assert f"\n{section}:\n" in text  # every section is shown, with its reasons


def test_every_section_lands_in_the_settings_tree() -> None:
    settings = apply(
        doc(
            policy={
                "probe_timeout": "5m",
                "stability": "45m",
                "backoff": "2h",
                "max_backoff": "14d",
                "ramp_pods": 3,
            },
            breaker={"window": "15m", "rate_fraction": 0.1, "rate_floor": 3, "capacity_floor": 8},
            new_quarantines={"burst": 5, "per_hour": 30},
            migration={
                "checkpoint_timeout": "20m",
                "lease_cap": "2h",
                "namespace_modes": {"batch": "immediate", "serving": "allow-completion"},
                "node_per_hour": 2,
            },
            checks={
                "probe_image": "dcgm:latest",
                "probe_level": 1,
                "probe_hostengine": "nvidia-dcgm.gpu-operator.svc:5555",
                "probe_wait": "2m",
                "judge_image": "registry.local/gpuhealth@sha256:0123",
                "canary_command": ["/cuda-samples/matrixMul"],
                "runtime_class": "",
            },
            intake={"expiry": "12h"},
        ),
        BASE,
        "f.yaml",
    )
    policy = settings.reconciler.policy
    assert (policy.probe_timeout_seconds, policy.stability_seconds) == (300.0, 2700.0)
    assert (policy.backoff_seconds, policy.max_backoff_seconds) == (7200.0, 14 * 86400.0)
    assert policy.canary_timeout_seconds == BASE.reconciler.policy.canary_timeout_seconds  # kept
    assert settings.ramp_pods == 3
    breaker = policy.breaker
    assert (breaker.window_seconds, breaker.rate_fraction, breaker.rate_floor) == (900.0, 0.1, 3)
    assert (breaker.capacity_fraction, breaker.capacity_floor) == (0.15, 8)
    assert (settings.reconciler.bucket.burst, settings.reconciler.bucket.per_hour) == (5, 30.0)
    migrator = settings.migrator
    assert (migrator.migration.checkpoint_timeout_seconds, migrator.migration.lease_cap_seconds) == (
        1200.0,
        7200.0,
    )
    assert migrator.mode("batch") == Mode.IMMEDIATE and migrator.mode("other") == Mode.CHECKPOINT
    assert migrator.node_per_hour == 2 and migrator.node_in_flight == 1
    probe, canary = settings.checks.probe, settings.checks.canary
    assert (probe.image, probe.command) == ("dcgm:latest", PROBE.command)
    assert probe.diag == DiagSettings(
        level=1,
        hostengine="nvidia-dcgm.gpu-operator.svc:5555",
        wait_seconds=120.0,
        judge_image="registry.local/gpuhealth@sha256:0123",
    )
    assert (canary.image, canary.command) == (BASE.checks.canary.image, ("/cuda-samples/matrixMul",))
    assert settings.checks.runtime_class == ""  # the node's default runtime is NVIDIA's
    assert settings.intake.expiry_seconds == 43200.0
    assert (settings.token, settings.server, settings.election) == (BASE.token, BASE.server, BASE.election)


def test_a_backoff_above_the_old_cap_is_fine_when_the_cap_rises_with_it() -> None:
    settings = apply(doc(policy={"backoff": "10d", "max_backoff": "30d"}), BASE, "f.yaml")
    assert settings.reconciler.policy.backoff_seconds == 10 * 86400.0


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "f.yaml: expected a mapping of sections, not list"),
        # The earlier dialect: its header and camelCase keys are refused with the new spelling.
        (
            {"apiVersion": "gpuhealth.io/v1alpha1", "kind": "ResponderConfiguration"},
            "f.yaml: apiVersion: removed (the file is sections of snake_case keys, as rules/config.yaml",
        ),
        ({"kind": "ResponderConfiguration"}, "f.yaml: kind: removed"),
        (
            doc(policy={"probeTimeout": "5m"}),
            "f.yaml: policy.probeTimeout: removed; now spelt policy.probe_timeout",
        ),
        (doc(newQuarantines={"burst": 5}), "f.yaml: newQuarantines: removed; now spelt new_quarantines"),
        (
            doc(migration={"namespaceEvictionsPerHour": 3}),
            "f.yaml: migration.namespaceEvictionsPerHour: removed; "
            "now spelt migration.namespace_evictions_per_hour",
        ),
        (doc(polcy={}), "f.yaml: polcy: unknown key (known: policy, breaker"),
        (doc(policy={"stabilty": "1h"}), "f.yaml: policy.stabilty: unknown key (known: probe_timeout"),
        (doc(policy="1h"), "f.yaml: policy: expected a mapping, not '1h'"),
        (doc(policy={"ramp": 3600}), "f.yaml: policy.ramp: write a unit, e.g. '3600s'"),
        (doc(policy={"ramp": "1 hour"}), "f.yaml: policy.ramp: '1 hour' is not a duration"),
        (doc(policy={"ramp": "0s"}), "f.yaml: policy.ramp: '0s' must be longer than zero"),
        (doc(breaker={"rate_fraction": 8}), "f.yaml: breaker.rate_fraction: 8 must be a fraction"),
        (
            doc(breaker={"rate_floor": -1}),
            "f.yaml: breaker.rate_floor: -1 must be a whole number of at least 0",
        ),
        (doc(new_quarantines={"burst": True}), "f.yaml: new_quarantines.burst: True must be a whole number"),
        (
            doc(migration={"default_mode": "evict"}),
            "f.yaml: migration.default_mode: 'evict' is not a migration",
        ),
        (
            doc(migration={"namespace_modes": {"a": "nope"}}),
            "f.yaml: migration.namespace_modes: a: 'nope' is not a migration mode",
        ),
        (
            doc(checks={"canary_command": "vectorAdd"}),
            "f.yaml: checks.canary_command: 'vectorAdd' must be a non-empty list",
        ),
        # dcgmi alone has no hostengine to talk to: the probe's command is not the user's to set.
        (
            doc(checks={"probe_command": ["dcgmi", "diag", "-r", "2"]}),
            "f.yaml: checks.probe_command: removed; the probe runs DCGM's diagnostic with a hostengine",
        ),
        (doc(checks={"probe_level": 5}), "f.yaml: checks.probe_level: 5 must be a dcgmi diag level, 1 to 4"),
        (
            doc(checks={"probe_hostengine": "nvidia-dcgm"}),
            "f.yaml: checks.probe_hostengine: 'nvidia-dcgm' must be 'embedded' or host:port",
        ),
        (
            doc(checks={"probe_hostengine": "localhost:99999"}),
            "f.yaml: checks.probe_hostengine: 'localhost:99999' must be 'embedded' or host:port",
        ),
        (
            doc(checks={"probe_wait": "20m"}),
            "f.yaml: DiagSettings.checks.probe_wait must be 1-600 seconds",
        ),
        (doc(checks={"canary_image": ""}), "f.yaml: checks.canary_image: '' must be a non-empty string"),
        # The canary has its own image and command now: the probe's keys say whose they are.
        (doc(checks={"image": "dcgm"}), "f.yaml: checks.image: removed; now spelt checks.probe_image"),
        (doc(checks={"command": ["x"]}), "f.yaml: checks.command: removed; the probe runs DCGM's"),
        (
            doc(checks={"runtime_class": "NVIDIA runtime"}),
            "f.yaml: checks.runtime_class: 'NVIDIA runtime' must be a RuntimeClass name",
        ),
        (doc(policy={"ramp_pods": 0}), "f.yaml: policy.ramp_pods: 0 must be a whole number of at least 1"),
        (
            doc(policy={"ramp_pods": 65}),
            "f.yaml: ResponderSettings.policy.ramp_pods must be 1-64 pods, got 65",
        ),
        (
            doc(policy={"backoff": "8d"}),
            "f.yaml: policy.max_backoff must be at least policy.backoff",
        ),
    ],
)
def test_what_cannot_be_used_names_the_file_and_key(document: Any, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        apply(document, BASE, "f.yaml")
    assert str(raised.value).startswith(message), str(raised.value)


def test_an_unreadable_file_names_itself(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: No such file or directory"):
        load(tmp_path / "missing.yaml", BASE)
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: [\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not YAML"):
        load(bad, BASE)


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
sections = st.sampled_from(["policy", "breaker", "new_quarantines", "migration", "checks", "intake", "x"])
keys = st.sampled_from(
    ["probe_timeout", "backoff", "max_backoff", "rate_fraction", "burst", "default_mode", "namespace_modes",
     "command", "image", "probe_command", "probe_level", "probe_hostengine", "probe_wait", "judge_image",
     "canary_image", "runtime_class", "expiry", "lease_cap",
     "node_in_flight", "y"]
)  # fmt: skip


@given(st.dictionaries(sections, st.dictionaries(keys, values, max_size=3) | values, max_size=4))
def test_any_document_is_settings_or_config_error(body: dict[str, Any]) -> None:
    try:
        settings = apply(doc(**body), BASE, "f.yaml")
    except ConfigError as exc:
        assert str(exc).startswith("f.yaml: ")
    else:
        assert isinstance(settings, ResponderSettings)


def test_repeated_config_files_apply_in_order_and_an_error_names_its_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    first, second = tmp_path / "responder.yaml", tmp_path / "gpu-reset.yaml"
    first.write_text(yaml.safe_dump({"reset": {"timeout": "5m"}}))
    second.write_text(yaml.safe_dump({"reset": {"enabled": "yes"}}))
    done = subprocess.run(
        [
            sys.executable, "-m", "gpuhealth", "responder", "--token-file", str(token),
            "--prometheus-url", "http://p", "--config", str(first), "--config", str(second),
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        f"gpuhealth responder: error: --config {second}: reset.enabled: 'yes' must be true or false"
    )
    # What each file sets is applied over what came before it.
    layered = apply({"reset": {"timeout": "5m"}}, BASE, "a.yaml")
    layered = apply({"reset": {"enabled": True}}, layered, "b.yaml")
    assert layered.reconciler.policy.reset_timeout_seconds == 300
    assert layered.reconciler.policy.ladder.resets()


def test_a_bad_config_file_is_a_usage_error(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    config = tmp_path / "responder.yaml"
    config.write_text(yaml.safe_dump(doc(breaker={"window": 600})))
    done = subprocess.run(
        [
            sys.executable, "-m", "gpuhealth", "responder", "--token-file", str(token),
            "--prometheus-url", "http://p", "--config", str(config),
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        f"gpuhealth responder: error: --config {config}: breaker.window: write a unit"
    )
