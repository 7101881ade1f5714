"""The simulated node runs DCGM's diagnostic as its image would (simulator.fleet.programs).

Aspects: the probe's pod as gpuhealth builds it (its diagnostic's init container starting a
hostengine, its judge container) runs both for real, in order: it passes on a GPU that stays
healthy, with the report in DCGM's JSON shape judged by the product's own judge, and fails on a
GPU that broke during the diagnostic or has a failing DCGM health watch; no hostengine, no pass:
`dcgmi diag` as a container's command in DCGM's image fails (exit 255, no report), as does the
probe's pod told of a hostengine elsewhere that nothing answers; `dcgmi` in an image without it
cannot start; a failing init container fails the pod (restartPolicy Never) and its containers
never start; the stand-ins read the container's GPUs and mount paths as the runtime gives them.
"""

from __future__ import annotations

from typing import Any

from responder.checks.probe_pod import DIAG_COMMAND, DiagSettings, diag_pod
from simulator.apiserver.store import Store
from simulator.fleet import Fleet, programs
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import DeviceRef, Fault
from tests.simulator.test_kubelet_pods import api_pod, create, dp, get  # noqa: F401 (the fixture)

DCGM = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"


def probe_pod(name: str, uuid: str, **diag: Any) -> dict[str, Any]:
    """The probe's pod as gpuhealth's check runner builds it, exposing `uuid` as the runtime does."""
    request = {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": uuid}]}
    settings = DiagSettings(judge_image="gpuhealth", **diag)
    spec = diag_pod(DCGM, DIAG_COMMAND, "probe", settings, uuid, request)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {**spec, "nodeName": "n-0"},
    }


def outcome(store: Store, name: str) -> tuple[str, int | None, int | None]:
    """The pod's phase, its init container's exit code and its container's (None: not run)."""
    status = get(store, name)["status"]

    def code(statuses: list[dict[str, Any]] | None) -> int | None:
        terminated = ((statuses or [{}])[0].get("state") or {}).get("terminated")
        return None if terminated is None else terminated["exitCode"]

    return status["phase"], code(status.get("initContainerStatuses")), code(status.get("containerStatuses"))


async def test_the_probe_pod_passes_on_a_healthy_gpu(dp: tuple[Fleet, Store]) -> None:  # noqa: F811
    fleet, store = dp
    await create(store, probe_pod("probe-good", gpu_uuid("n-0", 2)))
    await fleet.advance(1.5)
    status = get(store, "probe-good")["status"]
    assert status["phase"] == "Pending"
    assert "running" in status["initContainerStatuses"][0]["state"]  # the diagnostic runs first
    assert status["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    await fleet.advance(15)
    assert outcome(store, "probe-good") == ("Succeeded", 0, 0)


async def test_the_probe_pod_fails_on_a_gpu_that_broke_during_the_diagnostic(
    dp: tuple[Fleet, Store],  # noqa: F811
) -> None:
    fleet, store = dp
    await create(store, probe_pod("probe-bad", gpu_uuid("n-0", 3)))
    await fleet.advance(3)
    fleet.inject(Fault(at=fleet.now(), kind="device-unhealthy", device=DeviceRef("n-0", 3), duration=2.0))
    await fleet.advance(15)
    # The diagnostic ran and wrote its report (init exit 0); the judge read a Fail in it.
    assert outcome(store, "probe-bad") == ("Failed", 0, 1)


async def test_the_probe_pod_fails_on_a_gpu_dcgm_fails(dp: tuple[Fleet, Store]) -> None:  # noqa: F811
    fleet, store = dp
    fleet.inject(Fault(at=fleet.now(), kind="health-watch", device=DeviceRef("n-0", 1), watch="PCIE"))
    await fleet.advance(1)
    await create(store, probe_pod("probe-watch", gpu_uuid("n-0", 1)))
    await fleet.advance(15)
    assert outcome(store, "probe-watch") == ("Failed", 0, 1)


async def test_no_hostengine_no_pass(dp: tuple[Fleet, Store]) -> None:  # noqa: F811
    fleet, store = dp
    uuid = gpu_uuid("n-0", 2)
    # What the probe ran before: dcgmi as the container's command. Nothing started a hostengine.
    bare = api_pod("dcgmi-alone", gpus=0, command=["dcgmi", "diag", "-r", "2"])
    bare["spec"]["containers"][0].update(image=DCGM, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": uuid}])
    await create(store, bare)
    # The probe told of a hostengine elsewhere (the GPU operator's, not modelled): none answers.
    await create(
        store, probe_pod("probe-remote", uuid, hostengine="nvidia-dcgm.gpu-operator.svc:5555", wait_seconds=5)
    )
    await fleet.advance(15)
    status = get(store, "dcgmi-alone")["status"]
    assert status["phase"] == "Failed"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == programs.NO_HOST_EXIT
    assert outcome(store, "probe-remote") == ("Failed", 0, 1)


async def test_dcgmi_in_an_image_without_it_cannot_start(dp: tuple[Fleet, Store]) -> None:  # noqa: F811
    fleet, store = dp
    body = api_pod("busybox-dcgmi", gpus=0, command=["dcgmi", "diag", "-r", "2"])
    await create(store, body)
    await fleet.advance(3)
    status = get(store, "busybox-dcgmi")["status"]
    assert status["phase"] == "Failed"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 128


async def test_a_failing_init_container_fails_the_pod_and_its_containers_never_start(
    dp: tuple[Fleet, Store],  # noqa: F811
) -> None:
    fleet, store = dp
    body = probe_pod("init-fails", gpu_uuid("n-0", 0))
    body["spec"]["initContainers"][0]["command"] = ["/bin/sh", "-c", "exit 3"]
    await create(store, body)
    await fleet.advance(15)
    status = get(store, "init-fails")["status"]
    assert outcome(store, "init-fails") == ("Failed", 3, None)
    assert status["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}


def test_the_stand_ins_follow_the_containers_gpus_and_mounts() -> None:
    spec = {"volumes": [{"name": "results", "emptyDir": {}}]}
    sandbox = programs.Sandbox(spec)
    try:
        writer = {
            "name": "w",
            "image": DCGM,
            "command": [
                "/bin/sh",
                "-c",
                'nv-hostengine; sleep 2; dcgmi diag -r 2 -j -i "$GPU" > "$OUT/r.json"',
            ],
            "env": [{"name": "GPU", "value": "GPU-b"}, {"name": "OUT", "value": "/results"}],
            "volumeMounts": [{"name": "results", "mountPath": "/results"}],
        }
        gpus = (programs.Gpu("GPU-a"), programs.Gpu("GPU-b", "GPU GPU-b requires a reset"))
        assert sandbox.run(writer, gpus) == programs.DIAG_ERROR_EXIT
        report = (sandbox.root / "volumes" / "results" / "r.json").read_text()
        assert '"entity_id": 1' in report and '"entity_id": 0' not in report  # -i: only GPU-b
        assert "GPU GPU-b requires a reset" in report
        # An argument naming a mount path is the runtime's folder (no mount namespace here).
        reader = {
            "name": "r",
            "image": "gpuhealth",
            "command": ["python", "-c", "import sys; sys.exit(7 if open(sys.argv[1]).read() else 0)"],
            "args": ["/results/r.json"],
            "volumeMounts": [{"name": "results", "mountPath": "/results"}],
        }
        assert sandbox.run(reader, ()) == 7
    finally:
        sandbox.close()
    assert not sandbox.root.exists()
