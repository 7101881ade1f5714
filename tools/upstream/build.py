#!/usr/bin/env python3
"""Build the pinned upstream servers from their Go modules, once per machine.

Each folder beside this file is a small Go module that requires one upstream module at a
pinned version and names its commands as `tool` directives; `go.sum` pins every
dependency. Nothing of upstream's source or binaries lives in this repository: the go
command fetches the modules from the module proxy and builds them here.

The binaries land in a cache outside the work tree, one folder per component and version
(`$GPUHEALTH_UPSTREAM_CACHE`, else `$XDG_CACHE_HOME/gpuhealth/upstream`, else
`~/.cache/gpuhealth/upstream`), with a stamp of what built them (the module files, the
link flags, the Go version). A fresh clone, CI and later runs on the same machine find
them there; a changed pin builds again.

    tools/upstream/build.py demo              # what `make demo` runs: prometheus, alertmanager
    tools/upstream/build.py all               # every component (`make test`)
    tools/upstream/build.py kubernetes-1.37   # one component
    tools/upstream/build.py path promtool     # where one binary is (exit 1 when unbuilt)
    tools/upstream/build.py sync [--check]    # regenerate the Kubernetes modules' replace blocks

Standard library only: it runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Component:
    """One upstream Go module and the commands built from it."""

    name: str
    version: str  # the release as its project names it
    module: str
    module_version: str
    binaries: dict[str, str]  # binary name -> package path
    ldflags: tuple[str, ...] = ()
    minutes: int = 1  # a cold build on 2 cores, measured (the progress line says it)
    kubernetes_minor: str = ""  # for the Kubernetes modules: the staging release line
    staging_version: str = ""
    # Files a package embeds that its module zip lacks (a web UI built by npm upstream), as
    # path-in-the-module -> text. Such a component builds from a vendored copy in a temporary
    # folder with these written in; the repository holds neither the copy nor upstream files.
    missing_embeds: dict[str, str] = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        return HERE / self.name


def _kubernetes(minor: str, patch: int, minutes: int) -> Component:
    version = f"v1.{minor}.{patch}"
    staging = f"v0.{minor}.{patch}"
    flags = (
        f"-X k8s.io/component-base/version.gitVersion={version}",
        "-X k8s.io/component-base/version.gitMajor=1",
        f"-X k8s.io/component-base/version.gitMinor={minor}",
        "-X k8s.io/component-base/version.gitTreeState=clean",
        f"-X k8s.io/client-go/pkg/version.gitVersion={version}",
        "-X k8s.io/client-go/pkg/version.gitMajor=1",
        f"-X k8s.io/client-go/pkg/version.gitMinor={minor}",
    )
    return Component(
        name=f"kubernetes-1.{minor}",
        version=version,
        module="k8s.io/kubernetes",
        module_version=version,
        binaries={
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
        },
        ldflags=flags,
        minutes=minutes,
        kubernetes_minor=minor,
        staging_version=staging,
    )


def _prometheus_flags(module: str, version: str) -> tuple[str, ...]:
    return (
        f"-X github.com/prometheus/common/version.Version={version}",
        "-X github.com/prometheus/common/version.Branch=release",
        "-X github.com/prometheus/common/version.BuildUser=gpuhealth",
        f"-X github.com/prometheus/common/version.Revision={module}",
    )


COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        Component(
            name="prometheus",
            version="3.16.0",
            module="github.com/prometheus/prometheus",
            module_version="v0.316.0",
            binaries={
                "prometheus": "github.com/prometheus/prometheus/cmd/prometheus",
                "promtool": "github.com/prometheus/prometheus/cmd/promtool",
            },
            ldflags=_prometheus_flags("v0.316.0", "3.16.0"),
            minutes=6,
        ),
        Component(
            name="alertmanager",
            version="0.35.0",
            module="github.com/prometheus/alertmanager",
            module_version="v0.35.0",
            binaries={
                "alertmanager": "github.com/prometheus/alertmanager/cmd/alertmanager",
                "amtool": "github.com/prometheus/alertmanager/cmd/amtool",
            },
            ldflags=_prometheus_flags("v0.35.0", "0.35.0"),
            minutes=3,
            # ui/web.go embeds app/dist, which upstream's release process builds with npm and
            # the module zip leaves out: the API is all we use, so the UI is a page saying so.
            missing_embeds={
                f"ui/app/dist/{ui}/index.html": "<!doctype html><title>Alertmanager</title>"
                "<p>The web UI is not part of this build (gpuhealth builds the API only).</p>\n"
                for ui in ("elm", "mantine")
            },
        ),
        Component(
            name="etcd",
            version="3.6.16",
            module="go.etcd.io/etcd/server/v3",
            module_version="v3.6.16",
            binaries={"etcd": "go.etcd.io/etcd/server/v3"},
            minutes=2,
        ),
        Component(
            name="helm",
            version="4.3.2",
            module="helm.sh/helm/v4",
            module_version="v4.3.2",
            binaries={"helm": "helm.sh/helm/v4/cmd/helm"},
            ldflags=(
                "-X helm.sh/helm/v4/internal/version.version=v4.3.2",
                "-X helm.sh/helm/v4/internal/version.gitTreeState=clean",
            ),
            minutes=3,  # 2.0 min from an empty build cache on an idle machine (2026-12-06)
        ),
        _kubernetes("37", 2, minutes=12),
        _kubernetes("36", 5, minutes=12),
        Component(
            name="kube-state-metrics",
            version="2.20.0",
            module="k8s.io/kube-state-metrics/v2",
            module_version="v2.20.0",
            binaries={"kube-state-metrics": "k8s.io/kube-state-metrics/v2"},
            ldflags=_prometheus_flags("v2.20.0", "v2.20.0"),
            minutes=2,  # 1.8 min from an empty build cache on an idle machine (2026-12-06)
        ),
    )
}

GROUPS: dict[str, tuple[str, ...]] = {
    "demo": ("prometheus", "alertmanager"),
    "all": tuple(COMPONENTS),
}


def cache_root() -> Path:
    explicit = os.environ.get("GPUHEALTH_UPSTREAM_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuhealth" / "upstream"


def component_of(binary: str, kubernetes: str | None = None) -> Component:
    """The component that builds `binary` (the Kubernetes ones need their minor, "1.37")."""
    for component in COMPONENTS.values():
        if binary not in component.binaries:
            continue
        if component.kubernetes_minor and kubernetes not in (None, f"1.{component.kubernetes_minor}"):
            continue
        return component
    raise KeyError(f"no pinned component builds {binary!r} (kubernetes={kubernetes})")


def install_dir(component: Component) -> Path:
    return cache_root() / f"{component.name}-{component.version}"


def _go_version() -> str:
    try:
        return subprocess.run(
            ["go", "env", "GOVERSION"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "go-missing"


def digest(component: Component, go_version: str | None = None) -> str:
    """What the stamp records: the module files, the flags, the Go version."""
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        path = component.folder / name
        h.update(path.read_bytes() if path.exists() else b"")
    h.update("\n".join(component.ldflags).encode())
    h.update(json.dumps([component.binaries, component.missing_embeds], sort_keys=True).encode())
    h.update((go_version or _go_version()).encode())
    return h.hexdigest()[:16]


def built(component: Component, go_version: str | None = None) -> bool:
    stamp = install_dir(component) / ".stamp"
    if not stamp.exists():
        return False
    if stamp.read_text().strip() != digest(component, go_version):
        return False
    return all((install_dir(component) / b).exists() for b in component.binaries)


def binary_path(binary: str, kubernetes: str | None = None) -> Path:
    return install_dir(component_of(binary, kubernetes)) / binary


def _go_binary_name(package: str) -> str:
    """The file `go build -o DIR/` writes for a package: its last element, a major version skipped."""
    parts = package.rstrip("/").split("/")
    if len(parts) > 1 and re.fullmatch(r"v[0-9]+", parts[-1]):
        return parts[-2]
    return parts[-1]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _vendored(component: Component, staging: Path, env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """A vendored copy of the component's module, in `staging`, with its missing embeds written in."""
    workdir = staging / ".vendored"
    workdir.mkdir()
    for name in ("go.mod", "go.sum"):
        shutil.copy(component.folder / name, workdir / name)
    # -e: go mod vendor itself trips over the embed pattern these files are about to satisfy.
    vendor = subprocess.run(
        ["go", "mod", "vendor", "-e"], cwd=workdir, env=env, capture_output=True, text=True
    )
    if vendor.returncode != 0:
        sys.stderr.write(vendor.stdout + vendor.stderr)
        raise subprocess.CalledProcessError(vendor.returncode, vendor.args)
    for relative, text in component.missing_embeds.items():
        path = workdir / "vendor" / component.module / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return workdir, dict(env, GOFLAGS="-mod=vendor")


def build(component: Component, out: TextIO = sys.stderr) -> Path:
    """Build one component into the cache unless its stamp says it is there already."""
    target = install_dir(component)
    go_version = _go_version()
    if go_version == "go-missing":
        raise SystemExit(
            "tools/upstream: the go command is not installed (Go 1.26 builds the pinned servers)"
        )
    with _locked(cache_root() / f".{component.name}.lock"):
        if built(component, go_version):
            print(f"upstream: {component.name} {component.version} already built ({target})", file=out)
            return target
        names = ", ".join(component.binaries)
        print(
            f"upstream: building {names} {component.version}"
            f" from {component.module}@{component.module_version}"
            f" (first run on this machine: about {component.minutes} min on 2 cores; cached in {target})",
            file=out,
            flush=True,
        )
        started = time.monotonic()
        cache_root().mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{component.name}-", dir=cache_root()))
        staging.chmod(0o755)
        try:
            env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod", GOWORK="off")
            workdir = component.folder
            if component.missing_embeds:
                workdir, env = _vendored(component, staging, env)
            command = [
                "go",
                "build",
                "-trimpath",
                "-ldflags",
                " ".join(("-s", "-w", *component.ldflags)),
                "-o",
                str(staging) + "/",
                *component.binaries.values(),
            ]
            subprocess.run(command, cwd=workdir, env=env, check=True)
            for binary, package in component.binaries.items():
                produced = staging / _go_binary_name(package)
                if produced != staging / binary:
                    produced.rename(staging / binary)
            if workdir != component.folder:
                shutil.rmtree(workdir)
            (staging / ".stamp").write_text(digest(component, go_version) + "\n")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        except subprocess.CalledProcessError as err:
            raise SystemExit(
                f"upstream: building {component.name} failed (exit {err.returncode}); see above"
            ) from None
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        took = time.monotonic() - started
        print(f"upstream: built {names} {component.version} in {took / 60:.1f} min", file=out, flush=True)
        return target


# ---- the Kubernetes modules' replace blocks, generated from k8s.io/kubernetes's go.mod ----

_STAGING = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/src/\1\s*$")
_BEGIN = "// BEGIN generated by tools/upstream/build.py sync: the staging modules k8s.io/kubernetes requires"
_END = "// END generated"


def _upstream_go_mod(component: Component) -> str:
    with tempfile.TemporaryDirectory() as empty:
        result = subprocess.run(
            ["go", "mod", "download", "-json", f"{component.module}@{component.module_version}"],
            cwd=empty,
            env=dict(os.environ, GOWORK="off", GOFLAGS="-mod=mod"),
            capture_output=True,
            text=True,
        )
    info = json.loads(result.stdout or "{}")
    if result.returncode != 0 or "GoMod" not in info:
        raise SystemExit(
            f"upstream: cannot fetch {component.module}@{component.module_version}: "
            f"{info.get('Error', result.stderr)}"
        )
    return Path(info["GoMod"]).read_text()


def required_modules(go_mod: str) -> set[str]:
    required: set[str] = set()
    block = False
    for line in go_mod.splitlines():
        text = line.split("//")[0].strip()
        if text.startswith("require ("):
            block = True
            continue
        if block and text == ")":
            block = False
            continue
        if block and text:
            required.add(text.split()[0])
        elif text.startswith("require "):
            required.add(text.split()[1])
    return required


def replace_block(component: Component, upstream_go_mod: str) -> str:
    """`replace` lines pinning each staging module that k8s.io/kubernetes requires."""
    required = required_modules(upstream_go_mod)
    staged = sorted(m.group(1) for line in upstream_go_mod.splitlines() if (m := _STAGING.match(line)))
    lines = [_BEGIN, "replace ("]
    lines += [
        f"\t{module} => {module} {component.staging_version}" for module in staged if module in required
    ]
    lines += [")", _END]
    return "\n".join(lines)


def render_go_mod(component: Component, upstream_go_mod: str) -> str:
    go_line = next((line for line in upstream_go_mod.splitlines() if line.startswith("go ")), "go 1.26.0")
    tools = "\n".join(f"\t{package}" for package in component.binaries.values())
    return (
        f"// Builds {', '.join(component.binaries)} {component.version} from the module proxy.\n"
        "// k8s.io/kubernetes names its staging modules as v0.0.0 with local replaces; the block below\n"
        "// pins each to its release and is generated: `tools/upstream/build.py sync`.\n"
        f"module gpuhealth.invalid/upstream/{component.name}\n\n"
        f"{go_line}\n\n"
        f"require {component.module} {component.module_version}\n\n"
        f"{replace_block(component, upstream_go_mod)}\n\n"
        f"tool (\n{tools}\n)\n"
    )


def _generated_part(text: str) -> str:
    start, end = text.find(_BEGIN), text.find(_END)
    part = text[start:end] if start >= 0 and end > start else ""
    return "\n".join(line.strip() for line in part.splitlines() if line.strip())


def sync(check: bool) -> int:
    stale = []
    for component in COMPONENTS.values():
        if not component.kubernetes_minor:
            continue
        wanted = render_go_mod(component, _upstream_go_mod(component))
        path = component.folder / "go.mod"
        current = path.read_text() if path.exists() else ""
        pinned = re.search(
            rf"^\s*(require\s+)?{re.escape(component.module)} {re.escape(component.module_version)}\b",
            current,
            re.M,
        )
        if pinned and _generated_part(current) == _generated_part(wanted):
            continue
        if check:
            stale.append(str(path.relative_to(HERE.parent.parent)))
            continue
        component.folder.mkdir(exist_ok=True)
        path.write_text(wanted)
        subprocess.run(
            ["go", "mod", "tidy"], cwd=component.folder, env=dict(os.environ, GOWORK="off"), check=True
        )
        print(f"upstream: wrote {path}", file=sys.stderr)
    if stale:
        print("upstream: stale (run tools/upstream/build.py sync): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/upstream/build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="+", help="demo | all | a component | path BINARY | sync [--check]")
    parser.add_argument("--check", action="store_true", help="with sync: exit 1 when a go.mod is stale")
    parser.add_argument(
        "--kubernetes", help="with path: the Kubernetes minor, e.g. 1.36 (default: the newest)"
    )
    args = parser.parse_args(argv)
    first, rest = args.what[0], args.what[1:]
    if first == "sync":
        return sync(args.check)
    if first == "path":
        if len(rest) != 1:
            parser.error("path takes one binary name")
        try:
            path = binary_path(rest[0], args.kubernetes)
        except KeyError as err:
            parser.error(str(err.args[0]))
        print(path)
        return 0 if built(component_of(rest[0], args.kubernetes)) else 1
    wanted: list[str] = []
    for name in args.what:
        if name in GROUPS:
            wanted += GROUPS[name]
        elif name in COMPONENTS:
            wanted.append(name)
        else:
            parser.error(f"unknown component {name!r}; known: {', '.join([*GROUPS, *COMPONENTS])}")
    started = time.monotonic()
    for name in dict.fromkeys(wanted):
        build(COMPONENTS[name])
    print(
        f"upstream: {len(set(wanted))} component(s) ready in {time.monotonic() - started:.0f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
