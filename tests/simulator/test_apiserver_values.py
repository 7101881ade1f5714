"""Value validation of API clients' writes: the apiserver's 422 texts, causes and immutable fields.

Aspects: object names (subdomain for pods, label for namespaces) with the apiserver's message;
required fields (no spec, no containers, empty image); enums (restartPolicy); quantities that do
not parse (the decoder's 400); duplicate container names; label syntax; several errors joined in
brackets with one cause each and their reasons; Status bodies in the apiserver's field order;
immutable fields on update (a bound pod's nodeName, a strategic-merge patch adding a port, a
Job's selector, an immutable ConfigMap's data, a ResourceClaim's spec) while a pod's image and
added tolerations may change; a Job template's defaulted restartPolicy refused; CRD schema
failures worded as the apiserver's; the simulator's own writes (`validate=False`) are not checked;
kubectl prints the same errors as against a real cluster and `kubectl apply` may change an image
but not a restartPolicy; Deployment selectors, templates and
counts, PodDisruptionBudget, Lease and taint checks; status writes check only metadata; a value
of the wrong JSON type in a built-in kind is the decoder's 400 `json: cannot unmarshal ...`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuhealth.clock import ManualClock
from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import Store
from simulator.apiserver.values import LABEL_MSG, SUBDOMAIN_MSG, parse_quantity, validate_object
from tests.simulator.conftest import ServedCluster


@pytest.fixture
def store() -> Store:
    return Store(ManualClock(), seed=1)


def _pod(name: str = "p", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.example/infer:1"}]}
    body.update(spec)
    return {"metadata": {"name": name}, "spec": body}


def _error(fn: Callable[[], Any]) -> ApiError:
    with pytest.raises(ApiError) as exc:
        fn()
    return exc.value


def test_a_bad_pod_name_is_422_with_the_apiservers_message(store: Store) -> None:
    err = _error(lambda: store.create("pods", _pod("Bad_Pod"), namespace="default"))
    assert err.code == 422 and err.reason == "Invalid"
    assert (
        err.message == f'Pod "Bad_Pod" is invalid: metadata.name: Invalid value: "Bad_Pod": {SUBDOMAIN_MSG}'
    )
    assert err.details == {
        "name": "Bad_Pod",
        "kind": "Pod",
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": f'Invalid value: "Bad_Pod": {SUBDOMAIN_MSG}',
                "field": "metadata.name",
            }
        ],
    }
    status = err.status()
    assert list(status) == [
        "kind",
        "apiVersion",
        "metadata",
        "status",
        "message",
        "reason",
        "details",
        "code",
    ]


def test_namespace_names_are_dns_labels(store: Store) -> None:
    err = _error(lambda: store.create("namespaces", {"metadata": {"name": "team.a"}}))
    assert (
        err.message == f'Namespace "team.a" is invalid: metadata.name: Invalid value: "team.a": {LABEL_MSG}'
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, "spec.containers: Required value"),
        ({"containers": []}, "spec.containers: Required value"),
        ({"containers": [{"name": "main", "image": ""}]}, "spec.containers[0].image: Required value"),
        (
            {"containers": [{"name": "main", "image": "i"}], "restartPolicy": "Sometimes"},
            'spec.restartPolicy: Unsupported value: "Sometimes": '
            'supported values: "Always", "OnFailure", "Never"',
        ),
        (
            {"containers": [{"name": "a", "image": "i"}, {"name": "a", "image": "j"}]},
            'spec.containers[1].name: Duplicate value: "a"',
        ),
    ],
    ids=["no-spec", "no-containers", "empty-image", "restart-policy", "duplicate-names"],
)
def test_pod_spec_errors(store: Store, spec: Any, expected: str) -> None:
    body: dict[str, Any] = {"metadata": {"name": "p"}}
    if spec is not None:
        body["spec"] = spec
    err = _error(lambda: store.create("pods", body, namespace="default"))
    assert err.code == 422 and err.message == f'Pod "p" is invalid: {expected}'


def test_several_errors_are_joined_in_brackets_each_with_its_cause(store: Store) -> None:
    body = _pod(restartPolicy="Sometimes")
    body["spec"]["containers"][0]["image"] = ""
    body["metadata"]["labels"] = {"bad key!": "v"}
    err = _error(lambda: store.create("pods", body, namespace="default"))
    assert err.message.startswith(
        'Pod "p" is invalid: [metadata.labels: Invalid value: "bad key!": name part'
    )
    assert err.message.endswith("]")
    reasons = {c["field"]: c["reason"] for c in (err.details or {})["causes"]}
    assert reasons == {
        "metadata.labels": "FieldValueInvalid",
        "spec.containers[0].image": "FieldValueRequired",
        "spec.restartPolicy": "FieldValueNotSupported",
    }


def test_a_quantity_that_does_not_parse_is_the_decoders_400(store: Store) -> None:
    body = _pod()
    body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "abc"}}
    err = _error(lambda: store.create("pods", body, namespace="default"))
    assert (err.code, err.reason) == (400, "BadRequest")
    assert err.message == (
        'Pod in version "v1" cannot be handled as a Pod: quantities must match the regular expression '
        "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )
    assert (
        parse_quantity("100m") * 10 == 1 and parse_quantity("1Gi") == 2**30 and parse_quantity("1e3") == 1000
    )


def test_requests_above_limits_are_refused(store: Store) -> None:
    body = _pod()
    body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
    err = _error(lambda: store.create("pods", body, namespace="default"))
    assert err.message.endswith(
        'spec.containers[0].resources.requests: Invalid value: "2": '
        "must be less than or equal to cpu limit of 1"
    )


def test_a_bound_pods_spec_is_immutable_but_image_and_added_tolerations_may_change(store: Store) -> None:
    store.create("pods", _pod(nodeName="node-a"), namespace="default")

    def change(fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        current = store.get("pods", "p", "default")
        fn(current)
        return store.update("pods", current)

    def move(pod: dict[str, Any]) -> None:
        pod["spec"]["nodeName"] = "node-b"

    err = _error(lambda: change(move))
    assert err.message.startswith(
        'Pod "p" is invalid: spec: Forbidden: pod updates may not change fields other than '
        "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
        "`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
        "(allow it to be set to 1 if it was previously negative)"
    )
    assert "nodeName" in err.message

    def new_image(pod: dict[str, Any]) -> None:
        pod["spec"]["containers"][0]["image"] = "registry.example/infer:2"
        pod["spec"]["tolerations"].append({"key": "k", "operator": "Exists", "effect": "NoSchedule"})

    assert change(new_image)["spec"]["containers"][0]["image"] == "registry.example/infer:2"

    def drop_toleration(pod: dict[str, Any]) -> None:
        pod["spec"]["tolerations"] = pod["spec"]["tolerations"][1:]

    assert _error(lambda: change(drop_toleration)).code == 422


def test_a_strategic_merge_patch_adding_a_port_to_a_running_pod_is_forbidden(store: Store) -> None:
    store.create("pods", _pod(), namespace="default")
    patch = {"spec": {"containers": [{"name": "main", "ports": [{"containerPort": 8080}]}]}}
    err = _error(lambda: store.patch("pods", "p", "default", patch, "application/strategic-merge-patch+json"))
    assert err.code == 422
    assert err.message.startswith('Pod "p" is invalid: spec: Forbidden: pod updates may not change fields')


def test_fleet_written_pods_take_label_patches(store: Store) -> None:
    # The simulator's own pods skip defaulting; a client's later write must not see defaults as changes.
    store.create("pods", _pod(nodeName="node-a"), namespace="default", validate=False)
    patched = store.patch(
        "pods", "p", "default", {"metadata": {"labels": {"a": "b"}}}, "application/merge-patch+json"
    )
    assert patched["metadata"]["labels"] == {"a": "b"}


def _job(name: str = "j", restart: str | None = "Never") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "w", "image": "i"}]}
    if restart:
        spec["restartPolicy"] = restart
    return {"metadata": {"name": name}, "spec": {"template": {"spec": spec}}}


def test_job_selector_and_template_are_immutable(store: Store) -> None:
    job = store.create("jobs.batch", _job(), namespace="default")
    assert job["spec"]["selector"] == {
        "matchLabels": {"batch.kubernetes.io/controller-uid": job["metadata"]["uid"]}
    }
    job["spec"]["template"]["spec"]["containers"][0]["image"] = "other"
    err = _error(lambda: store.update("jobs.batch", job))
    assert err.message.startswith('Job.batch "j" is invalid: spec.template: Invalid value: ')
    assert err.message.endswith(": field is immutable")


def test_a_job_templates_defaulted_restart_policy_is_refused(store: Store) -> None:
    err = _error(lambda: store.create("jobs.batch", _job(restart=None), namespace="default"))
    assert err.message == (
        'Job.batch "j" is invalid: spec.template.spec.restartPolicy: Unsupported value: "Always": '
        'supported values: "OnFailure", "Never"'
    )


def test_an_immutable_configmaps_data_cannot_change(store: Store) -> None:
    cm = store.create(
        "configmaps", {"metadata": {"name": "c"}, "data": {"a": "1"}, "immutable": True}, namespace="default"
    )
    cm["data"]["a"] = "2"
    err = _error(lambda: store.update("configmaps", cm))
    assert (
        err.message == 'ConfigMap "c" is invalid: data: Forbidden: field is immutable when `immutable` is set'
    )
    bad_key = _error(
        lambda: store.create(
            "configmaps", {"metadata": {"name": "d"}, "data": {"a b": "1"}}, namespace="default"
        )
    )
    assert 'data[a b]: Invalid value: "a b": a valid config key must consist of' in bad_key.message


def test_a_resource_claims_spec_is_immutable(store: Store) -> None:
    claim = {
        "metadata": {"name": "c"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}
        },
    }
    stored = store.create("resourceclaims.resource.k8s.io", claim, namespace="default")
    stored["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "other.example.com"
    err = _error(lambda: store.update("resourceclaims.resource.k8s.io", stored))
    assert err.message.startswith('ResourceClaim.resource.k8s.io "c" is invalid: spec: Invalid value: ')
    assert err.message.endswith("field is immutable")


def test_the_simulators_own_writes_are_not_checked(store: Store) -> None:
    assert store.create("pods", _pod("Not_Checked"), namespace="default", validate=False)


@pytest.mark.integration
def test_crd_schema_failures_read_like_the_apiservers(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["count"],
                "properties": {
                    "color": {"type": "string", "enum": ["red", "blue"]},
                    "count": {"type": "integer", "minimum": 0},
                },
            }
        },
    }
    ext.create_custom_resource_definition(
        {
            "metadata": {"name": "paints.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "paints", "singular": "paint", "kind": "Paint"},
                "versions": [
                    {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
                ],
            },
        }
    )
    custom = client.CustomObjectsApi(api)

    def create(spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": "example.com/v1", "kind": "Paint", "metadata": {"name": "p"}, "spec": spec}
        with pytest.raises(ApiException) as exc:
            custom.create_namespaced_custom_object("example.com", "v1", "default", "paints", body)
        assert exc.value.status == 422
        status: dict[str, Any] = json.loads(exc.value.body)
        return status

    assert create({"color": "green", "count": 1})["message"] == (
        'Paint.example.com "p" is invalid: spec.color: Unsupported value: "green": '
        'supported values: "red", "blue"'
    )
    assert create({"count": "string"})["message"] == (
        'Paint.example.com "p" is invalid: spec.count: Invalid value: "string": '
        'spec.count in body must be of type integer: "string"'
    )
    missing = create({"color": "red"})
    assert missing["message"] == 'Paint.example.com "p" is invalid: spec.count: Required value'
    assert missing["details"]["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.count"}
    ]
    assert create({"count": -1})["message"].endswith(
        "spec.count: Invalid value: -1: spec.count in body should be greater than or equal to 0"
    )


@pytest.mark.integration
def test_a_bad_name_through_the_official_client(api: client.ApiClient, make_pod: Callable[..., Any]) -> None:
    with pytest.raises(ApiException) as exc:
        client.CoreV1Api(api).create_namespaced_pod("default", make_pod("Bad_Pod"))
    status = json.loads(exc.value.body)
    assert exc.value.status == 422 and status["reason"] == "Invalid"
    assert status["message"].startswith('Pod "Bad_Pod" is invalid: metadata.name: Invalid value: "Bad_Pod"')


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_reports_the_apiservers_errors(cluster: ServedCluster, make_pod: Callable[..., Any]) -> None:
    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        command = ["kubectl", "--kubeconfig", str(cluster.kubeconfig), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    bad = kubectl("run", "Bad_Pod", "--image=registry.example/infer:1")
    assert bad.returncode == 1
    assert 'metadata.name: Invalid value: "Bad_Pod": a lowercase RFC 1123 subdomain' in bad.stderr
    cluster.call(lambda: cluster.store.create("pods", make_pod("p"), namespace="default"))
    port = '{"spec":{"containers":[{"name":"main","ports":[{"containerPort":8080}]}]}}'
    refused = kubectl("patch", "pod", "p", "-p", port)
    assert refused.returncode == 1
    assert (
        'The Pod "p" is invalid: spec: Forbidden: pod updates may not change fields other than'
        in refused.stderr
    )


def test_status_writes_check_only_what_they_may_change(store: Store) -> None:
    # A Job the simulator wrote without a selector still takes a client's status write.
    job = _job()
    store.create("jobs.batch", {**job, "metadata": {"name": "j", "namespace": "default"}}, validate=False)
    patched = store.patch(
        "jobs.batch",
        "j",
        "default",
        {"status": {"active": 1}},
        "application/merge-patch+json",
        subresource="status",
    )
    assert patched["status"] == {"active": 1} and "selector" not in patched["spec"]


def _template(labels: dict[str, str], restart: str = "Always") -> dict[str, Any]:
    containers = [{"name": "c", "image": "i:1"}]
    return {"metadata": {"labels": labels}, "spec": {"restartPolicy": restart, "containers": containers}}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"template": _template({"app": "a"})}, [("spec.selector", "Required value")]),
        (
            {"selector": {"matchLabels": {"app": "b"}}, "template": _template({"app": "a"})},
            [
                (
                    "spec.template.metadata.labels",
                    'Invalid value: {"app":"a"}: `selector` does not match template `labels`',
                )
            ],
        ),
        (
            {"selector": {"matchLabels": {"app": "a"}}, "template": _template({"app": "a"}, "Never")},
            [("spec.template.spec.restartPolicy", 'Unsupported value: "Never": supported values: "Always"')],
        ),
        (
            {"replicas": -1, "selector": {"matchLabels": {"app": "a"}}, "template": _template({"app": "a"})},
            [("spec.replicas", "Invalid value: -1: must be greater than or equal to 0")],
        ),
    ],
    ids=["no-selector", "selector-mismatch", "restart-never", "negative-replicas"],
)
def test_deployment_values(spec: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    assert validate_object("deployments.apps", {"metadata": {"name": "d"}, "spec": spec}) == expected


def test_budgets_leases_and_taints(store: Store) -> None:
    both = {"metadata": {"name": "b"}, "spec": {"minAvailable": 1, "maxUnavailable": "10%"}}
    assert validate_object("poddisruptionbudgets.policy", both)[0][1].endswith(
        "minAvailable and maxUnavailable cannot be both set"
    )
    percent = {"metadata": {"name": "b"}, "spec": {"minAvailable": "ten"}}
    assert validate_object("poddisruptionbudgets.policy", percent)[0][0] == "spec.minAvailable"
    lease = {"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 0}}
    assert validate_object("leases.coordination.k8s.io", lease) == [
        ("spec.leaseDurationSeconds", "Invalid value: 0: must be greater than 0")
    ]
    node = {"metadata": {"name": "n"}, "spec": {"taints": [{"key": "gpu", "effect": "Sometimes"}]}}
    assert validate_object("nodes", node) == [
        (
            "spec.taints[0].effect",
            'Unsupported value: "Sometimes": supported values: "NoSchedule", "PreferNoSchedule", "NoExecute"',
        )
    ]
    rule = {
        "metadata": {"name": "r"},
        "spec": {"taint": {"key": "gpu.example.com/xid", "effect": "NoExecute"}},
    }
    assert validate_object("devicetaintrules.resource.k8s.io", rule) == []


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_apply_changes_an_image_but_not_the_restart_policy(
    cluster: ServedCluster, tmp_path: Path, make_pod: Callable[..., Any]
) -> None:
    manifest = tmp_path / "pod.json"
    pod = make_pod("p")

    def apply(*extra: str) -> subprocess.CompletedProcess[str]:
        manifest.write_text(json.dumps(pod))
        command = ["kubectl", "--kubeconfig", str(cluster.kubeconfig), "apply", "-f", str(manifest)]
        return subprocess.run(
            [*command, "--validate=false", *extra], capture_output=True, text=True, timeout=60
        )

    assert apply().stdout.strip() == "pod/p created"
    pod["spec"]["containers"][0]["image"] = "registry.example/infer:2"
    assert apply("--dry-run=server").stdout.strip() == "pod/p configured (server dry run)"
    assert apply().stdout.strip() == "pod/p configured"
    pod["spec"]["restartPolicy"] = "Never"
    refused = apply()
    assert refused.returncode == 1 and 'restartPolicy: "Never"' in refused.stderr
    stored = cluster.call(lambda: cluster.store.get("pods", "p", "default"))
    assert (stored["spec"]["restartPolicy"], stored["spec"]["containers"][0]["image"]) == (
        "Always",
        "registry.example/infer:2",
    )


def test_not_found_and_conflict_bodies_keep_the_apiservers_order(store: Store) -> None:
    missing = _error(lambda: store.get("leases.coordination.k8s.io", "l", "default")).status()
    assert list(missing) == [
        "kind",
        "apiVersion",
        "metadata",
        "status",
        "message",
        "reason",
        "details",
        "code",
    ]
    assert missing["details"] == {"name": "l", "group": "coordination.k8s.io", "kind": "leases"}
    assert list(missing["details"]) == ["name", "group", "kind"]


@pytest.mark.parametrize(
    ("spec", "labels", "problem"),
    [
        (
            {"containers": [{"name": "m", "image": 5}]},
            None,
            "json: cannot unmarshal number into Go struct field Container.spec.containers.image "
            "of type string",
        ),
        (
            {"containers": "x"},
            None,
            "json: cannot unmarshal string into Go struct field PodSpec.spec.containers "
            "of type []v1.Container",
        ),
        (
            {"containers": [{"name": "m", "image": "i"}]},
            {"a": 1},
            "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type string",
        ),
        (
            {"activeDeadlineSeconds": 1.5, "containers": [{"name": "m", "image": "i"}]},
            None,
            "json: cannot unmarshal number 1.5 into Go struct field PodSpec.spec.activeDeadlineSeconds "
            "of type int64",
        ),
    ],
    ids=["image-number", "containers-string", "label-number", "float-for-int"],
)
def test_a_value_of_the_wrong_json_type_is_the_decoders_400(
    store: Store, spec: dict[str, Any], labels: dict[str, Any] | None, problem: str
) -> None:
    body: dict[str, Any] = {"metadata": {"name": "p"}, "spec": spec}
    if labels:
        body["metadata"]["labels"] = labels
    err = _error(lambda: store.create("pods", body, namespace="default"))
    assert (err.code, err.reason) == (400, "BadRequest")
    assert err.message == f'Pod in version "v1" cannot be handled as a Pod: {problem}'


def test_a_status_write_may_report_only_devices_a_container_asks_for(store: Store) -> None:
    # As the real API server (kubernetes validation of allocatedResourcesStatus): a container's
    # entry names a resource it requests or one of its own claims; IDs once; a known health.
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    spec = {
        "containers": [
            {"name": "main", "image": "i:1", "resources": gpu},
            {"name": "sidecar", "image": "i:1"},
            {"name": "dra", "image": "i:1", "resources": {"claims": [{"name": "gpus", "request": "gpus"}]}},
        ],
        "resourceClaims": [{"name": "gpus", "resourceClaimName": "c"}],
    }
    store.create("pods", {**_pod("p", **spec)}, namespace="default")

    def report(name: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        status = {"name": name, "ready": True, "restartCount": 0, "image": "i:1", "imageID": "i@sha256:0"}
        return {"status": {"containerStatuses": [{**status, "allocatedResourcesStatus": entries}]}}

    def write(body: dict[str, Any]) -> Any:
        return store.patch("pods", "p", "default", body, "application/merge-patch+json", subresource="status")

    ok = [{"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-a", "health": "Healthy"}]}]
    assert write(report("main", ok))["status"]["containerStatuses"][0]["allocatedResourcesStatus"] == ok
    err = _error(lambda: write(report("sidecar", ok)))
    assert err.code == 422
    assert err.details["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "nvidia.com/gpu": '
            "must match one of the container's resource requests",
            "field": "status.containerStatuses[0].allocatedResourcesStatus[0].name",
        }
    ]
    claim = [
        {"name": "claim:gpus", "resources": [{"resourceID": "gpu.example.com/n/gpu-0", "health": "Healthy"}]}
    ]
    err = _error(lambda: write(report("dra", claim)))
    assert "must match one of the container's resource claims" in err.message
    write(report("dra", [{**claim[0], "name": "claim:gpus/gpus"}]))
    twice = [{"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-a", "health": "Sick"}] * 2}]
    causes = {
        c["field"]: c["message"] for c in _error(lambda: write(report("main", twice))).details["causes"]
    }
    prefix = "status.containerStatuses[0].allocatedResourcesStatus[0].resources"
    assert causes[f"{prefix}[1].resourceID"] == 'Duplicate value: "GPU-a"'
    assert causes[f"{prefix}[0].health"].startswith('Unsupported value: "Sick"')


def test_the_simulated_kubelets_own_status_writes_meet_the_same_check(store: Store) -> None:
    # The real API server checks the kubelet's writes as any client's: a container may not be
    # given devices it does not ask for (the check that found the DRA probe's judge container
    # reported a claim it did not name, on the real control plane only, before this).
    spec = {"containers": [{"name": "judge", "image": "i:1"}], "resourceClaims": [{"name": "gpu"}]}
    store.create("pods", _pod("p", **spec), namespace="default", validate=False)

    def give(obj: dict[str, Any]) -> dict[str, Any]:
        entry = {"name": "claim:gpu", "resources": [{"resourceID": "d/n/gpu-0", "health": "Healthy"}]}
        obj["status"] = {"containerStatuses": [{"name": "judge", "allocatedResourcesStatus": [entry]}]}
        return obj

    err = _error(lambda: store.mutate("pods", "p", "default", give, subresource="status"))
    assert err.code == 422 and "must match one of the container's resource claims" in err.message
