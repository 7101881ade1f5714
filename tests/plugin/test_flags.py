"""How the plugin picks its namespace, as kubectl does (`kubectl_gpuhealth.flags`,
`gpuhealth.kube.config.context_namespace`).

Aspects: `-A` is every namespace and overrides `-n`; `-n` beats the context; the named context's
namespace beats the current one's; a context without a namespace, or no kubeconfig at all, is
`default`; a kubeconfig given as a list of files is merged (the first file's current context
wins, contexts found in any of them); inside a Pod without a kubeconfig, the service account's
namespace; a context the kubeconfig lacks and an unreadable kubeconfig are usage errors; the
parser accepts kubectl's spellings and its usage begins `kubectl gpuhealth`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from gpuhealth.cliargs import UsageError
from gpuhealth.kube.config import context_namespace, kubectl_current_context
from kubectl_gpuhealth.cli import build_parser
from kubectl_gpuhealth.flags import resolve_namespace


def kubeconfig(path: Path, current: str, contexts: dict[str, str | None]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": current,
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {
                        "name": name,
                        "context": {"cluster": "c", "user": "u", **({"namespace": ns} if ns else {})},
                    }
                    for name, ns in contexts.items()
                ],
            }
        )
    )
    return path


def args(config: Path | str | None, *flags: str) -> argparse.Namespace:
    argv = ["devices", *flags]
    if config is not None:
        argv += ["--kubeconfig", str(config)]
    return build_parser().parse_args(argv)


def test_resolution_order(tmp_path: Path) -> None:
    config = kubeconfig(tmp_path / "k", "team", {"team": "inference", "plain": None, "lab": "research"})
    assert resolve_namespace(args(config)) == "inference"
    assert resolve_namespace(args(config, "--context", "lab")) == "research"
    assert resolve_namespace(args(config, "--context", "plain")) == "default"
    assert resolve_namespace(args(config, "-n", "tenants", "--context", "lab")) == "tenants"
    assert resolve_namespace(args(config, "--namespace", "tenants")) == "tenants"
    assert resolve_namespace(args(config, "-A", "-n", "tenants")) is None
    assert resolve_namespace(args(config, "--all-namespaces")) is None


def test_a_list_of_kubeconfig_files_is_merged_the_first_current_context_winning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = kubeconfig(tmp_path / "a", "lab", {"plain": None})
    second = kubeconfig(tmp_path / "b", "plain", {"lab": "research"})
    listed = f"{first}:{second}"
    # kubectl takes the first file's current context; the official client would take the last.
    assert kubectl_current_context(listed) == "lab"
    assert context_namespace(listed, kubectl_current_context(listed)) == "research"
    monkeypatch.setenv("KUBECONFIG", listed)
    assert kubectl_current_context() == "lab"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    assert kubectl_current_context() is None


def test_in_a_pod_without_kubeconfig_the_service_account_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes.config import kube_config

    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "none"))
    account = tmp_path / "namespace"
    account.write_text("gpuhealth-system\n")
    assert context_namespace(in_cluster_file=str(account)) == "gpuhealth-system"
    assert context_namespace(in_cluster_file=str(tmp_path / "absent")) is None


def test_a_missing_context_or_kubeconfig_is_a_usage_error(tmp_path: Path) -> None:
    config = kubeconfig(tmp_path / "k", "team", {"team": "inference"})
    with pytest.raises(UsageError, match="context 'elsewhere' does not exist"):
        resolve_namespace(args(config, "--context", "elsewhere"))
    with pytest.raises(UsageError, match="cannot load the kubeconfig"):
        resolve_namespace(args(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("argv", "usage", "error"),
    [
        (["quarantine", "list", "-o", "xml"], "kubectl gpuhealth quarantine list ", "argument -o/--output"),
        (["breaker", "reset", "--actor", "me"], "kubectl gpuhealth breaker reset ", "required: --reason"),
        (["devices", "--bogus"], "kubectl gpuhealth ", "unrecognized arguments: --bogus"),
    ],
)
def test_usage_begins_with_kubectl_gpuhealth(
    capsys: pytest.CaptureFixture[str], argv: list[str], usage: str, error: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {usage}")
    assert f"{usage.strip()}: error: " in err and error in err
