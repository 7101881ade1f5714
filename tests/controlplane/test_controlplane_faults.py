"""Faults of the real control plane: a component restarted, etcd compacted (`ControlPlane.restart`,
`ControlPlane.compact_etcd`), as `gpuhealth chaos --control-plane real` injects them.

Aspects: each of etcd, kube-apiserver, kube-controller-manager and kube-scheduler restarts as a
new process with the same argv (kube-apiserver on the same port: the admin kubeconfig written at
the start still works), ready again, every other component the same process as before (but for
kube-controller-manager, started again when it exited meanwhile, and then named), and
what was written before an etcd restart is still there; a component not running is refused by
name. The 410 proof, on kube-apiserver 1.37: a watch resumed from a resourceVersion held before
a restart gets 410 Gone (the new watch cache starts past it), though etcd still serves that
version to an exact list; a compaction alone leaves both served (the watch cache has them);
after a compaction and a restart, the resumed watch and the exact list both get 410, and
etcd itself refuses the compacted revision.

Each test starts its own control plane: restarts would disturb the session's shared one.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.errors import Gone
from gpuhealth.kube.resources import NAMESPACE, Resource
from simulator.controlplane import ControlPlane, ControlPlaneError, ControlPlaneSettings
from simulator.controlplane.etcd import COMPACTED
from tests.controlplane.conftest import require_builds
from tests.support.controlplane import admin, kubectl

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

CONFIGMAPS = Resource("", "v1", "configmaps", namespaced=True)
NS = "faults"
LABEL = ("gpuhealth.io/test", "faults")
SELECTOR = "=".join(LABEL)
"""The test's own ConfigMaps: kube-controller-manager adds its `kube-root-ca.crt` to the namespace
whenever it gets to it, and a revived one does that late."""


@pytest.fixture
def own_plane(tmp_path: Path) -> Iterator[ControlPlane]:
    require_builds("1.37")
    with ControlPlane(ControlPlaneSettings(workdir=tmp_path / "controlplane")) as plane:
        yield plane


def _configmap(client: KubeClient, name: str) -> str:
    """Create ConfigMap `name` in NS; the resourceVersion of a list right after it."""
    metadata = {"name": name, "namespace": NS, "labels": dict([LABEL])}
    client.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata})
    return client.list(CONFIGMAPS, namespace=NS, label_selector=SELECTOR).resource_version


def _resumed(client: KubeClient, version: str) -> list[str] | Gone:
    """The names a watch of NS's ConfigMaps resumed from `version` delivers within 2 s, or its 410."""
    try:
        with client.watch(
            CONFIGMAPS, namespace=NS, resource_version=version, label_selector=SELECTOR, timeout_seconds=2
        ) as stream:
            return [event.object["metadata"]["name"] for event in stream]
    except Gone as gone:
        return gone


def _exact_list(plane: ControlPlane, version: str) -> tuple[int, str]:
    """An exact list of NS's ConfigMaps at `version` with kubectl: (exit status, its output)."""
    path = (
        f"/api/v1/namespaces/{NS}/configmaps?labelSelector={LABEL[0]}%3D{LABEL[1]}"
        f"&resourceVersion={version}&resourceVersionMatch=Exact"
    )
    done = kubectl(plane, "get", "--raw", path)
    return done.returncode, done.stdout + done.stderr


def test_each_component_restarts_as_it_was_and_the_others_run_on(own_plane: ControlPlane) -> None:
    client = admin(own_plane)
    try:
        client.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        _configmap(client, "before")
    finally:
        client.close()
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        before = own_plane.pids()
        argv = {c.name: list(c.argv) for c in own_plane.components}
        revived = len(own_plane.revived)
        took = own_plane.restart(name)
        after = own_plane.pids()
        assert after[name] != before[name], name
        # The others are the same processes, but for one that exited meanwhile and was started
        # again: kube-controller-manager does when the apiserver goes while it builds its controllers.
        others = {k for k in after if k != name and after[k] != before[k]}
        assert others == set(own_plane.revived[revived:]) <= {"kube-controller-manager"}, others
        assert {c.name: c.argv for c in own_plane.components} == argv  # ports, files, flags: as they were
        assert 0 < took < own_plane.settings.start_timeout_seconds
        own_plane.check_running()
        # The kubeconfig written at the start: the apiserver is where it was, and etcd kept the data.
        answer = kubectl(own_plane, "get", "configmap", "before", "-n", NS, "-o", "jsonpath={.metadata.name}")
        assert (answer.returncode, answer.stdout) == (0, "before"), (
            f"after restarting {name}: {answer.stderr}"
        )
    with pytest.raises(ControlPlaneError, match="no component 'kubelet' to restart"):
        own_plane.restart("kubelet")


def test_a_compaction_then_an_apiserver_restart_gives_every_older_resource_version_410(
    own_plane: ControlPlane,
) -> None:
    client = admin(own_plane)
    try:
        client.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        held = _configmap(client, "a")
        _configmap(client, "a2")
    finally:
        client.close()

    # A restart alone: the new watch cache starts past `held`, but etcd still has it.
    own_plane.restart("kube-apiserver")
    client = admin(own_plane)
    try:
        gone = _resumed(client, held)
        assert isinstance(gone, Gone) and "too old resource version" in str(gone), gone
        status, text = _exact_list(own_plane, held)
        assert status == 0 and [i["metadata"]["name"] for i in json.loads(text)["items"]] == ["a"], text

        held = _configmap(client, "b")
        _configmap(client, "b2")
        revision = own_plane.compact_etcd()
        assert revision > int(held)
        # A compaction alone: the running apiserver's watch cache still serves `held`.
        assert _resumed(client, held) == ["b2"]
        assert _exact_list(own_plane, held)[0] == 0
    finally:
        client.close()
    # etcd itself no longer has any revision before the compaction.
    request = urllib.request.Request(
        f"{own_plane.etcd_url}/v3/kv/range",
        data=json.dumps({"key": "AA==", "revision": str(int(held))}).encode(),
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            refused = answer.read().decode()
    except urllib.error.HTTPError as exc:
        refused = exc.read().decode()
    assert COMPACTED in refused, refused

    # A compaction, then a restart: nothing can serve `held` any more; every client lists again.
    own_plane.restart("kube-apiserver")
    client = admin(own_plane)
    try:
        gone = _resumed(client, held)
        assert isinstance(gone, Gone) and "too old resource version" in str(gone), gone
        status, text = _exact_list(own_plane, held)
        assert status != 0 and "The resourceVersion for the provided list is too old" in text, text
        listed = client.list(CONFIGMAPS, namespace=NS, label_selector=SELECTOR)
        assert sorted(i["metadata"]["name"] for i in listed.items) == ["a", "a2", "b", "b2"]
        assert int(listed.resource_version) >= revision
    finally:
        client.close()
