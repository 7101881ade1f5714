"""The upstream build script (`tools/upstream/build.py`): pins, generated replace blocks, the cache.

Aspects covered: the Kubernetes modules pin exactly the staging modules k8s.io/kubernetes
requires, each to the matching v0.x release, and the committed go.mod files are what the
script generates from upstream's own go.mod; binary names as `go build -o DIR/` writes them;
the cache stamp changes with the module files, so a changed pin builds again; the locator's
error names the command that builds a missing binary.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhealth.testing import upstream

REPO = Path(__file__).resolve().parents[2]
build = upstream._build_script()

UPSTREAM_GO_MOD = """\
module k8s.io/kubernetes

go 1.26.0

require (
\tgithub.com/spf13/pflag v1.0.9
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
)

require k8s.io/kubelet v0.0.0 // indirect

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/kubelet => ./staging/src/k8s.io/kubelet
\tk8s.io/sample-cli-plugin => ./staging/src/k8s.io/sample-cli-plugin
)
"""


def test_the_replace_block_pins_every_required_staging_module_and_only_those() -> None:
    component = build.COMPONENTS["kubernetes-1.37"]
    block = build.replace_block(component, UPSTREAM_GO_MOD)
    lines = [line.strip() for line in block.splitlines() if "=>" in line]
    assert lines == [
        "k8s.io/api => k8s.io/api v0.37.2",
        "k8s.io/client-go => k8s.io/client-go v0.37.2",
        "k8s.io/kubelet => k8s.io/kubelet v0.37.2",
    ]  # sample-cli-plugin is replaced upstream but required by nothing: the proxy need not serve it


def test_each_kubernetes_module_pins_its_own_release_line() -> None:
    for name, staging in (("kubernetes-1.37", "v0.37.2"), ("kubernetes-1.36", "v0.36.5")):
        component = build.COMPONENTS[name]
        assert component.staging_version == staging
        text = (component.folder / "go.mod").read_text()
        assert f"k8s.io/kubernetes {component.module_version}" in text
        pinned = [line.split() for line in text.splitlines() if "=> k8s.io/" in line]
        assert pinned and all(parts[0] == parts[2] and parts[3] == staging for parts in pinned)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("go") is None, reason="the go command reads upstream's go.mod")
def test_the_committed_go_mod_files_are_what_sync_generates() -> None:
    done = subprocess.run(
        [sys.executable, str(build.HERE / "build.py"), "sync", "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("package", "name"),
    [
        ("github.com/prometheus/prometheus/cmd/promtool", "promtool"),
        ("go.etcd.io/etcd/server/v3", "server"),
        ("k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"),
        ("k8s.io/kube-state-metrics/v2", "kube-state-metrics"),
    ],
)
def test_binary_names_follow_go_build(package: str, name: str) -> None:
    assert build._go_binary_name(package) == name


def test_the_stamp_changes_with_the_module_files_and_the_go_version(tmp_path: Path) -> None:
    component = build.COMPONENTS["etcd"]
    moved = dataclasses.replace(component, name="etcd-copy")
    folder = tmp_path / "etcd-copy"
    folder.mkdir()
    for name in ("go.mod", "go.sum"):
        shutil.copy(component.folder / name, folder / name)
    first = _digest_in(folder, moved, "go1.26.8")
    (folder / "go.sum").write_text((folder / "go.sum").read_text() + "example.com/x v1.0.0 h1:AAAA=\n")
    assert _digest_in(folder, moved, "go1.26.8") != first
    assert _digest_in(folder, moved, "go1.27.0") != _digest_in(folder, moved, "go1.26.8")


def _digest_in(folder: Path, component: object, go_version: str) -> str:
    original = build.HERE
    try:
        build.HERE = folder.parent
        digest: str = build.digest(component, go_version)
        return digest
    finally:
        build.HERE = original


def test_a_missing_binary_names_the_command_that_builds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUHEALTH_UPSTREAM_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("GPUHEALTH_ALERTMANAGER", raising=False)
    with pytest.raises(upstream.UpstreamMissing, match=r"tools/upstream/build.py alertmanager"):
        upstream.binary("alertmanager")


def test_an_explicit_override_must_be_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUHEALTH_PROMTOOL", str(tmp_path / "nothing-here"))
    with pytest.raises(upstream.UpstreamMissing, match="GPUHEALTH_PROMTOOL"):
        upstream.binary("promtool")


def test_kubernetes_binaries_are_found_per_minor() -> None:
    assert build.component_of("kube-apiserver", "1.36").version == "v1.36.5"
    assert build.component_of("kube-apiserver").version == "v1.37.2"
    with pytest.raises(KeyError):
        build.component_of("kube-apiserver", "1.35")
