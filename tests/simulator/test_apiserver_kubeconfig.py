"""The kubeconfig writer: the official client's loader accepts what it writes.

Aspects: server URL, context and namespace; the token lands where the client reads it; the file is
private (0600) because it may carry a token; rewriting replaces the file whole.
"""

from __future__ import annotations

import stat
from pathlib import Path

import yaml
from kubernetes import client, config

from simulator.apiserver.kubeconfig import write_kubeconfig


def test_load_kube_config_accepts_it_with_a_token(tmp_path: Path) -> None:
    path = tmp_path / "sim" / "kubeconfig"
    write_kubeconfig(path, "http://127.0.0.1:8123", token="t0ken", context="sim-a")
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=cfg)
    assert cfg.host == "http://127.0.0.1:8123"
    assert cfg.api_key == {"BearerToken": "Bearer t0ken"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    contexts, active = config.list_kube_config_contexts(config_file=str(path))
    assert active["name"] == "sim-a" and active["context"]["namespace"] == "default"
    assert [c["name"] for c in contexts] == ["sim-a"]


def test_without_a_token_and_rewriting(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    write_kubeconfig(path, "http://127.0.0.1:1", token="old")
    write_kubeconfig(path, "http://127.0.0.1:2")
    doc = yaml.safe_load(path.read_text())
    assert doc["clusters"][0]["cluster"]["server"] == "http://127.0.0.1:2"
    assert doc["users"][0]["user"] == {}
    assert not list(tmp_path.glob("*.tmp"))
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=cfg)
    assert cfg.host == "http://127.0.0.1:2"
