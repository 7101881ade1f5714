"""Protobuf request bodies (what kubectl's typed `create` commands send) decoded by the simulated apiserver.

Aspects: bodies recorded from kubectl 1.37 (`create namespace`, `create configmap` with a binary
file, `create job` with a command) decode to the JSON kubectl would have sent; zero-valued
fields the Go encoder always writes are left out, pointer fields keep their zero; an unknown
field that carries data, an unknown kind or a foreign content encoding is refused with 415
naming the JSON route; truncated or unprefixed bytes are 400; over HTTP a protobuf create is
answered 201 in JSON and the object is stored.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
import urllib3
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.apiserver import protobuf
from simulator.apiserver.errors import ApiError
from simulator.apiserver.protobuf import encode_field, envelope

if TYPE_CHECKING:
    from tests.simulator.conftest import ServedCluster

# Recorded from `kubectl create namespace cap-ns`, `kubectl create configmap cap-cm -n default
# --from-literal=k1=v1 --from-literal=k2=v2 --from-file=bin=<3 bytes 00 01 ff>` and
# `kubectl create job cap-job -n default --image=busybox -- sh -c "echo hi"` (kubectl 1.37).
NAMESPACE = bytes.fromhex(
    "6b3873000a0f0a02763112094e616d657370616365121e0a160a066361702d6e7312001a0022002a003200380042"
    "0012001a020a001a002200"
)
CONFIGMAP = bytes.fromhex(
    "6b3873000a0f0a0276311209436f6e6669674d6170123f0a1d0a066361702d636d12001a0764656661756c742200"
    "2a0032003800420012080a026b311202763112080a026b32120276321a0a0a0362696e12030001ff1a002200"
)
JOB = bytes.fromhex(
    "6b3873000a0f0a0862617463682f763112034a6f62129c010a1e0a076361702d6a6f6212001a0764656661756c74"
    "22002a003200380042001270326e0a100a0012001a0022002a00320038004200125a12370a076361702d6a6f6212"
    "0762757379626f781a0273681a022d631a076563686f2068692a0042006a007200800100880100900100a201001a"
    "054e65766572320042004a0052005800600068008201008a01009a0100c201001a082000280030003a001a002200"
)
PROTOBUF_HEADERS = {
    "Content-Type": "application/vnd.kubernetes.protobuf",
    "Accept": "application/vnd.kubernetes.protobuf,application/json",
}


def test_recorded_namespace() -> None:
    assert protobuf.decode_body(NAMESPACE) == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "cap-ns"},
        "spec": {},
    }


def test_recorded_configmap_with_binary_data() -> None:
    assert protobuf.decode_body(CONFIGMAP) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cap-cm", "namespace": "default"},
        "data": {"k1": "v1", "k2": "v2"},
        "binaryData": {"bin": "AAH/"},
    }


def test_recorded_job_drops_status_and_zero_fields() -> None:
    job = protobuf.decode_body(JOB)
    assert set(job) == {"apiVersion", "kind", "metadata", "spec"}
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container == {
        "name": "cap-job",
        "image": "busybox",
        "command": ["sh", "-c", "echo hi"],
        "resources": {},
    }
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def _deployment(replicas: int) -> bytes:
    meta = (
        encode_field(1, "d")
        + encode_field(3, "default")
        + encode_field(11, encode_field(1, "app") + encode_field(2, "d"))
    )
    selector = encode_field(1, encode_field(1, "app") + encode_field(2, "d"))
    container = (
        encode_field(1, "c")
        + encode_field(2, "img")
        + encode_field(6, encode_field(3, 8080))
        + encode_field(16, 0)
    )
    template = encode_field(2, encode_field(2, container))
    surge = encode_field(1, 1) + encode_field(3, "25%")
    strategy = encode_field(1, "RollingUpdate") + encode_field(2, encode_field(2, surge))
    spec = (
        encode_field(1, replicas)
        + encode_field(2, selector)
        + encode_field(3, template)
        + encode_field(4, strategy)
    )
    return envelope(
        "apps/v1", "Deployment", encode_field(1, meta) + encode_field(2, spec) + encode_field(3, b"")
    )


def test_pointer_fields_keep_zero_and_int_or_string() -> None:
    deployment = protobuf.decode_body(_deployment(0))
    assert deployment["spec"]["replicas"] == 0
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}}
    assert deployment["spec"]["template"]["spec"]["containers"][0]["ports"] == [{"containerPort": 8080}]


def test_pdb_and_service_as_kubectl_create_sends_them() -> None:
    meta = encode_field(1, encode_field(1, "budget") + encode_field(3, "default"))
    selector = encode_field(1, encode_field(1, "app") + encode_field(2, "x"))
    spec = encode_field(1, encode_field(2, 1)) + encode_field(2, selector)
    pdb = protobuf.decode_body(
        envelope("policy/v1", "PodDisruptionBudget", meta + encode_field(2, spec) + encode_field(3, b""))
    )
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": {"app": "x"}}}
    port = (
        encode_field(1, "80-http")
        + encode_field(2, "TCP")
        + encode_field(3, 80)
        + encode_field(4, encode_field(1, 1) + encode_field(3, "http"))
    )
    svc_spec = (
        encode_field(1, port)
        + encode_field(2, encode_field(1, "app") + encode_field(2, "lb"))
        + encode_field(4, "LoadBalancer")
    )
    service = protobuf.decode_body(
        envelope("v1", "Service", encode_field(1, encode_field(1, "lb")) + encode_field(2, svc_spec))
    )
    assert service["spec"] == {
        "ports": [{"name": "80-http", "protocol": "TCP", "port": 80, "targetPort": "http"}],
        "selector": {"app": "lb"},
        "type": "LoadBalancer",
    }


def test_secret_data_is_base64() -> None:
    meta = encode_field(1, encode_field(1, "s"))
    entry = encode_field(2, encode_field(1, "pw") + encode_field(2, b"\x00secret"))
    secret = protobuf.decode_body(envelope("v1", "Secret", meta + entry + encode_field(3, "Opaque")))
    assert secret["data"] == {"pw": "AHNlY3JldA=="} and secret["type"] == "Opaque"


def test_eviction_with_delete_options() -> None:
    options = encode_field(1, 0) + encode_field(2, encode_field(1, "uid-1"))
    body = envelope("policy/v1", "Eviction", encode_field(1, encode_field(1, "p")) + encode_field(2, options))
    assert protobuf.decode_body(body)["deleteOptions"] == {
        "gracePeriodSeconds": 0,
        "preconditions": {"uid": "uid-1"},
    }


def test_unknown_field_with_data_is_refused_but_zero_is_ignored() -> None:
    ok = envelope(
        "v1", "ConfigMap", encode_field(1, encode_field(1, "c")) + encode_field(99, encode_field(1, ""))
    )
    assert protobuf.decode_body(ok)["metadata"] == {"name": "c"}
    bad = envelope(
        "v1", "ConfigMap", encode_field(1, encode_field(1, "c") + encode_field(17, encode_field(1, "mgr")))
    )
    with pytest.raises(ApiError) as exc:
        protobuf.decode_body(bad)
    assert exc.value.code == 415 and "field 17 of ObjectMeta" in exc.value.message
    assert "kubectl apply -f" in exc.value.message


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (envelope("v1", "ReplicationController", b""), 415),
        (
            protobuf.MAGIC
            + encode_field(1, encode_field(1, "v1") + encode_field(2, "ConfigMap"))
            + encode_field(3, "gzip"),
            415,
        ),
        (b"\x0a\x02hi", 400),
        (NAMESPACE[:-9], 400),
        (protobuf.MAGIC + b"\x0f", 400),
    ],
)
def test_bad_bodies(body: bytes, code: int) -> None:
    with pytest.raises(ApiError) as exc:
        protobuf.decode_body(body)
    assert exc.value.code == code


@pytest.mark.integration
def test_protobuf_create_over_http(cluster: ServedCluster) -> None:
    http = urllib3.PoolManager(retries=False)
    made = http.request(
        "POST",
        f"{cluster.url}/api/v1/namespaces/default/configmaps",
        body=CONFIGMAP,
        headers=PROTOBUF_HEADERS,
    )
    assert made.status == 201 and made.headers["Content-Type"].startswith("application/json")
    assert json.loads(made.data)["binaryData"] == {"bin": "AAH/"}
    ns = http.request("POST", f"{cluster.url}/api/v1/namespaces", body=NAMESPACE, headers=PROTOBUF_HEADERS)
    assert ns.status == 201 and json.loads(ns.data)["metadata"]["name"] == "cap-ns"
    refused = http.request(
        "POST",
        f"{cluster.url}/api/v1/namespaces",
        body=envelope("v1", "Binding", b""),
        headers=PROTOBUF_HEADERS,
    )
    assert refused.status == 415 and json.loads(refused.data)["reason"] == "UnsupportedMediaType"


@settings(max_examples=400, deadline=None)
@given(tail=st.binary(max_size=200), kind=st.sampled_from(sorted(protobuf.KINDS)))
def test_any_bytes_decode_or_get_a_status(tail: bytes, kind: tuple[str, str]) -> None:
    for body in (protobuf.MAGIC + tail, envelope(kind[0], kind[1], tail)):
        try:
            decoded = protobuf.decode_body(body)
        except ApiError as err:
            assert err.code in (400, 415)
        else:
            assert isinstance(decoded, dict) and "kind" in decoded
