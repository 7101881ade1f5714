"""The `gpuhealth exporter` offline mode and the `gpuhealth devices` command.

Aspects covered: a kubectl dump (List of mixed kinds, or a PodList) printed as metrics
with both allocation paths resolved, and split by `--shard`/`--total-shards` (each node's
devices printed by one shard; shard flags out of range or in node mode refused), a
slice-health driver's held devices read from its taints; bad dumps and bad flags give a
clear error prefixed `gpuhealth <cmd>: error:` and exit code 2, never a traceback; a taken
port is a run-time failure (exit 1), and so is an observer that dies; the devices table (status age, truncated
message, pods), its filters, wide, JSON and YAML forms; `devices replay` with relative and
RFC3339 `--since` in the same `-o table|wide|json|yaml` vocabulary (and `-o text`, its
older name for the table); human durations.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cli import parse_since, run_devices, run_replay
from exporter.directory import Directory, open_store
from exporter.observer import persist
from exporter.sharding import shard_of
from gpuhealth.clock import ManualClock
from gpuhealth.tables import human_duration
from gpuhealth_cli.main import build_parser, main
from tests.exporter.fixtures.builders import DRIVER, claim, container, gpu_uuid, lease, pod, resource, slice_

U0, U1, D0 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1), gpu_uuid("node-2", 0)


def dump_items() -> list[dict[str, Any]]:
    dp = pod(
        "serve", container("main", ("nvidia.com/gpu", [resource(U0, "Unhealthy"), resource(f"{U1}::1")]))
    )
    dra = pod(
        "train",
        container(
            "worker",
            (
                "claim:gpus",
                [resource("k8s.gpu.nvidia.com/claim=claim-uid-train-gpus-gpu-0", "Unknown", "stale")],
            ),
        ),
        node="node-2",
        claim_statuses={"gpus": "train-gpus"},
    )
    return [
        dp,
        dra,
        claim("train-gpus", [("gpus", DRIVER, "node-2", "gpu-0")]),
        slice_("node-2-gpus", "node-2", {"gpu-0": D0}),
        lease("node-1"),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ignored"}},
    ]


def exit_code(argv: list[str]) -> int:
    """`gpuhealth ARGV`'s exit code, whether argparse (SystemExit) or the command decided it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def write(tmp_path: Path, doc: Any, name: str = "dump.json") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_offline_dump_prints_metrics_for_both_paths(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    path = write(tmp_path, {"apiVersion": "v1", "kind": "List", "items": dump_items()})
    assert main(["exporter", "--from-file", path, "--once"]) == 0
    text = capsysbinary.readouterr().out.decode()
    assert f'gpu_device_health{{node="node-1",device="{U0}",status="Unhealthy"}} 1' in text
    assert f'gpu_device_health{{node="node-1",device="{U1}",status="Healthy"}} 1' in text
    assert f'gpu_device_health{{node="node-2",device="{D0}",status="Unknown"}} 1' in text
    assert 'gpu_node_kubelet_lease_age_seconds{node="node-1"}' in text


def test_offline_shards_print_each_node_s_devices_once(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    path = write(tmp_path, {"apiVersion": "v1", "kind": "List", "items": dump_items()})
    owner = {node: shard_of(node, 2) for node in ("node-1", "node-2")}
    seen: dict[str, list[int]] = {"node-1": [], "node-2": []}
    for index in range(2):
        assert (
            main(["exporter", "--from-file", path, "--once", "--shard", str(index), "--total-shards", "2"])
            == 0
        )
        text = capsysbinary.readouterr().out.decode()
        for node in seen:
            if f'gpu_device_health{{node="{node}"' in text:
                seen[node].append(index)
    assert seen == {node: [index] for node, index in owner.items()}


def test_a_slice_health_driver_s_taints_are_the_health_of_its_held_devices(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """node-2's DRA pod reads Unknown (the kubelet heard nothing); its slice device is tainted."""
    items = dump_items()
    items[3] = slice_(
        "node-2-gpus",
        "node-2",
        {"gpu-0": D0},
        taints={"gpu-0": [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}]},
    )
    path = write(tmp_path, {"apiVersion": "v1", "kind": "List", "items": items})
    assert main(["exporter", "--from-file", path, "--once"]) == 0
    assert f'device="{D0}",status="Unknown"}} 1' in capsysbinary.readouterr().out.decode()
    assert main(["exporter", "--from-file", path, "--once", "--slice-health-driver", DRIVER]) == 0
    text = capsysbinary.readouterr().out.decode()
    assert f'gpu_device_health{{node="node-2",device="{D0}",status="Unhealthy"}} 1' in text
    # The device-plugin node is no slice's: the kubelet still speaks for it.
    assert f'gpu_device_health{{node="node-1",device="{U0}",status="Unhealthy"}} 1' in text


def test_offline_pod_list_dump_with_a_directory(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    pods = [item for item in dump_items() if item["kind"] == "Pod"]
    for item in pods:
        del item["kind"]  # kubectl omits kind on items of a typed list
    path = write(tmp_path, {"apiVersion": "v1", "kind": "PodList", "items": pods})
    directory = str(tmp_path / "d.sqlite")
    assert main(["exporter", "--from-file", path, "--once", "--directory", directory]) == 0
    text = capsysbinary.readouterr().out.decode()
    assert f'device="{U0}",status="Unhealthy"}} 1' in text
    assert "unresolved/team-a/train-gpus/" in text  # no claims in a PodList: provisional identity
    assert main(["devices", "--directory", directory, "-o", "json"]) == 0
    devices = json.loads(capsysbinary.readouterr().out)["devices"]
    assert {d["device"] for d in devices} >= {U0, U1}


def test_node_filter_skips_pods_with_a_malformed_spec(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    items = [*dump_items(), {"kind": "Pod", "metadata": {"name": "junk"}, "spec": [1]}]
    path = write(tmp_path, {"apiVersion": "v1", "kind": "List", "items": items})
    assert main(["exporter", "--from-file", path, "--once", "--node", "node-1"]) == 0
    text = capsysbinary.readouterr().out.decode()
    assert f'device="{U0}",status="Unhealthy"}} 1' in text
    assert 'node="node-2"' not in text


def test_malformed_pieces_of_a_dump_are_reported_offline(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    broken = pod("broken", container("main", ("nvidia.com/gpu", [resource(U0, "Sick")])))
    items = [broken, {"kind": "Pod", "metadata": 3}, {"kind": "Lease", "metadata": {}}]
    path = write(tmp_path, {"apiVersion": "v1", "kind": "List", "items": items})
    assert main(["exporter", "--from-file", path, "--once"]) == 0
    assert f'device="{U0}",status="Unknown"}} 1' in capsysbinary.readouterr().out.decode()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "1 invalid_health" in warning and "1 malformed_lease" in warning and "1 malformed_pod" in warning


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read the dump"),
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"kind": "Deployment"}', "`kind` is 'Deployment'"),
        ('{"kind": "List", "items": 3}', "List without an `items` array"),
        ('{"kind": "List", "items": [3]}', "items[0] is not an object"),
    ],
)
def test_bad_dumps_name_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = str(tmp_path / "missing.json") if content is None else write(tmp_path, content)
    assert main(["exporter", "--from-file", path, "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuhealth exporter: error: ") and path in err and message in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["exporter", "--once"], "gpuhealth exporter: error: --once goes with --from-file"),
        (["exporter", "--listen", "nowhere"], "gpuhealth exporter: error: argument --listen: 'nowhere'"),
        (["exporter", "--listen", "[::1:80"], "expected HOST:PORT"),
        (["exporter", "--nvml", "cuda"], "argument --nvml: 'cuda': expected auto, none, pynvml or sim:URL"),
        (["exporter", "--nvml", "sim:http://127.0.0.1:1"], "NvmlSettings.source sim:URL reads one"),
        (["exporter", "--nvml-poll-seconds", "0"], "argument --nvml-poll-seconds: '0' must be longer"),
        (["exporter", "--nvml-poll-seconds", "nan"], "argument --nvml-poll-seconds: 'nan' is not a"),
        (
            ["exporter", "--shard", "3", "--total-shards", "3"],
            "--shard 3: expected 0 to 2 (--total-shards 3)",
        ),
        (["exporter", "--shard", "-1", "--total-shards", "2"], "--shard -1: expected 0 to 1"),
        (["exporter", "--shard", "1"], "--shard 1: expected 0 to 0 (--total-shards 1)"),
        (["exporter", "--total-shards", "0"], "--total-shards 0: expected at least 1"),
        (["exporter", "--total-shards", "two"], "argument --total-shards: 'two': expected a whole number"),
        (["exporter", "--node", "n", "--total-shards", "2"], "--node (node mode) watches one node already"),
        (["devices", "--directory", "/nonexistent/d.sqlite"], "gpuhealth devices: error: /nonexistent"),
        (["devices", "-o", "xml"], "gpuhealth devices: error: argument -o/--output: invalid choice"),
        (["devices", "replay", "--since", "yesterday"], "gpuhealth devices replay: error: --since"),
        (["devices", "replay", "-o", "xml"], "gpuhealth devices replay: error: argument -o/--output"),
    ],
)
def test_bad_flags_are_usage_errors_with_the_command_named(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.fixture
def directory_path(tmp_path: Path, clock: ManualClock) -> str:
    path = str(tmp_path / "d.sqlite")
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    store.apply_lease("ADDED", lease("node-1", "2027-01-15T08:00:00Z"))
    long_message = "XID 79: GPU has fallen off the bus. " * 10
    store.apply_pod(
        "ADDED", pod("a", container("main", ("nvidia.com/gpu", [resource(U0), resource(U1)])), rv=1)
    )
    clock.advance(60)
    store.apply_pod(
        "MODIFIED",
        pod(
            "a",
            container("main", ("nvidia.com/gpu", [resource(U0), resource(U1, "Unhealthy", long_message)])),
            rv=2,
        ),
    )
    persist(store, directory, force=True)
    directory.close()
    return path


def devices(args: list[str], clock: ManualClock) -> str:
    out = io.StringIO()
    parsed = build_parser().parse_args(["devices", *args])
    assert run_devices(parsed, clock=clock, out=out) == 0
    return out.getvalue()


def test_devices_table_shows_health_age_message_and_pods(directory_path: str, clock: ManualClock) -> None:
    clock.advance(192)
    table = devices(["--directory", directory_path], clock).splitlines()
    assert table[0].split() == ["NODE", "DEVICE", "HEALTH", "AGE", "PODS", "MESSAGE"]
    row = next(line for line in table if U1 in line)
    assert "Unhealthy" in row and "3m12s" in row and "team-a/a" in row
    assert row.endswith("…") and len(row) < 200  # the long message is cut in the table
    assert len(table) == 3


def test_devices_filters_and_output_forms(directory_path: str, clock: ManualClock) -> None:
    only = devices(["--directory", directory_path, "--health", "Unhealthy"], clock)
    assert U1 in only and U0 not in only
    assert "No devices recorded matching" in devices(
        ["--directory", directory_path, "--node", "node-9"], clock
    )
    wide = devices(["--directory", directory_path, "-o", "wide"], clock)
    assert "VERSION" in wide and "fallen off the bus. XID 79" in wide
    doc = json.loads(devices(["--directory", directory_path, "-o", "json"], clock))
    by_device = {d["device"]: d for d in doc["devices"]}
    assert by_device[U1]["statusVersion"] == 2 and by_device[U1]["allocations"][0]["pod"] == "a"
    assert yaml.safe_load(devices(["--directory", directory_path, "-o", "yaml"], clock)) == doc


def test_replay_streams_the_log_since_a_time(directory_path: str, clock: ManualClock) -> None:
    def replay(*args: str) -> list[str]:
        out = io.StringIO()
        parsed = build_parser().parse_args(["devices", "replay", "--directory", directory_path, *args])
        assert run_replay(parsed, clock=clock, out=out) == 0
        return out.getvalue().splitlines()

    assert len(replay()) == 3
    (line,) = replay("--since", "30s")
    assert U1 in line and " v2 " in line and "Unhealthy" in line and "team-a/a/main" in line
    assert len(replay("--since", "2027-01-15T08:00:30Z")) == 1  # the clock starts at 08:00:00Z
    assert [json.loads(x)["statusVersion"] for x in replay("-o", "json", "--since", "1m")] == [1, 1, 2]
    assert replay("-o", "text") == replay("-o", "table") == replay()  # `text`: the table's older name
    (wide,) = replay("-o", "wide", "--since", "30s")
    assert "nvidia.com/gpu" in wide and "rv=2" in wide and "fallen off the bus" in wide
    docs = list(yaml.safe_load_all("\n".join(replay("-o", "yaml"))))
    assert [d["statusVersion"] for d in docs] == [1, 1, 2] and docs[2]["health"] == "Unhealthy"


def test_since_and_durations() -> None:
    now = 1_800_000_000.0
    assert parse_since("10m", now) == now - 600
    assert parse_since("1.5h", now) == now - 5400
    assert parse_since("2027-01-15T08:00:00+00:00", now) == parse_since("2027-01-15T08:00:00Z", now)
    with pytest.raises(Exception, match="expected RFC3339"):
        parse_since("yesterday", now)
    with pytest.raises(Exception, match="time zone"):
        parse_since("2027-01-15T08:00:00", now)
    assert [human_duration(s) for s in (0, 45, 192, 3600, 7500, 90000, 86400)] == [
        "0s",
        "45s",
        "3m12s",
        "1h",
        "2h5m",
        "1d1h",
        "1d",
    ]


def test_a_port_in_use_is_a_run_time_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    path = write(tmp_path, {"kind": "List", "items": []})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["exporter", "--from-file", path, "--listen", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert err == f"gpuhealth exporter: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_a_reader_that_goes_away_ends_the_command_quietly(directory_path: str, clock: ManualClock) -> None:
    # `gpuhealth devices replay | head` printed a BrokenPipeError traceback.
    directory = Directory(directory_path, clock=clock)
    store = open_store(directory, clock)
    for rv in range(1, 1500):
        clock.advance(1)
        health = "Unhealthy" if rv % 2 else "Healthy"
        store.apply_pod(
            "MODIFIED", pod("p", container("c", ("nvidia.com/gpu", [resource(U0, health)])), rv=rv)
        )
    persist(store, directory, force=True)
    directory.close()
    argv = [sys.executable, "-m", "gpuhealth", "devices", "replay", "--directory", directory_path]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait() == 141, err
    assert "Traceback" not in err


def test_an_observer_that_dies_fails_the_exporter_loudly(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before the observer ran as the app's background task, its death ended the exporter
    # silently with exit 0.
    from exporter.observer import Observer
    from simulator.apiserver.kubeconfig import write_kubeconfig

    async def dies(self: Observer) -> None:
        raise RuntimeError("watch loop bug")

    monkeypatch.setattr(Observer, "run", dies)
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, "http://127.0.0.1:1")
    argv = ["exporter", "--kubeconfig", str(kubeconfig), "--listen", "127.0.0.1:0"]
    assert main([*argv, "--directory", str(tmp_path / "d.sqlite")]) == 1
    err = capsys.readouterr().err
    assert "gpuhealth exporter: error: background task observer failed: RuntimeError('watch loop bug')" in err
    assert any(r.exc_info and "observer" in r.getMessage() for r in caplog.records)  # with its traceback


def test_a_web_configuration_that_cannot_be_served_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: not-a-hash\n")
    assert exit_code(["exporter", "--web.config.file", str(web), "--kubeconfig", str(tmp_path / "none")]) == 2
    error = capsys.readouterr().err
    assert f"--web.config.file {web}:2: basic_auth_users.prometheus: not a bcrypt hash" in error, error
