"""`pip install .` with no extras gives the product, and only the product.

Aspects: in a fresh virtual environment (no system site-packages), a plain install of the
checkout gives the `gpuhealth` and `kubectl-gpuhealth` console scripts and `python -m
gpuhealth`; every product command (`exporter`, `devices`, `rules`, `responder`, `quarantine`,
`breaker`, `backtest`, the plugin's `devices`, `quarantine`, `breaker`) answers `--help`; `gpuhealth rules
render --check` finds the installed rule files fresh, and `--format prometheusrule` renders an edited
copy of the installed settings; an operator command that reaches for a
cluster it cannot read fails with one error line, not a traceback (the Kubernetes client stack
imports without the harness). The harness is absent: its commands are not listed, and typed
anyway say they are not part of this installation (exit 2), as do its exporter sources
(`--nvml sim:URL`, `--pod-resources sim:URL`); `simulator`, `demo`, `bench`,
`dashboards`, `gpuhealth.testing` and the harness's third-party dependencies
(kubernetes-validate, jsonpatch, grafana-foundation-sdk, rich) do not import.

The install reads a copy of the files git tracks or would track (uncommitted work included), as
a fresh clone has them: a `build/` left behind by an earlier build would otherwise ride into the
wheel. The product's dependencies come from PyPI through pip's cache, as for `make setup`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

INSTALL_SECONDS = 600
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # The first test also pays for the install (a build and about 35 wheels), and every
    # command below is a fresh interpreter importing the product: minutes on a loaded machine.
    pytest.mark.timeout(INSTALL_SECONDS + 300),
]

ROOT = Path(__file__).resolve().parents[2]

PRODUCT_COMMANDS = [
    ["exporter"],
    ["devices"],
    ["rules"],
    ["rules", "render"],
    ["responder"],
    ["quarantine"],
    ["quarantine", "list"],
    ["breaker"],
    ["backtest"],
]
HARNESS_COMMANDS = ["sim", "demo", "chaos", "dashboards"]
HARNESS_MODULES = [
    "simulator",
    "demo",
    "bench",
    "dashboards",
    "gpuhealth.testing",
    "kubernetes_validate",
    "jsonpatch",
    "grafana_foundation_sdk",
    "rich",
]


@dataclass(frozen=True)
class Installed:
    bin: Path
    cwd: Path
    """Outside the checkout, so nothing imports from it by accident."""

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        return subprocess.run(
            [*argv], cwd=self.cwd, env=env, capture_output=True, text=True, timeout=120, check=False
        )

    def gpuhealth(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin / "gpuhealth"), *args)


def checkout_copy(into: Path) -> Path:
    """The files a clone would hold (tracked, or untracked and not ignored), copied to `into`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not there to copy
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("install")
    source = checkout_copy(base / "gpuhealth")
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)],
        capture_output=True,
        text=True,
        timeout=INSTALL_SECONDS,
        check=False,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    work = base / "elsewhere"
    work.mkdir()
    yield Installed(env_dir / "bin", work)


def test_the_product_s_commands_run_from_the_installed_copy(installed: Installed) -> None:
    top = installed.gpuhealth("--help")
    assert top.returncode == 0, top.stderr
    for name in ("exporter", "devices", "rules", "responder", "quarantine", "breaker", "backtest"):
        assert f"\n    {name} " in top.stdout, (name, top.stdout)
    for argv in PRODUCT_COMMANDS:
        result = installed.gpuhealth(*argv, "--help")
        assert result.returncode == 0 and result.stdout.startswith("usage: gpuhealth"), (argv, result.stderr)
    module = installed.run(str(installed.bin / "python"), "-m", "gpuhealth", "--version")
    assert module.returncode == 0 and module.stdout.startswith("gpuhealth "), module.stderr
    plugin = installed.run(str(installed.bin / "kubectl-gpuhealth"), "--help")
    assert plugin.returncode == 0 and "usage: kubectl gpuhealth" in plugin.stdout, plugin.stderr
    for command in ("devices", "quarantine", "breaker"):
        result = installed.run(str(installed.bin / "kubectl-gpuhealth"), command, "--help")
        assert result.returncode == 0, (command, result.stderr)


def test_the_installed_rule_files_are_a_fresh_render_of_the_installed_config(installed: Installed) -> None:
    check = installed.gpuhealth("rules", "render", "--check")
    assert check.returncode == 0, check.stderr
    assert "match a fresh render" in check.stdout and "site-packages/rules" in check.stdout, check.stdout


def test_the_installed_command_renders_an_operators_rules_for_the_cluster(installed: Installed) -> None:
    """The tuning route without a checkout (docs/operations.md, "Tune the rules"): the installed
    config, edited, rendered as the PrometheusRule and AlertmanagerConfig of an overlay."""
    python = str(installed.bin / "python")
    where = installed.run(python, "-c", "import rules.render as r; print(r.DEFAULT_CONFIG)")
    assert where.returncode == 0 and "site-packages/rules" in where.stdout, where
    shipped = Path(where.stdout.strip()).read_text()
    mine = installed.cwd / "rules-config.yaml"
    mine.write_text(shipped.replace("  unhealthy_for: 1m\n", "  unhealthy_for: 3m\n", 1))
    result = installed.gpuhealth("rules", "render", "--config", str(mine), "--format", "prometheusrule")
    assert result.returncode == 0, result.stderr
    assert "kind: PrometheusRule" in result.stdout and "kind: AlertmanagerConfig" in result.stdout
    assert "for: 3m" in result.stdout


def test_an_operator_command_without_a_cluster_fails_with_one_line(installed: Installed) -> None:
    missing = installed.cwd / "no-such-kubeconfig"
    result = installed.gpuhealth("quarantine", "list", "--kubeconfig", str(missing))
    assert result.returncode in (1, 2), result
    assert result.stderr.startswith("gpuhealth quarantine list: error: "), result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr


def test_the_harness_is_not_installed(installed: Installed) -> None:
    top = installed.gpuhealth("--help")
    for name in HARNESS_COMMANDS:
        assert f"\n    {name} " not in top.stdout, name
        refused = installed.gpuhealth(name, "--help")
        assert refused.returncode == 2, (name, refused)
        assert refused.stderr == (
            f"gpuhealth {name}: error: not part of this installation: `gpuhealth {name}` belongs to the "
            "test harness, which only a source checkout holds (run `make setup` there)\n"
        )
    assert f"Not in this installation: {', '.join(HARNESS_COMMANDS)}" in top.stdout
    # The harness's exporter sources likewise: refused with the reason, before anything starts.
    for flag in ("--nvml", "--pod-resources"):
        refused = installed.gpuhealth("exporter", "--node", "n", flag, "sim:http://127.0.0.1:1")
        assert refused.returncode == 2, (flag, refused)
        # A flag's value argparse refuses comes after the usage, as for any bad flag.
        error = refused.stderr.splitlines()[-1]
        assert error.startswith("gpuhealth exporter: error: "), refused.stderr
        assert "sim: sources need the gpuhealth test harness (simulator package)" in error
        assert "Traceback" not in refused.stderr, refused.stderr
    python = str(installed.bin / "python")
    attempt = (
        "import importlib, json, sys\n"
        "found = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        found[name] = exc.name\n"
        "    else:\n"
        "        found[name] = None\n"
        "print(json.dumps(found))\n"
    )
    result = installed.run(python, "-c", attempt, *HARNESS_MODULES)
    assert result.returncode == 0, result.stderr
    # Each is missing itself (or, for gpuhealth.testing, its own subpackage), not something it needs.
    assert json.loads(result.stdout) == {name: name for name in HARNESS_MODULES}
    # The same interpreter imports the product, from the venv: the failures above are absence,
    # not a broken venv, and nothing comes from the checkout.
    product = installed.run(
        python,
        "-c",
        "import exporter.cli, responder.cli, rules.render, kubectl_gpuhealth.cli; print(rules.__file__)",
    )
    assert product.returncode == 0, product.stderr
    assert product.stdout.startswith(str(installed.bin.parent / "lib")), product.stdout
