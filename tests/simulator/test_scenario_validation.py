"""Scenario files: loading, validation errors that name the file, the line and the field.

Aspects: a good file becomes frozen dataclasses (durations, defaults, sorted timeline); each
kind of mistake gets one clear `ScenarioError` (`file:line: field: problem`); built-ins load
and resolve by name; random junk (text, structures, mutated good files) only ever raises
`ScenarioError`.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.scenario import (
    ScenarioError,
    builtin_names,
    from_dict,
    list_builtins,
    load_file,
    parse_fault_json,
    parse_text,
    resolve,
)

GOOD = """\
name: small
description: two nodes
fleet:
  - name: gpu-node
    count: 4
    gpusPerNode: 8
    path: device-plugin
  - name: dra
    count: 1
    gpusPerNode: 8
    path: dra
workloads:
  - name: serve
    replicas: 2
    gpusPerPod: 4
    path: device-plugin
timeline:
  - at: 2m
    fault: recover
    node: gpu-node-1
  - at: 90s
    fault: device-unknown
    device: {node: dra-0, gpu: 3}
    duration: 1m30s
  - at: 10
    fault: xid
    device:
      node: gpu-node-3
      gpu: 2
    xid: 79
  - at: 3m
    action: scale
    workload: serve
    replicas: 3
  - {at: 4m, action: delete-pods, namespace: gpuhealth-system, selector: gpuhealth.io/holder,
     node: gpu-node-0}
"""


def write(tmp_path: Path, text: str, name: str = "x.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    message = info.value.message
    prefix = f"{path}:"
    assert message.startswith(prefix)
    return message[len(prefix) :]


def test_a_good_file_becomes_dataclasses_with_sorted_timeline_and_seconds(tmp_path: Path) -> None:
    sc = load_file(write(tmp_path, GOOD))
    assert sc.name == "small"
    assert [g.node_names() for g in sc.fleet] == [[f"gpu-node-{i}" for i in range(4)], ["dra-0"]]
    assert [f.at for f in sc.timeline] == [10.0, 90.0, 120.0, 180.0, 240.0]
    unknown = sc.timeline[1]
    assert (unknown.kind, unknown.duration, unknown.device) == ("device-unknown", 90.0, unknown.device)
    assert unknown.line == 21
    assert sc.timeline[0].unhealthy is True  # XID 79 is hardware trouble
    assert sc.workloads[0].checkpoint == "none"
    assert sc.settings.dra_health_timeout == 30.0
    scale, delete = sc.timeline[3:]
    assert (scale.kind, scale.namespace, scale.workload, scale.replicas) == ("scale", "default", "serve", 3)
    assert scale.is_action and scale.line == 31
    assert (delete.kind, delete.namespace, delete.selector, delete.node) == (
        "delete-pods",
        "gpuhealth-system",
        "gpuhealth.io/holder",
        "gpu-node-0",
    )


def test_gpu_out_of_range_names_the_line_and_the_field(tmp_path: Path) -> None:
    text = GOOD.replace("      gpu: 2", "      gpu: 9")
    assert (
        error_of(tmp_path, text)
        == "29: timeline[2].device.gpu: 9 is out of range (node gpu-node-3 has 8 GPUs)"
    )


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("    count: 4\n", "    count: 4\n    colour: red\n", "6: fleet[0].colour: unknown field"),
        ("    count: 4\n", "    count: four\n", "5: fleet[0].count: expected an integer, got 'four'"),
        ("    count: 4\n", "    count: true\n", "5: fleet[0].count: expected an integer, got True"),
        (
            "    path: dra\n",
            "    path: nvlink\n",
            "11: fleet[1].path: 'nvlink' is not one of: device-plugin, dra",
        ),
        ("  - at: 2m\n", "  - at: soon\n", "18: timeline[0].at: 'soon' is not a duration"),
        (
            "    node: gpu-node-1\n",
            "    node: gpu-node-7\n",
            "20: timeline[0].node: no node named 'gpu-node-7'",
        ),
        ("    duration: 1m30s\n", "", "21: timeline[1].duration: is required"),
        ("    fault: recover\n", "    fault: meltdown\n", "19: timeline[0].fault: 'meltdown' is not one of"),
        (
            "    gpusPerPod: 4\n",
            "    gpusPerPod: 9\n",
            "14: workloads[0].replicas: 2 pods of 9 GPUs do not fit",
        ),
        ("    replicas: 2\n", "    replicas: 9\n", "14: workloads[0].replicas: 9 pods of 4 GPUs do not fit"),
        (
            "    node: gpu-node-1\n",
            "    node: gpu-node-1\n    device: {node: dra-0, gpu: 0}\n",
            "18: timeline[0]: recover",
        ),
        ("name: small\n", "name: small\nname: again\n", "2: name: duplicate key"),
        (
            "  - name: dra\n",
            "  - name: gpu-node\n",
            "8: fleet[1].name: node group 'gpu-node' is defined twice",
        ),
        ("    xid: 79\n", "    xid: 1000\n", "30: timeline[2].xid: 1000 is out of range (1..999)"),
        # A reset is a device-unhealthy's option, and the janitor needs its reset time.
        (
            "    duration: 1m30s\n",
            "    duration: 1m30s\n    reset: clears\n",
            "25: timeline[1].reset: unknown field",
        ),
        ("name: small\n", "name: small\njanitor: {}\n", "2: janitor.resetSeconds: is required"),
        (
            "name: small\n",
            "name: small\njanitor: {resetSeconds: soon}\n",
            "2: janitor.resetSeconds: 'soon' is not a duration",
        ),
        ("name: small\n", "name: small\njanitor: {resetSecs: 5s}\n", "2: janitor.resetSecs: unknown field"),
        (
            "    path: device-plugin\n",
            "    path: device-plugin\n    extendedResource: true\n",
            "8: fleet[0].extendedResource: a DeviceClass's extendedResourceName applies to DRA nodes only",
        ),
        (
            "    gpusPerPod: 4\n    path: device-plugin\n",
            "    gpusPerPod: 4\n    path: device-plugin\n    extendedResource: true\n",
            "17: workloads[0].extendedResource: path: device-plugin pods request nvidia.com/gpu already",
        ),
        (
            "    gpusPerPod: 4\n    path: device-plugin\n",
            "    gpusPerPod: 4\n    path: dra\n    extendedResource: true\n",
            "14: workloads[0].replicas: no node in the fleet matches",
        ),
        (
            "    gpusPerPod: 4\n    path: device-plugin\n",
            "    gpusPerPod: 4\n    extendedResource: true\n    draClaim: direct\n",
            "17: workloads[0].draClaim: the pods of extendedResource: true reference no claim of their own",
        ),
        (
            "    path: dra\n",
            "    path: dra\n    dcgmExporter: HostName\n",
            "12: fleet[1].dcgmExporter: 'HostName' is not one of: hostname, Hostname",
        ),
        (
            "    xid: 79\n",
            "    xid: 79\n  - {at: 1m, fault: health-watch, device: {node: dra-0, gpu: 1}, watch: PCIE}\n",
            "31: timeline[3].device: health-watch needs dcgm-exporter on the node",
        ),
        (
            "    path: dra\n",
            "    path: dra\n    mig: {profile: 1g.10gb, partitions: 7}\n",
            "12: fleet[1].mig: MIG on DRA is simulated with the NVIDIA DRA driver's profile only",
        ),
        (
            "    path: dra\n",
            "    path: dra\n    draDriver: nvidia\n"
            "    mig: {strategy: single, profile: 1g.10gb, partitions: 7}\n",
            "13: fleet[1].mig.strategy: strategy is the device plugin's; the DRA driver publishes each",
        ),
        (
            "    path: dra\n",
            "    path: dra\n    draDriver: nvidia\n    extendedResource: true\n"
            "    mig: {profile: 1g.10gb, partitions: 7}\n",
            "14: fleet[1].mig: extendedResource maps nvidia.com/gpu to the driver's whole-GPU DeviceClass",
        ),
        (
            "    gpusPerNode: 8\n    path: device-plugin\n",
            "    gpusPerNode: 8\n    path: device-plugin\n    sharedReplicas: 2\n"
            "    mig: {strategy: single, profile: 1g.10gb, partitions: 7}\n",
            "9: fleet[0].mig: a group is either MIG-partitioned or time-sliced",
        ),
        (
            "    gpusPerNode: 8\n    path: device-plugin\n",
            "    gpusPerNode: 8\n    path: device-plugin\n"
            "    mig: {strategy: single, profile: 1g, partitions: 7}\n",
            "8: fleet[0].mig.profile: '1g' is not a MIG profile like 1g.10gb",
        ),
        (
            "    gpusPerNode: 8\n    path: device-plugin\n",
            "    gpusPerNode: 8\n    path: device-plugin\n"
            "    mig: {strategy: single, profile: 3g.40gb, partitions: 3}\n",
            "8: fleet[0].mig.partitions: 3 partitions of 3g.40gb need 9 compute slices; a card has 7",
        ),
        (
            "    gpusPerNode: 8\n    path: device-plugin\n",
            "    gpusPerNode: 8\n    path: device-plugin\n"
            "    mig: {strategy: mixed, profile: 3g.40gb, partitions: 2}\n",
            # The group offers only nvidia.com/mig-3g.40gb: a workload that does not name it
            # requests nvidia.com/gpu, which no device-plugin node offers any more.
            "15: workloads[0].replicas: no node in the fleet matches the workload's path or nodeGroup and "
            "offers nvidia.com/gpu",
        ),
        (
            "    gpusPerNode: 8\n    path: device-plugin\n",
            "    gpusPerNode: 8\n    path: device-plugin\n    mig: {strategy: single, profile: 1g.10gb}\n",
            "8: fleet[0].mig.partitions: is required",
        ),
        (
            "    workload: serve\n",
            "    workload: serving\n",
            "33: timeline[3].workload: no workload default/serving",
        ),
        (
            "    action: scale\n",
            "    action: scale\n    namespace: batch\n",
            "34: timeline[3].workload: no workload batch/serve in the scenario",
        ),
        ("    replicas: 3\n", "    replicas: -1\n", "34: timeline[3].replicas: -1 is out of range"),
        ("    replicas: 3\n", "", "31: timeline[3].replicas: is required"),
        ("    action: scale\n", "    action: rollout\n", "32: timeline[3].action: 'rollout' is not one of"),
        (
            "    action: scale\n",
            "    action: scale\n    fault: xid\n",
            "31: timeline[3]: an entry is a fault",
        ),
        (
            "    action: scale\n",
            "    action: scale\n    node: gpu-node-0\n",
            "33: timeline[3].node: unknown field",
        ),
        (
            "selector: gpuhealth.io/holder",
            "selector: 'a in (b)'",
            "35: timeline[4].selector: 'a in (b)' is not a",
        ),
        (
            "selector: gpuhealth.io/holder",
            "selector: ''",
            "35: timeline[4].selector: '' is not a label selector",
        ),
        ("node: gpu-node-0}", "node: gpu-node-9}", "36: timeline[4].node: no node named 'gpu-node-9'"),
        (
            "namespace: gpuhealth-system",
            "namespace: Gpuhealth",
            "35: timeline[4].namespace: 'Gpuhealth' is not",
        ),
    ],
)
def test_each_mistake_gets_one_clear_error(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert old in GOOD
    message = error_of(tmp_path, GOOD.replace(old, new, 1))
    assert message.startswith(expected), message


DCGM = GOOD.replace("    path: dra\n", "    path: dra\n    dcgmExporter: Hostname\n", 1)


def test_a_health_watch_fault_on_a_dcgm_exporter_node_names_its_watch(tmp_path: Path) -> None:
    text = DCGM + "  - {at: 1m, fault: health-watch, device: {node: dra-0, gpu: 1}, watch: NVLINK}\n"
    scenario = load_file(write(tmp_path, text))
    assert scenario.nodes["dra-0"].dcgm_host_label == "Hostname"
    assert scenario.nodes["gpu-node-0"].dcgm_host_label is None
    [fault] = [f for f in scenario.timeline if f.kind == "health-watch"]
    assert (fault.watch, fault.device, fault.to_json()["watch"]) == ("NVLINK", fault.device, "NVLINK")
    assert fault.describe().startswith("health-watch dra-0/gpu-1 watch=NVLINK (DCGM's health watch only")
    bad = DCGM + "  - {at: 1m, fault: health-watch, device: {node: dra-0, gpu: 1}, watch: FAN}\n"
    assert "'FAN' is not one of: PCIE, NVLINK" in error_of(tmp_path, bad)
    missing = DCGM + "  - {at: 1m, fault: health-watch, device: {node: dra-0, gpu: 1}}\n"
    assert "watch: is required" in error_of(tmp_path, missing)


def test_syntax_errors_empty_and_binary_files_are_scenario_errors(tmp_path: Path) -> None:
    assert error_of(tmp_path, "fleet: [\n  - {name: a\n").startswith("2: not valid YAML")
    assert error_of(tmp_path, "") == "1: the document is empty"
    assert error_of(tmp_path, "- 1\n- 2\n") == "1: (top level): expected a mapping, got [1, 2]"
    assert error_of(tmp_path, "name: x\n").startswith("1: fleet: is required")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(ScenarioError, match="not UTF-8"):
        load_file(binary)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_file(tmp_path / "missing.yaml")


def test_alias_bombs_and_deep_nesting_are_refused(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 8):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        bomb += f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]\n"
    assert "too large" in error_of(tmp_path, bomb)
    assert "nested too deeply" in error_of(tmp_path, "a: " + "[" * 200 + "]" * 200 + "\n")


def test_builtins_load_and_resolve_by_name_or_path(tmp_path: Path) -> None:
    names = builtin_names()
    assert {"xid-and-unknown", "node-partition", "flapping", "fleet-10k", "quiet"} <= set(names)
    listed = dict(list_builtins())
    assert all(listed[name] for name in names)  # each has a one-line description
    assert resolve("xid-and-unknown").name == "xid-and-unknown"
    path = write(tmp_path, GOOD, "mine.yaml")
    assert resolve(str(path)).name == "small"
    assert resolve(path).name == "small"
    with pytest.raises(ScenarioError, match="no such built-in scenario or file"):
        resolve("nonexistent")


def test_a_device_fault_may_need_a_reset_and_a_janitor_resets_cards() -> None:
    base: dict[str, Any] = {
        "name": "r",
        "fleet": [{"name": "dra", "count": 1, "gpusPerNode": 2, "path": "dra"}],
        "janitor": {"resetSeconds": "30s"},
        "timeline": [
            {
                "at": "10s",
                "fault": "device-unhealthy",
                "device": {"node": "dra-0", "gpu": 0},
                "reset": "clears",
            },
            {
                "at": "10s",
                "fault": "device-unhealthy",
                "device": {"node": "dra-0", "gpu": 1},
                "reset": "fails",
            },
            {"at": "10s", "fault": "device-unhealthy", "device": {"node": "dra-0", "gpu": 1}},
        ],
    }
    scenario = from_dict(base)
    assert scenario.janitor == 30.0
    assert [f.reset for f in scenario.timeline] == ["clears", "fails", None]
    assert from_dict({**base, "janitor": None}).janitor is None
    bad = {**base, "timeline": [{**base["timeline"][0], "reset": "sometimes"}]}
    with pytest.raises(
        ScenarioError, match=r"timeline\[0\]\.reset: 'sometimes' is not one of: clears, fails"
    ):
        from_dict(bad)


def test_dict_scenarios_name_the_field_without_a_line() -> None:
    data = yaml.safe_load(GOOD)
    data["fleet"][0]["gpusPerNode"] = 0
    with pytest.raises(ScenarioError) as info:
        from_dict(data)
    assert info.value.message == "<dict>:1: fleet[0].gpusPerNode: 0 is out of range (1..64)"


# ---------------------------------------------------------------------------- junk never crashes

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)


def _only_scenario_errors(fn: Any, *args: Any) -> None:
    # A valid scenario or a ScenarioError are both fine; any other exception fails the test.
    with contextlib.suppress(ScenarioError):
        fn(*args)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_random_text_is_a_scenario_or_a_scenario_error(text: str) -> None:
    _only_scenario_errors(parse_text, text, "junk.yaml")


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_random_structures_are_scenario_errors(value: Any) -> None:
    _only_scenario_errors(parse_text, json.dumps(value), "junk.yaml")


GOOD_DATA = yaml.safe_load(GOOD)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += _paths(child, (*prefix, i))
    return out


PATHS = _paths(GOOD_DATA)[1:]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(PATHS), json_values)
def test_a_good_file_with_one_field_replaced_by_junk_never_crashes(path: tuple[Any, ...], junk: Any) -> None:
    data = copy.deepcopy(GOOD_DATA)
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = junk
    _only_scenario_errors(parse_text, yaml.safe_dump(data), "mutated.yaml")


def test_the_format_example_in_the_docs_is_a_valid_scenario() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "scenarios.md").read_text()
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    scenario = parse_text(example, "docs/scenarios.md")
    assert scenario.name == "my-fleet"
    assert [f.kind for f in scenario.timeline] == ["device-unhealthy"]


SMALL = parse_text(GOOD, "good.yaml")


@settings(max_examples=300, deadline=None)
@given(
    json_values
    | st.fixed_dictionaries(
        {"fault": st.sampled_from(["xid", "flap", "recover", "ecc"])},
        optional={
            "device": json_values,
            "node": json_values,
            "xid": json_values,
            "times": json_values,
            "period": json_values,
            "at": json_values,
        },
    )
    | st.fixed_dictionaries(
        {"action": st.sampled_from(["scale", "delete-pods"])},
        optional={
            "namespace": st.sampled_from(["default", "gpuhealth-system"]) | json_values,
            "workload": st.sampled_from(["serve", "x"]) | json_values,
            "replicas": json_values,
            "selector": st.text(max_size=40) | json_values,
            "node": st.sampled_from(["gpu-node-0", "nope"]) | json_values,
            "fault": json_values,
            "at": json_values,
        },
    )
)
def test_random_injected_faults_are_faults_or_scenario_errors(value: Any) -> None:
    body = json.dumps(value).encode()
    with contextlib.suppress(ScenarioError):
        parse_fault_json(body, SMALL, now=0.0)
    with pytest.raises(ScenarioError, match="not UTF-8"):
        parse_fault_json(b"\xff\xfe", SMALL, now=0.0)


def test_dra_groups_that_disagree_on_the_device_class_are_refused() -> None:
    data = {
        "fleet": [
            {"name": "a", "count": 1, "gpusPerNode": 2, "path": "dra", "extendedResource": True},
            {"name": "b", "count": 1, "gpusPerNode": 2, "path": "dra"},
        ]
    }
    with pytest.raises(ScenarioError) as caught:
        from_dict(data, "two.yaml")
    assert "fleet[1].extendedResource: the DRA driver's DeviceClass is cluster-wide" in str(caught.value)
