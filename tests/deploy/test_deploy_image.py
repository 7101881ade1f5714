"""The Dockerfile and the manifests agree on how the one image is started (no Docker here).

Aspects: the image's entry point is the `gpuhealth` console script the package declares, and no
manifest overrides it (`command`), so each container's `args` go to that script; every
container's first argument is a subcommand the script accepts; the image copies exactly the
packages setuptools packs, none of the harness (simulator, demo, bench, dashboards, the loopback
servers of gpuhealth.testing), and its build context admits them and leaves the loopback servers out;
the default user is non-root and is the one the responder's pod runs as.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from typing import Any

import pytest

from gpuhealth_cli.main import build_parser
from tests.deploy.manifests import OVERLAYS, ROOT, build

DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
HARNESS = {"simulator", "demo", "bench", "dashboards", "tests", "tools", "deploy"}
"""Top-level directories of the checkout that are no part of the product."""


def _instructions(name: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+(.+)$", DOCKERFILE, re.MULTILINE)]


def _containers(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (o["metadata"]["name"], c)
        for o in objects
        if o["kind"] in ("DaemonSet", "Deployment")
        for c in o["spec"]["template"]["spec"]["containers"]
    ]


def test_the_entry_point_is_the_console_script() -> None:
    [entry] = _instructions("ENTRYPOINT")
    assert json.loads(entry) == ["gpuhealth"]
    assert "gpuhealth" in PYPROJECT["project"]["scripts"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_manifests_pass_args_to_the_entry_point(overlay: str) -> None:
    containers = _containers(build(overlay))
    assert containers
    for name, spec in containers:
        assert "command" not in spec, f"{name}: `command` would replace the image's entry point"
        assert spec["image"].startswith("ghcr.io/gpuhealth/gpuhealth:"), f"{name}: {spec['image']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_containers_args_parse_as_the_cli_accepts_them(overlay: str) -> None:
    """Each container's args, downward-API variables filled in, parse with gpuhealth's own parser."""
    parser = build_parser()
    subcommands = set()
    for name, spec in _containers(build(overlay)):
        args = [re.sub(r"\$\((\w+)\)", "value-of-\\1", a) for a in spec["args"]]
        try:
            parsed = parser.parse_args(args)
        except SystemExit as exc:  # argparse's way of refusing
            raise AssertionError(f"{name}: gpuhealth refuses {args}") from exc
        assert callable(parsed.func), name
        subcommands.add(parsed.command)
    assert subcommands == {"exporter", "responder"}


def test_the_image_holds_the_product_s_packages_and_nothing_of_the_harness() -> None:
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    packed = {p.rstrip("*").split(".")[0] for p in find["include"]}
    copied = {
        source.rstrip("/")
        for c in _instructions("COPY")
        if not c.startswith("--from")
        for source in c.split()[:-1]
    }
    assert copied - {"pyproject.toml", "README.md"} == packed
    assert not packed & HARNESS, packed
    assert find["exclude"] == ["gpuhealth.testing*"]
    for source in sorted(copied):
        assert _in_build_context(source), f"{source} is copied but .dockerignore leaves it out"
        assert (ROOT / source).exists(), source
    assert not _in_build_context("gpuhealth/testing"), "the loopback servers are in the build context"


def _in_build_context(path: str) -> bool:
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    admitted = False
    for pattern in [line for line in ignore if line and not line.startswith("#")]:
        if fnmatch.fnmatch(path, pattern.lstrip("!").rstrip("/")):  # later lines win, as in Docker
            admitted = pattern.startswith("!")
    return admitted


def test_the_default_user_is_the_responders_non_root_user() -> None:
    [user] = _instructions("USER")
    uid, _, gid = user.partition(":")
    assert int(uid) != 0
    deployment = next(
        o
        for o in build("enforcing")
        if o["metadata"]["name"] == "gpuhealth-responder" and o["kind"] == "Deployment"
    )
    context = deployment["spec"]["template"]["spec"]["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == (int(uid), int(gid))
