"""deploy/generate.py: the committed generated manifests are fresh, and the generator says what is not.

Aspects: `--check` passes on the committed tree; a hand edit, a missing file and a file no
longer generated each fail it, naming the file; the AlertmanagerConfig carries the same routing
as the rendered alertmanager.yaml (receivers, matchers, inhibition), with the token from the
Secret; a matcher the translation cannot read is refused with its text; whatever
`dashboards/*.json` exist become one ConfigMap each (zero today is a valid build), and a file
that is not JSON is refused by name.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploy import generate
from gpuhealth.cliargs import UsageError
from rules import cli as rules_cli
from rules import manifests
from rules.render import DEFAULT_CONFIG
from tests.deploy.manifests import DEPLOY, ROOT, kustomize

SCRIPT = [sys.executable, str(DEPLOY / "generate.py")]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SCRIPT, *args], capture_output=True, text=True, timeout=120, check=False)


def test_the_committed_files_are_fresh() -> None:
    done = _run("--check")
    assert done.returncode == 0, done.stderr
    assert "up to date" in done.stdout


@pytest.fixture
def deploy_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    return copy


def test_check_names_an_edited_a_missing_and_a_leftover_file(deploy_copy: Path, tmp_path: Path) -> None:
    rule = deploy_copy / "components/prometheus-operator/prometheusrule.yaml"
    rule.write_text(rule.read_text().replace("gpuhealth-device.alerts", "edited-by-hand"))
    (deploy_copy / "components/no-operator/alertmanager.yaml").unlink()
    (deploy_copy / "components/no-operator/rules/old.yaml").write_text("groups: []\n")
    done = _run("--check", "--deploy-dir", str(deploy_copy))
    assert done.returncode == 1
    assert "3 generated file(s) under deploy/ are stale" in done.stderr
    assert "components/prometheus-operator/prometheusrule.yaml: 2 line(s) differ" in done.stderr
    assert "components/no-operator/alertmanager.yaml: missing (run `deploy/generate.py`)" in done.stderr
    assert "components/no-operator/rules/old.yaml: not generated any more" in done.stderr
    # Writing repairs all three.
    assert _run("--deploy-dir", str(deploy_copy)).returncode == 0
    assert not (deploy_copy / "components/no-operator/rules/old.yaml").exists()
    assert _run("--check", "--deploy-dir", str(deploy_copy)).returncode == 0


def test_the_alertmanager_config_routes_as_the_rendered_config() -> None:
    files = generate.generate()
    rendered = yaml.safe_load(files["components/no-operator/alertmanager.yaml"])
    crd = yaml.safe_load(files["components/prometheus-operator/alertmanagerconfig.yaml"])["spec"]

    def matchers(entries: list[dict[str, str]]) -> list[str]:
        return [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in entries]

    route, routes = rendered["route"], crd["route"]
    assert routes["receiver"] == route["receiver"] and routes["groupBy"] == route["group_by"]
    assert [
        (r["receiver"], matchers(r.get("matchers", [])), r.get("continue", False)) for r in routes["routes"]
    ] == [(r["receiver"], r.get("matchers", []), r.get("continue", False)) for r in route["routes"]]
    assert [
        (matchers(i["sourceMatch"]), matchers(i["targetMatch"]), i.get("equal")) for i in crd["inhibitRules"]
    ] == [(i["source_matchers"], i["target_matchers"], i.get("equal")) for i in rendered["inhibit_rules"]]
    assert [r["name"] for r in crd["receivers"]] == [r["name"] for r in rendered["receivers"]]
    [responder] = [r for r in crd["receivers"] if r["name"] == "gpuhealth-responder"]
    assert responder["webhookConfigs"][0]["httpConfig"]["authorization"]["credentials"] == {
        "name": "gpuhealth-responder-token",
        "key": "token",
    }


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            'action=~"quarantine|restrict"',
            {"name": "action", "matchType": "=~", "value": "quarantine|restrict"},
        ),
        ('severity = "critical"', {"name": "severity", "matchType": "=", "value": "critical"}),
        ('msg!="say \\"hi\\""', {"name": "msg", "matchType": "!=", "value": 'say "hi"'}),
    ],
)
def test_matchers_translate(text: str, expected: dict[str, str]) -> None:
    assert manifests.parse_matcher(text) == expected


@pytest.mark.parametrize("text", ["action", 'action=="x"', "action=x", '="x"'])
def test_an_unreadable_matcher_is_refused_with_its_text(text: str) -> None:
    with pytest.raises(manifests.ManifestError, match="matcher"):
        manifests.parse_matcher(text)


def test_dashboards_become_configmaps_whatever_exist(tmp_path: Path) -> None:
    boards = tmp_path / "dashboards"
    boards.mkdir()
    tree = tmp_path / "repo"
    shutil.copytree(DEPLOY, tree / "deploy")
    # No dashboards: the component builds and adds nothing.
    assert _run("--deploy-dir", str(tree / "deploy"), "--dashboards", str(boards)).returncode == 0
    assert not list((tree / "deploy/components/dashboards/files").glob("*.json"))
    assert not [
        o for o in kustomize(tree / "deploy/overlays/enforcing") if "dashboard" in o["metadata"]["name"]
    ]
    # Two dashboards: one ConfigMap each, labelled for the sidecar, the JSON unchanged.
    for uid in ("gpu-fleet", "gpu-device"):
        (boards / f"{uid}.json").write_text(json.dumps({"uid": uid, "title": uid, "panels": []}))
    assert _run("--deploy-dir", str(tree / "deploy"), "--dashboards", str(boards)).returncode == 0
    maps = {
        o["metadata"]["name"]: o
        for o in kustomize(tree / "deploy/overlays/enforcing")
        if o["kind"] == "ConfigMap" and "dashboard" in o["metadata"]["name"]
    }
    assert sorted(maps) == ["gpuhealth-dashboard-gpu-device", "gpuhealth-dashboard-gpu-fleet"]
    fleet = maps["gpuhealth-dashboard-gpu-fleet"]
    assert fleet["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(fleet["data"]["gpu-fleet.json"])["uid"] == "gpu-fleet"
    # A dashboard removed from dashboards/ is removed here too.
    (boards / "gpu-device.json").unlink()
    assert _run("--deploy-dir", str(tree / "deploy"), "--dashboards", str(boards)).returncode == 0
    assert [p.name for p in (tree / "deploy/components/dashboards/files").iterdir()] == ["gpu-fleet.json"]


def test_a_dashboard_that_is_not_json_is_refused_by_name(tmp_path: Path) -> None:
    boards = tmp_path / "dashboards"
    boards.mkdir()
    (boards / "broken.json").write_text("{not json")
    done = _run("--check", "--dashboards", str(boards))
    assert done.returncode == 2
    assert "broken.json: not a JSON dashboard" in done.stderr


def test_the_generator_runs_from_any_directory(tmp_path: Path) -> None:
    done = subprocess.run(
        [*SCRIPT, "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr
    assert str(ROOT) not in done.stdout


def test_the_crds_path_and_phase_enums_are_the_products_declarations() -> None:
    crd = (DEPLOY / generate.CRD).read_text(encoding="utf-8")
    paths = ", ".join(generate.Enforcer(None, None).paths)
    stale = crd.replace(f"enum: [{paths}]", "enum: [dra]").replace(", Released, Abandoned]", "]")
    assert stale != crd
    assert generate.crd_enums(stale) == crd  # what a new backend or rung changes, rewritten
    schema = yaml.safe_load(crd)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert schema["spec"]["properties"]["path"]["enum"] == list(generate.Enforcer(None, None).paths)
    with pytest.raises(generate.GenerateError, match="`path` string property with an enum, found 0"):
        generate.crd_enums(crd.replace(f"enum: [{paths}]", "minLength: 1"))


def test_the_packaged_command_renders_the_committed_objects_for_an_overlay(tmp_path: Path) -> None:
    """`gpuhealth rules render --format prometheusrule|no-operator` (the documented tuning route,
    no checkout needed) writes what deploy/generate.py commits for the same configuration. The
    command runs once as a user types it; the other formats through its function (an import of
    the whole command costs seconds on a loaded machine)."""
    done = subprocess.run(
        [sys.executable, "-m", "gpuhealth", "rules", "render", "--format", "prometheusrule"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    emitted = {d["kind"]: d for d in yaml.safe_load_all(done.stdout)}
    operator = DEPLOY / "components/prometheus-operator"
    for kind, name in (("PrometheusRule", "prometheusrule"), ("AlertmanagerConfig", "alertmanagerconfig")):
        assert emitted[kind] == yaml.safe_load((operator / f"{name}.yaml").read_text()), kind
    args = argparse.Namespace(
        config=DEFAULT_CONFIG, format="no-operator", out=tmp_path, check=False, prog="gpuhealth rules render"
    )
    assert rules_cli.run_render(args) == 0
    committed = DEPLOY / "components/no-operator"
    for path in sorted(p for p in tmp_path.rglob("*.yaml")):
        relative = path.relative_to(tmp_path)
        assert yaml.safe_load(path.read_text()) == yaml.safe_load((committed / relative).read_text()), (
            relative
        )
    assert len(list(tmp_path.rglob("*.yaml"))) == len(list((committed / "rules").glob("*.yaml"))) + 2
    with pytest.raises(UsageError, match="--out"):
        rules_cli.run_render(argparse.Namespace(**{**vars(args), "out": None}))
