"""API faults of the simulated apiserver (`simulator/apiserver/faults.py`).

Aspects, decisions (pure): which verbs a kind applies to (a Conflict only to writes with a
precondition), resources by plural or plural.group, `gone` only for a watch that resumes,
limits, the same seed giving the same faults and a probability that holds over many draws,
every bad configuration refused naming its field. Over HTTP (integration): 500 and 503
(Retry-After) Status bodies the typed client classifies, 409 Conflict on a conditional write
only, 429 with Retry-After, a slow answer, a watch cut off mid-stream, 410 Gone as an ERROR
event on resume, requests back to normal once faults are cleared; the admin endpoint
(`/simulator/v1/api-faults`: read, replace, clear, token, bad bodies), the Python hook
(`SimulatedCluster.api_faults` through `ClusterHandle.call`) and the cluster's clock step
(`/simulator/v1/clock/step`); and the product's reflector, under every fault at once, still
ends up holding the whole collection.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from gpuhealth.clock import SteppableClock
from gpuhealth.kube.backoff import BackoffSettings
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.errors import Conflict, NotFound, TooManyRequests, Unavailable
from gpuhealth.kube.reflector import Events, Listed, Message, Reflector, WatchRestarted
from gpuhealth.kube.resources import POD, Resource
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import wait_until
from simulator.apiserver.app import FAULTS, WATCHES, ServerSettings
from simulator.apiserver.faults import (
    FaultConfigError,
    FaultInjector,
    FaultRule,
    is_conditional,
    parse_config,
    rule_from_json,
    rule_to_json,
    verb_of,
)
from simulator.testing import running_cluster
from tests.simulator.conftest import ServedCluster, pod_manifest

# ---- decisions ---------------------------------------------------------------------------------


def test_verbs_of_requests() -> None:
    assert verb_of("GET", named=True, subresource=None, watch=False) == "get"
    assert verb_of("GET", named=False, subresource=None, watch=False) == "list"
    assert verb_of("GET", named=False, subresource=None, watch=True) == "watch"
    assert verb_of("POST", named=False, subresource=None, watch=False) == "create"
    assert verb_of("POST", named=True, subresource="eviction", watch=False) == "create"
    assert verb_of("PUT", named=True, subresource="status", watch=False) == "update"
    assert verb_of("PATCH", named=True, subresource=None, watch=False) == "patch"
    assert verb_of("DELETE", named=True, subresource=None, watch=False) == "delete"
    assert verb_of("DELETE", named=False, subresource=None, watch=False) == "deletecollection"
    assert verb_of("OPTIONS", named=True, subresource=None, watch=False) is None


def test_a_conflict_hits_conditional_writes_only_and_gone_only_a_resuming_watch() -> None:
    injector = FaultInjector(rules=(FaultRule("conflict"), FaultRule("gone")))
    assert injector.decide("get", "pods", "pods", conditional=True) is None
    assert injector.decide("create", "pods", "pods", conditional=True) is None  # AlreadyExists, not this
    assert injector.decide("patch", "pods", "pods") is None  # unconditional: the apiserver retries it
    for verb in ("update", "patch", "delete"):
        fault = injector.decide(verb, "pods", "pods", conditional=True)
        assert fault is not None and fault.rule.kind == "conflict"
    assert injector.decide("watch", "pods", "pods", resume=False) is None
    fault = injector.decide("watch", "pods", "pods", resume=True)
    assert fault is not None and fault.rule.kind == "gone"
    assert injector.injected == {"api-409": 3, "api-410": 1}


@pytest.mark.parametrize(
    ("verb", "body", "conditional"),
    [
        ("update", b'{"metadata": {"name": "p", "resourceVersion": "12"}}', True),
        ("update", b'{"metadata": {"name": "p"}}', False),
        ("patch", b'{"metadata": {"resourceVersion": "12", "labels": {"a": "b"}}}', True),
        ("patch", b'{"metadata": {"labels": {"a": "b"}}}', False),
        ("patch", b'[{"op": "test", "path": "/metadata/resourceVersion", "value": "3"}]', True),
        ("patch", b'[{"op": "replace", "path": "/spec/x", "value": 1}]', False),
        ("delete", b'{"preconditions": {"uid": "u-1"}}', True),
        ("delete", b'{"propagationPolicy": "Background"}', False),
        ("delete", b"", False),
        ("update", b"\x0bk8s\x00 protobuf", False),
    ],
)
def test_which_writes_are_conditional(verb: str, body: bytes, conditional: bool) -> None:
    assert is_conditional(verb, body) is conditional


def test_resources_match_by_plural_or_plural_and_group_and_the_first_rule_wins() -> None:
    injector = FaultInjector(
        rules=(
            FaultRule("error", code=503, resources=frozenset({"leases.coordination.k8s.io"})),
            FaultRule("throttle", resources=frozenset({"pods"})),
        )
    )
    lease = injector.decide("get", "leases.coordination.k8s.io", "leases")
    assert lease is not None and lease.rule.code == 503
    pod = injector.decide("list", "pods", "pods")
    assert pod is not None and pod.rule.kind == "throttle"
    assert injector.decide("list", "nodes", "nodes") is None


def test_a_limit_caps_a_rule_and_a_new_configuration_starts_its_count_again() -> None:
    injector = FaultInjector(rules=(FaultRule("error", limit=2),))
    assert [injector.decide("get", "pods", "pods") is not None for _ in range(4)] == [
        True,
        True,
        False,
        False,
    ]
    injector.configure((FaultRule("error", limit=1),))
    assert injector.decide("get", "pods", "pods") is not None
    assert injector.injected == {"api-500": 3}
    injector.clear()
    assert not injector.active and injector.decide("get", "pods", "pods") is None


def test_at_least_injects_the_first_matches_whatever_the_draw_while_the_rule_stays() -> None:
    sure = FaultRule("throttle", probability=0.0, at_least=2)
    injector = FaultInjector(rules=(sure,))
    assert injector.decide("create", "pods", "pods", conditional=False) is not None
    # Configured again with the rule still in it (a chaos window opening beside it): still owed one.
    injector.configure((FaultRule("slow", verbs=frozenset({"watch"})), sure))
    assert [injector.decide("get", "pods", "pods") is not None for _ in range(3)] == [True, False, False]
    injector.configure(())
    injector.configure((sure,))  # gone, then configured anew: a new window owes its own
    assert injector.decide("get", "pods", "pods") is not None
    assert injector.injected == {"api-429": 3}


def test_the_same_seed_gives_the_same_faults_and_the_probability_holds() -> None:
    def draws(seed: int) -> list[bool]:
        injector = FaultInjector(seed=seed, rules=(FaultRule("slow", probability=0.25),))
        return [injector.decide("get", "pods", "pods") is not None for _ in range(2000)]

    first = draws(11)
    assert first == draws(11)
    assert first != draws(12)
    assert 400 < sum(first) < 600  # 500 expected; the bounds are about 4.5 standard deviations


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"kind": "explode"}, "rules[0].kind: expected one of error, conflict"),
        ({"probability": 1}, "rules[0].kind: required"),
        ({"kind": "error", "code": 404}, "rules[0].code: expected one of 500, 503, got 404"),
        ({"kind": "error", "probability": 1.5}, "rules[0].probability: expected a number from 0 to 1"),
        ({"kind": "error", "probability": "often"}, "rules[0].probability: expected a number"),
        (
            {"kind": "conflict", "verbs": ["get"]},
            "rules[0].verbs: a conflict fault applies only to",
        ),
        ({"kind": "slow", "verbs": ["fetch"]}, "rules[0].verbs: 'fetch' is not one of get"),
        ({"kind": "slow", "delay": -1}, "rules[0].delay: expected wall seconds of 0 or more"),
        ({"kind": "throttle", "retryAfter": 0}, "rules[0].retryAfter: expected whole seconds of 1 or more"),
        ({"kind": "throttle", "limit": 0}, "rules[0].limit: expected a whole number of 1 or more"),
        ({"kind": "gone", "atLeast": -1}, "rules[0].atLeast: expected a whole number from 0 to the limit"),
        ({"kind": "gone", "atLeast": 3, "limit": 2}, "rules[0].atLeast: expected a whole number from 0"),
        ({"kind": "slow", "resources": "pods"}, "rules[0].resources: expected a list of names"),
        ({"kind": "slow", "every": 2}, "rules[0].every: unknown field"),
    ],
)
def test_bad_rules_are_refused_naming_the_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(FaultConfigError) as err:
        parse_config({"rules": [raw]})
    assert str(err.value).startswith(message)


def test_configuration_shape_and_round_trip() -> None:
    with pytest.raises(FaultConfigError, match="rules: expected a list"):
        parse_config({"seed": 1})
    with pytest.raises(FaultConfigError, match="seed: expected a whole number"):
        parse_config({"seed": "x", "rules": []})
    with pytest.raises(FaultConfigError, match="when: unknown field"):
        parse_config({"rules": [], "when": 1})
    seed, rules = parse_config(
        {
            "seed": 3,
            "rules": [
                {"kind": "error", "code": 503, "retryAfter": 4, "verbs": ["list"], "probability": 0.5},
                {"kind": "drop-watch", "after": 2.5, "resources": ["pods"], "limit": 3, "atLeast": 1},
            ],
        }
    )
    assert seed == 3
    assert [rule_from_json(rule_to_json(r)) for r in rules] == list(rules)


# ---- over HTTP ---------------------------------------------------------------------------------


@pytest.fixture
def served(make_cluster: Callable[..., ServedCluster]) -> ServedCluster:
    return make_cluster(settings=ServerSettings(bookmark_interval_seconds=0.2))


@pytest.fixture
def kube(served: ServedCluster) -> Iterator[KubeClient]:
    api = api_client(str(served.kubeconfig))
    kube = KubeClient(KubeTransport(api), connect_timeout_seconds=5, read_timeout_seconds=10)
    yield kube
    kube.close()
    api.close()


def _injector(served: ServedCluster) -> FaultInjector:
    return served._runner.app[FAULTS]


def _configure(served: ServedCluster, *rules: FaultRule) -> None:
    served.call(lambda: _injector(served).configure(rules, seed=5))


@pytest.mark.integration
def test_errors_come_as_status_bodies_the_client_classifies(served: ServedCluster, kube: KubeClient) -> None:
    kube.create(POD, pod_manifest("p"), namespace="default")
    _configure(
        served,
        FaultRule("error", code=503, retry_after_seconds=3, verbs=frozenset({"get"}), limit=1),
        FaultRule("error", code=500, verbs=frozenset({"get"}), limit=1),
        FaultRule("throttle", retry_after_seconds=2, verbs=frozenset({"list"}), limit=1),
        FaultRule("conflict", limit=1),
    )
    with pytest.raises(Unavailable) as unavailable:
        kube.get(POD, "p", namespace="default")
    assert unavailable.value.status == 503 and unavailable.value.retry_after == 3
    with pytest.raises(Unavailable) as internal:
        kube.get(POD, "p", namespace="default")
    assert internal.value.status == 500 and internal.value.reason == "InternalError"
    assert kube.get(POD, "p", namespace="default")["metadata"]["name"] == "p"  # both limits spent
    with pytest.raises(TooManyRequests) as throttled:
        kube.list(POD, namespace="default")
    assert throttled.value.retry_after == 2
    unconditional = kube.patch(POD, "p", {"metadata": {"annotations": {"y": "2"}}}, namespace="default")
    assert unconditional["metadata"]["annotations"] == {"y": "2"}  # no precondition: no Conflict
    pod = kube.get(POD, "p", namespace="default")
    pod["metadata"]["labels"] = {"x": "1"}
    with pytest.raises(Conflict) as conflicted:
        kube.update(POD, pod)
    assert 'pods "p"' in conflicted.value.message
    assert kube.update(POD, pod)["metadata"]["labels"] == {"x": "1"}  # nothing was written by the fault
    assert served.call(lambda: dict(_injector(served).injected)) == {
        "api-503": 1,
        "api-500": 1,
        "api-429": 1,
        "api-409": 1,
    }


JOBS = Resource("batch", "v1", "jobs", namespaced=True)


def _job(name: str) -> dict[str, Any]:
    container = {"name": "main", "image": "registry.example/check:1"}
    template = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"template": template},
    }


@pytest.mark.integration
def test_a_delete_keeps_its_options_while_a_conflict_rule_reads_its_body(
    served: ServedCluster, kube: KubeClient
) -> None:
    # The conflict rule reads a write's body to tell a conditional one; the handler must still
    # read the same DeleteOptions. It read none once (aiohttp's `can_read_body` is False after a
    # read), so in an `api-409` window a Job deleted with propagationPolicy Background was
    # deleted with the default for Jobs, Orphan: its pods lost their ownerReferences and lived on
    # (`docs/reliability.md`, finding 5), and a delete's preconditions were ignored.
    served.call(lambda: setattr(served.store, "finalizing_controllers", True))  # as with a fleet
    kube.create(POD, pod_manifest("p"), namespace="default")
    kube.create(JOBS, _job("background"), namespace="default")
    kube.create(JOBS, _job("default"), namespace="default")
    _configure(served, FaultRule("conflict", probability=0.0))  # reads every delete's body, never fires
    with pytest.raises(Conflict) as stale:
        kube.delete(POD, "p", namespace="default", uid="not-its-uid")
    assert "UID in the precondition" in stale.value.message
    assert kube.get(POD, "p", namespace="default")["metadata"]["name"] == "p"
    kube.delete(JOBS, "background", namespace="default", propagation_policy="Background")
    with pytest.raises(NotFound):
        kube.get(JOBS, "background", namespace="default")  # gone at once: nothing to orphan
    kept = kube.delete(JOBS, "default", namespace="default")
    assert kept["metadata"]["finalizers"] == ["orphan"]  # no policy: a Job's default, as real


@pytest.mark.integration
def test_a_slow_answer_is_held_back(served: ServedCluster, kube: KubeClient) -> None:
    kube.create(POD, pod_manifest("p"), namespace="default")
    _configure(served, FaultRule("slow", delay_seconds=0.4, verbs=frozenset({"get"})))
    started = time.monotonic()
    assert kube.get(POD, "p", namespace="default")["metadata"]["name"] == "p"
    assert time.monotonic() - started >= 0.4


def _watch_lines(
    served: ServedCluster, query: str, timeout: float = 10.0
) -> tuple[list[dict[str, Any]], bool]:
    """The events of one raw watch stream and whether it ended cleanly (False: the connection was cut)."""
    http = urllib3.PoolManager(retries=False)
    resp = http.request(
        "GET",
        f"{served.url}/api/v1/namespaces/default/configmaps?watch=true&{query}",
        preload_content=False,
        timeout=urllib3.Timeout(connect=5, read=10),
    )
    events: list[dict[str, Any]] = []
    try:
        for line in resp.read_chunked():
            events.extend(json.loads(part) for part in line.split(b"\n") if part.strip())
    except (OSError, urllib3.exceptions.ProtocolError):
        return events, False
    finally:
        resp.release_conn()
    return events, True


def _configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": "1"}}


@pytest.mark.integration
def test_a_dropped_watch_is_cut_off_and_a_resume_can_find_its_version_gone(
    served: ServedCluster, kube: KubeClient
) -> None:
    configmaps = Resource("", "v1", "configmaps", namespaced=True)
    kube.create(configmaps, _configmap("a"), namespace="default")
    rv = kube.list(configmaps, namespace="default").resource_version
    _configure(served, FaultRule("drop-watch", after_seconds=0.3, limit=1))
    events, clean = _watch_lines(served, "timeoutSeconds=30")
    assert [e["object"]["metadata"]["name"] for e in events] == ["a"]  # the initial event, then the cut
    assert not clean
    events, clean = _watch_lines(served, f"resourceVersion={rv}&timeoutSeconds=1")
    assert clean and events == []  # the limit is spent: an ordinary watch ends at its timeout

    _configure(served, FaultRule("gone", limit=1))
    fresh, clean = _watch_lines(served, "timeoutSeconds=1")
    assert clean and [e["type"] for e in fresh] == ["ADDED"]  # no resourceVersion: nothing to resume
    events, clean = _watch_lines(served, f"resourceVersion={rv}&timeoutSeconds=1")
    assert clean and [e["type"] for e in events] == ["ERROR"]
    assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired"
    served.call(lambda: _injector(served).clear())
    kube.create(configmaps, _configmap("b"), namespace="default")
    events, clean = _watch_lines(served, f"resourceVersion={rv}&timeoutSeconds=1")
    assert [e["object"]["metadata"]["name"] for e in events] == ["b"]
    assert served.call(lambda: dict(_injector(served).injected)) == {"api-watch-drop": 1, "api-410": 1}


@pytest.mark.integration
def test_a_new_watch_fault_ends_the_open_watches_it_matches(served: ServedCluster) -> None:
    # A watch meets its fault when it starts; a client's watch lasts minutes, so a rule must end
    # the open ones for a window of a minute to reach them: each then resumes and meets it.
    ended: queue.SimpleQueue[tuple[list[dict[str, Any]], bool]] = queue.SimpleQueue()
    threading.Thread(target=lambda: ended.put(_watch_lines(served, "timeoutSeconds=30")), daemon=True).start()
    wait_until("the watch open", lambda: served.call(lambda: len(served._runner.app[WATCHES].watches)) == 1)
    _configure(served, FaultRule("gone", resources=frozenset({"pods"})))
    _configure(served, FaultRule("gone", resources=frozenset({"pods"})), FaultRule("slow"))
    with pytest.raises(queue.Empty):
        ended.get(timeout=0.5)  # a rule for pods, or no watch rule: the configmaps' watch goes on
    started = time.monotonic()
    _configure(served, FaultRule("gone", resources=frozenset({"pods"})), FaultRule("drop-watch"))
    events, clean = ended.get(timeout=10)
    assert clean and events == [] and time.monotonic() - started < 5  # ended, not cut, long before 30 s


@pytest.fixture
def sim() -> Iterator[Any]:
    with running_cluster("quiet", speed=1, token="admin-token") as handle:
        yield handle


@pytest.mark.integration
def test_the_admin_endpoint_reads_replaces_and_clears_faults(sim: Any) -> None:
    http = urllib3.PoolManager(retries=False)
    url = f"{sim.url}/simulator/v1/api-faults"
    auth = {"Authorization": "Bearer admin-token", "Content-Type": "application/json"}
    body = json.dumps({"seed": 9, "rules": [{"kind": "error", "code": 503, "verbs": ["list"], "limit": 1}]})
    assert http.request("PUT", url, body=body).status == 401
    bad = http.request("PUT", url, body=json.dumps({"rules": [{"kind": "error", "code": 418}]}), headers=auth)
    assert bad.status == 400 and "rules[0].code" in json.loads(bad.data)["message"]
    assert http.request("PUT", url, body=b"{", headers=auth).status == 400
    put = http.request("PUT", url, body=body, headers=auth)
    assert put.status == 200 and json.loads(put.data)["rules"][0]["code"] == 503
    nodes = http.request("GET", f"{sim.url}/api/v1/nodes", headers=auth)
    assert nodes.status == 503 and nodes.headers["Retry-After"] == "1"
    assert json.loads(nodes.data)["reason"] == "ServiceUnavailable"
    assert http.request("GET", f"{sim.url}/api/v1/nodes", headers=auth).status == 200
    state = json.loads(http.request("GET", url).data)  # reading is open, like /status
    assert state["seed"] == 9 and state["injected"] == {"api-503": 1}
    assert sim.call(lambda c: dict(c.api_faults.injected)) == {"api-503": 1}  # the Python view
    sim.call(lambda c: c.api_faults.configure((FaultRule("throttle", verbs=frozenset({"list"})),)))
    assert http.request("GET", f"{sim.url}/api/v1/nodes", headers=auth).status == 429
    cleared = http.request("DELETE", url, headers=auth)
    assert cleared.status == 200 and json.loads(cleared.data)["rules"] == []
    assert http.request("GET", f"{sim.url}/api/v1/nodes", headers=auth).status == 200


@pytest.mark.integration
def test_the_cluster_clock_steps_forward_only(sim: Any) -> None:
    http = urllib3.PoolManager(retries=False)
    url = f"{sim.url}/simulator/v1/clock/step"
    auth = {"Authorization": "Bearer admin-token"}
    assert http.request("POST", url, body=b'{"seconds": 30}').status == 401
    for bad in (b'{"seconds": -5}', b'{"seconds": 0}', b'{"seconds": true}', b"{}", b"x"):
        assert http.request("POST", url, body=bad, headers=auth).status == 400, bad
    before = sim.call(lambda c: c.clock.now())
    stepped = http.request("POST", url, body=b'{"seconds": 3600}', headers=auth)
    assert stepped.status == 200 and json.loads(stepped.data) == {"offsetSeconds": 3600.0}
    assert isinstance(sim.call(lambda c: c.clock), SteppableClock)
    assert sim.call(lambda c: c.clock.now()) - before >= 3600
    assert sim.simulated_seconds() < 3600  # the timeline runs on monotonic time, which a step leaves alone


def test_a_steppable_clock_refuses_to_go_back(tmp_path: Path) -> None:
    clock = SteppableClock()
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number of seconds forward"):
            clock.step(bad)
    mono = clock.monotonic()
    clock.step(100)
    assert clock.offset == 100 and clock.now() - time.time() >= 99
    assert clock.monotonic() - mono < 50


@pytest.mark.integration
def test_a_reflector_rides_out_every_fault_and_ends_with_the_whole_collection(
    served: ServedCluster, kube: KubeClient
) -> None:
    configmaps = Resource("", "v1", "configmaps", namespaced=True)
    _configure(
        served,
        FaultRule("error", code=503, verbs=frozenset({"list"}), limit=1),
        FaultRule("gone", limit=1),
        FaultRule("throttle", verbs=frozenset({"watch"}), limit=1),
        FaultRule("drop-watch", after_seconds=0.3, limit=3),
        FaultRule("slow", delay_seconds=0.05, probability=0.3),
    )
    messages: queue.Queue[Message] = queue.Queue()
    stop = threading.Event()
    reflector = Reflector(
        kube,
        "configmaps",
        configmaps,
        namespace="default",
        emit=messages.put,
        stop=stop,
        page_size=5,
        watch_timeout_seconds=60,
        backoff=BackoffSettings(initial_seconds=0.01, max_seconds=0.05),
    )
    thread = threading.Thread(target=reflector.run)
    thread.start()
    names: set[str] = set()
    restarts: list[str] = []

    def fold() -> bool:
        while not messages.empty():
            message = messages.get()
            if isinstance(message, Listed):
                names.clear()
                names.update(o["metadata"]["name"] for o in message.items)
            elif isinstance(message, Events):
                for etype, obj in message.events:
                    (names.discard if etype == "DELETED" else names.add)(obj["metadata"]["name"])
            elif isinstance(message, WatchRestarted):
                restarts.append(message.reason)
        return names == {f"cm-{i}" for i in range(12)}

    try:
        for i in range(12):
            kube.create(configmaps, _configmap(f"cm-{i}"), namespace="default")
            time.sleep(0.1)  # spread the writes over the watch's cuts; the assertion waits for the state
        wait_until("the reflector to hold every ConfigMap", fold, timeout=30)
        wait_until(
            "every limited fault to have hit",
            lambda: served.call(lambda: _injector(served).injected["api-watch-drop"]) == 3,
            timeout=30,
        )
    finally:
        stop.set()
        kube.close()
        thread.join(10)
    assert not thread.is_alive()
    injected = served.call(lambda: dict(_injector(served).injected))
    assert {k: injected[k] for k in ("api-503", "api-410", "api-429", "api-watch-drop")} == {
        "api-503": 1,
        "api-410": 1,
        "api-429": 1,
        "api-watch-drop": 3,
    }
    assert restarts  # the reflector noticed the cuts and the expired version and carried on
