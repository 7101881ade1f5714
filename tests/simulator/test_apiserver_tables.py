"""Server-side printing (meta.k8s.io Table) of the simulated apiserver.

Aspects: content negotiation from the Accept header kubectl sends (v1 first, v1beta1 fallback,
plain JSON, 406 for an `as=` form that is not served, includeObject checked); ages as kubectl
prints them; pod STATUS as kubectl computes it (Running, Pending, ContainerCreating, Completed,
Error, Init:..., Terminating, NotReady) with READY and RESTARTS; node STATUS with
SchedulingDisabled and ROLES; job status and completions; DRA claim state; CRD printer columns
(JSONPath subset, dates as ages, <none> for missing) and the default NAME/CREATED AT columns;
then over HTTP: lists, single objects, includeObject and watch events as Tables.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import urllib3
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.apiserver import tables
from simulator.apiserver.errors import ApiError
from simulator.apiserver.resources import Registry, info_from_crd
from simulator.apiserver.store import format_timestamp

if TYPE_CHECKING:
    from tests.simulator.conftest import ServedCluster

KUBECTL_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
    "application/json"
)
NOW = 1_800_000_000.0


def _stamp(seconds_ago: float) -> str:
    return format_timestamp(NOW - seconds_ago)


# ---- negotiation --------------------------------------------------------------------------------------


def test_kubectl_accept_header_asks_for_a_v1_table() -> None:
    assert tables.table_request(KUBECTL_ACCEPT) == tables.TableRequest("v1", "Metadata")
    assert tables.table_request(KUBECTL_ACCEPT, "Object") == tables.TableRequest("v1", "Object")


def test_v1beta1_only_clients_get_a_v1beta1_table() -> None:
    request = tables.table_request("application/json;as=Table;v=v1beta1;g=meta.k8s.io, application/json")
    assert request is not None and request.api_version == "meta.k8s.io/v1beta1"


@pytest.mark.parametrize(
    "accept",
    [None, "", "application/json", "*/*", "application/json, */*", "application/vnd.kubernetes.protobuf"],
)
def test_plain_clients_get_json(accept: str | None) -> None:
    assert tables.table_request(accept) is None


def test_unserved_as_form_without_fallback_is_406() -> None:
    with pytest.raises(ApiError) as exc:
        tables.table_request("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io")
    assert exc.value.code == 406 and exc.value.reason == "NotAcceptable"


def test_bad_include_object_is_400() -> None:
    with pytest.raises(ApiError) as exc:
        tables.table_request(KUBECTL_ACCEPT, "Everything")
    assert exc.value.code == 400 and "includeObject" in exc.value.message


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-0.5, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (150, "2m30s"),
        (600, "10m"),
        (179 * 60, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 300, "3h5m"),
        (47 * 3600, "47h"),
        (50 * 3600, "2d2h"),
        (8 * 86400, "8d"),
        (800 * 86400, "2y70d"),
        (3000 * 86400, "8y"),
    ],
)
def test_ages_as_kubectl_prints_them(seconds: float, text: str) -> None:
    assert tables.human_duration(seconds) == text


# ---- pods ---------------------------------------------------------------------------------------------


def _pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "creationTimestamp": _stamp(30)},
        "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
        "status": status,
    }


def _running(name: str, *, ready: bool = True, restarts: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "ready": ready,
        "restartCount": restarts,
        "state": {"running": {"startedAt": _stamp(20)}},
    }


@pytest.mark.parametrize(
    ("status", "shown"),
    [
        ({"phase": "Pending"}, "Pending"),
        ({"phase": "Running", "containerStatuses": [_running("a"), _running("b")]}, "Running"),
        (
            {
                "phase": "Pending",
                "containerStatuses": [{"name": "a", "state": {"waiting": {"reason": "ContainerCreating"}}}],
            },
            "ContainerCreating",
        ),
        (
            {
                "phase": "Succeeded",
                "containerStatuses": [
                    {"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
                ],
            },
            "Completed",
        ),
        (
            {
                "phase": "Failed",
                "containerStatuses": [
                    {"name": "a", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
                ],
            },
            "Error",
        ),
        (
            {
                "phase": "Failed",
                "containerStatuses": [{"name": "a", "state": {"terminated": {"exitCode": 137}}}],
            },
            "ExitCode:137",
        ),
        (
            {"phase": "Failed", "containerStatuses": [{"name": "a", "state": {"terminated": {"signal": 9}}}]},
            "Signal:9",
        ),
        ({"phase": "Failed", "reason": "Evicted"}, "Evicted"),
        (
            {
                "phase": "Running",
                "containerStatuses": [
                    {"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                    _running("b"),
                ],
                "conditions": [{"type": "Ready", "status": "False"}],
            },
            "NotReady",
        ),
        (
            {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}],
            },
            "SchedulingGated",
        ),
    ],
)
def test_pod_status_column(status: dict[str, Any], shown: str) -> None:
    assert tables.pod_status(_pod(**status)) == shown


def test_pod_init_containers_show_progress() -> None:
    pod = _pod(
        phase="Pending",
        initContainerStatuses=[{"name": "i", "state": {"waiting": {"reason": "PodInitializing"}}}],
    )
    pod["spec"]["initContainers"] = [{"name": "i"}, {"name": "j"}]
    assert tables.pod_status(pod) == "Init:0/2"
    pod["status"]["initContainerStatuses"] = [
        {"name": "i", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
    ]
    assert tables.pod_status(pod) == "Init:Error"


def test_deleted_pod_is_terminating() -> None:
    pod = _pod(phase="Running", containerStatuses=[_running("a")])
    pod["metadata"]["deletionTimestamp"] = _stamp(1)
    assert tables.pod_status(pod) == "Terminating"


def test_pod_row_ready_restarts_and_wide_cells() -> None:
    last = {"terminated": {"exitCode": 1, "finishedAt": _stamp(300)}}
    pod = _pod(
        phase="Running",
        podIP="10.128.0.9",
        containerStatuses=[
            _running("a", restarts=2) | {"lastState": last},
            _running("b", ready=False, restarts=1),
        ],
    )
    pod["spec"]["nodeName"] = "gpu-0"
    printer = tables.printer_for(Registry().get("pods"), "v1")
    table = tables.render_table(printer, [pod], tables.TableRequest(), now=NOW)
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
        "IP",
        "Node",
        "Nominated Node",
        "Readiness Gates",
    ]
    assert [c["priority"] for c in table["columnDefinitions"]] == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    row = table["rows"][0]
    assert row["cells"] == [
        "p",
        "1/2",
        "Running",
        "3 (5m ago)",
        "30s",
        "10.128.0.9",
        "gpu-0",
        "<none>",
        "<none>",
    ]
    assert row["object"] == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": pod["metadata"],
    }


# ---- nodes, jobs, claims ------------------------------------------------------------------------------


def test_node_status_and_roles() -> None:
    node = {
        "metadata": {
            "name": "n",
            "labels": {"node-role.kubernetes.io/gpu": "", "node-role.kubernetes.io/worker": ""},
        },
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kubeletVersion": "v1.37.0"},
        },
    }
    cells = tables.printer_for(Registry().get("nodes"), "v1").cells(node, NOW)
    assert cells[:2] == ["Ready,SchedulingDisabled", "gpu,worker"] and cells[3] == "v1.37.0"
    node["status"]["conditions"][0]["status"] = "Unknown"
    node["spec"] = {}
    assert tables.node_status(node) == "NotReady"
    assert tables.node_status({"metadata": {}}) == "Unknown"


def test_job_status_completions_and_duration() -> None:
    job = {
        "metadata": {"name": "j", "creationTimestamp": _stamp(600)},
        "spec": {"completions": 4, "parallelism": 2},
        "status": {"succeeded": 1, "startTime": _stamp(590)},
    }
    cells = tables.printer_for(Registry().get("jobs.batch"), "v1").cells(job, NOW)
    assert cells[:4] == ["Running", "1/4", "9m50s", "10m"]
    job["status"]["conditions"] = [{"type": "Complete", "status": "True"}]
    job["status"]["completionTime"] = _stamp(500)
    assert tables.job_status(job) == "Complete"
    assert tables.printer_for(Registry().get("jobs.batch"), "v1").cells(job, NOW)[2] == "90s"


def test_claim_state() -> None:
    claim: dict[str, Any] = {"metadata": {}, "status": {}}
    assert tables.claim_state(claim) == "pending"
    claim["status"] = {"allocation": {"devices": {}}, "reservedFor": [{"name": "p"}]}
    assert tables.claim_state(claim) == "allocated,reserved"


def test_events_have_no_name_column_first() -> None:
    event = {
        "metadata": {"name": "e1", "creationTimestamp": _stamp(10)},
        "involvedObject": {"kind": "Pod", "name": "p"},
        "reason": "Evicted",
        "type": "Warning",
        "message": "drained ",
        "lastTimestamp": _stamp(10),
    }
    table = tables.render_table(
        tables.printer_for(Registry().get("events"), "v1"), [event], tables.TableRequest(), now=NOW
    )
    assert table["rows"][0]["cells"][:7] == ["10s", "Warning", "Evicted", "pod/p", "", "", "drained"]


# ---- CRDs and the default printer ------------------------------------------------------------------------

CRD: dict[str, Any] = {
    "metadata": {"name": "devicequarantines.gpuhealth.io"},
    "spec": {
        "group": "gpuhealth.io",
        "scope": "Cluster",
        "names": {"plural": "devicequarantines", "kind": "DeviceQuarantine"},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
                "additionalPrinterColumns": [
                    {"name": "Node", "type": "string", "jsonPath": ".spec.node"},
                    {"name": "GPUs", "type": "integer", "jsonPath": ".spec.gpus"},
                    {
                        "name": "Ready",
                        "type": "string",
                        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                    },
                    {"name": "First", "type": "string", "jsonPath": ".spec.uuids[0]", "priority": 1},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
            }
        ],
    },
}


def test_crd_printer_columns() -> None:
    printer = tables.printer_for(info_from_crd(CRD), "v1alpha1", CRD)
    obj = {
        "metadata": {"name": "q1", "creationTimestamp": _stamp(90)},
        "spec": {"node": "gpu-0", "gpus": 2, "uuids": ["GPU-1", "GPU-2"]},
        "status": {"conditions": [{"type": "Other", "status": "False"}, {"type": "Ready", "status": "True"}]},
    }
    table = tables.render_table(printer, [obj], tables.TableRequest(include_object="None"), now=NOW)
    assert [(c["name"], c["type"], c["priority"]) for c in table["columnDefinitions"]] == [
        ("Name", "string", 0),
        ("Node", "string", 0),
        ("GPUs", "integer", 0),
        ("Ready", "string", 0),
        ("First", "string", 1),
        ("Age", "string", 0),
    ]
    assert table["rows"] == [{"cells": ["q1", "gpu-0", 2, "True", "GPU-1", "90s"]}]
    bare = tables.render_table(printer, [{"metadata": {"name": "q2"}}], tables.TableRequest(), now=NOW)
    assert bare["rows"][0]["cells"] == ["q2", None, None, None, None, None]


def test_crd_without_printer_columns_shows_name_and_age() -> None:
    crd = json.loads(json.dumps(CRD))
    del crd["spec"]["versions"][0]["additionalPrinterColumns"]
    printer = tables.printer_for(info_from_crd(crd), "v1alpha1", crd)
    assert [c.name for c in printer.columns] == ["Name", "Age"]


def test_jsonpath_subset() -> None:
    assert tables.parse_jsonpath("{.spec.x}") == [("field", "spec"), ("field", "x")]
    with pytest.raises(ValueError, match="unsupported JSONPath"):
        tables.parse_jsonpath(".spec..x")


def test_kinds_without_printer_get_name_and_created_at() -> None:
    printer = tables.printer_for(Registry().get("deviceclasses.resource.k8s.io"), "v1")
    row = tables.table_row(
        printer, {"metadata": {"name": "gpu", "creationTimestamp": _stamp(5)}}, tables.TableRequest(), NOW
    )
    assert [c.name for c in printer.columns] == ["Name", "Created At"] and row["cells"] == ["gpu", _stamp(5)]


# ---- over HTTP ----------------------------------------------------------------------------------------


@pytest.mark.integration
def test_tables_over_http(cluster: ServedCluster) -> None:
    http = urllib3.PoolManager(retries=False)
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1"}, "data": {"a": "1", "b": "2"}}
    made = http.request(
        "POST",
        f"{cluster.url}/api/v1/namespaces/default/configmaps",
        body=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )
    assert made.status == 201
    headers = {"Accept": KUBECTL_ACCEPT}

    listed = http.request("GET", f"{cluster.url}/api/v1/configmaps", headers=headers)
    table = json.loads(listed.data)
    assert listed.status == 200 and table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert table["metadata"]["resourceVersion"]
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Data", "Age"]
    assert [r["cells"][:2] for r in table["rows"]] == [["c1", 2]]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"

    one = json.loads(
        http.request(
            "GET",
            f"{cluster.url}/api/v1/namespaces/default/configmaps/c1?includeObject=Object",
            headers=headers,
        ).data
    )
    assert one["kind"] == "Table" and one["rows"][0]["object"]["data"] == {"a": "1", "b": "2"}

    plain = json.loads(http.request("GET", f"{cluster.url}/api/v1/namespaces/default/configmaps/c1").data)
    assert plain["kind"] == "ConfigMap"

    refused = http.request(
        "GET",
        f"{cluster.url}/api/v1/configmaps",
        headers={"Accept": "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"},
    )
    assert refused.status == 406 and json.loads(refused.data)["reason"] == "NotAcceptable"

    watched = http.request(
        "GET",
        f"{cluster.url}/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1",
        headers=headers,
        preload_content=True,
    )
    events = [json.loads(line) for line in watched.data.splitlines() if line.strip()]
    assert events and events[0]["type"] == "ADDED"
    assert events[0]["object"]["kind"] == "Table" and events[0]["object"]["rows"][0]["cells"][0] == "c1"


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.sampled_from(["", "True", "Ready", "x", "2026-01-01T00:00:00Z"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "metadata",
                    "spec",
                    "status",
                    "name",
                    "state",
                    "running",
                    "waiting",
                    "terminated",
                    "reason",
                    "type",
                    "status",
                    "conditions",
                    "containerStatuses",
                    "initContainerStatuses",
                    "containers",
                    "initContainers",
                    "labels",
                    "ports",
                    "selector",
                    "template",
                    "replicas",
                    "completions",
                    "taint",
                    "deviceSelector",
                    "involvedObject",
                    "series",
                    "source",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "allocation",
                    "reservedFor",
                    "restartCount",
                    "lastState",
                    "finishedAt",
                    "nodeInfo",
                    "addresses",
                    "data",
                    "readinessGates",
                    "matchLabels",
                    "matchExpressions",
                    "spec",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(
    obj=st.dictionaries(
        st.sampled_from(["metadata", "spec", "status", "data", "type"]), _json_values, max_size=4
    )
)
def test_printers_never_fail_on_odd_objects(obj: dict[str, Any]) -> None:
    # Objects the fleet writes skip validation: a malformed one must print, not fail the whole list.
    printers = [*tables.PRINTERS.values(), tables.printer_for(info_from_crd(CRD), "v1alpha1", CRD)]
    printers.append(tables.printer_for(Registry().get("deviceclasses.resource.k8s.io"), "v1"))
    for printer in printers:
        row = tables.table_row(printer, obj, tables.TableRequest(include_object="Object"), NOW)
        assert len(row["cells"]) == len(printer.columns)
