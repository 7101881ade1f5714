"""Device health for the reconciler (responder.reconcile.health).

Aspects: the two recording rules decide Unhealthy > Unknown > Healthy, a device the rules list
with no unknown series is Unknown, and one the unknown rule lists with no unhealthy series
too (Healthy only with both series present and 0), a device with no series at all is Unknown
(property over random answers); an unreadable sample drops that device only; an error answer or an
unreachable Prometheus is `HealthUnavailable`; `PrometheusHealth` asks once per rule per pass
(never per device) and remembers since when a device is Healthy, forgetting it on a break and
on an outage of its own; the snapshot of an outage reads every device Unavailable, never Unknown.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st

from responder.reconcile.health import (
    MIG_QUERY,
    UNHEALTHY_RULE,
    UNKNOWN_RULE,
    HealthSnapshot,
    HealthUnavailable,
    PrometheusHealth,
    StaticHealth,
    classify,
    parse_partitions,
    parse_profiles,
    parse_vector,
)
from responder.reconcile.policy import Health


def mig_vector(cards: dict[tuple[str, str], list[str]]) -> dict[str, Any]:
    result = [
        {"metric": {"node": n, "device": d, "mig_uuid": m}, "value": [1_800_000_000, "1"]}
        for (n, d), migs in cards.items()
        for m in migs
    ]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def test_the_partitions_of_each_card_are_read_from_their_info_series() -> None:
    body = mig_vector({("n1", "GPU-a"): ["MIG-b", "MIG-a"], ("n2", "GPU-c"): ["MIG-c"]})
    body["data"]["result"].append({"metric": {"node": "n1", "device": "GPU-a"}, "value": [0, "1"]})
    assert parse_partitions(body) == {("n1", "GPU-a"): ("MIG-a", "MIG-b"), ("n2", "GPU-c"): ("MIG-c",)}
    assert parse_partitions({"status": "error"}) == {}
    assert parse_partitions([]) == {}


def test_each_partitions_profile_is_read_where_the_exporter_names_one() -> None:
    body = mig_vector({("n1", "GPU-a"): ["MIG-a", "MIG-b", "MIG-c"]})
    result = body["data"]["result"]
    result[0]["metric"]["profile"] = "3g.40gb"
    result[1]["metric"]["profile"] = "1g.10gb"
    result.append({"metric": {**result[1]["metric"], "profile": "2g.20gb"}, "value": [0, "1"]})  # two: none
    assert "profile" in MIG_QUERY
    assert parse_profiles(body) == {"MIG-a": "3g.40gb"}
    assert parse_profiles({"status": "error"}) == {}
    snapshot = HealthSnapshot(profiles={"MIG-a": "3g.40gb"})
    assert snapshot.profiles_of(("MIG-a", "MIG-c")) == (("MIG-a", "3g.40gb"),)


def vector(values: dict[tuple[str, str], Any]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"node": n, "device": d}, "value": [1_800_000_000, str(v)]}
                for (n, d), v in values.items()
            ],
        },
    }


keys = st.tuples(st.sampled_from(["n1", "n2"]), st.sampled_from(["GPU-a", "GPU-b", "GPU-c"]))


@given(st.dictionaries(keys, st.sampled_from([0.0, 1.0])), st.dictionaries(keys, st.sampled_from([0.0, 1.0])))
def test_unhealthy_beats_unknown_beats_healthy(
    unhealthy: dict[tuple[str, str], float], unknown: dict[tuple[str, str], float]
) -> None:
    states = classify(unhealthy, unknown)
    assert set(states) == {*unhealthy, *unknown}
    for key, state in states.items():
        if unhealthy.get(key) == 1.0:
            assert state == Health.UNHEALTHY
        elif unknown.get(key, 1.0) == 1.0 or key not in unhealthy:
            assert state == Health.UNKNOWN
        else:
            assert state == Health.HEALTHY
    # Healthy needs both rules' series, each saying 0: an absent one is never Healthy.
    for key, state in states.items():
        if state == Health.HEALTHY:
            assert unhealthy[key] == 0.0 and unknown[key] == 0.0
    assert HealthSnapshot({}).of("n9", "GPU-z").health == Health.UNKNOWN


def test_an_unreadable_sample_drops_that_device_only() -> None:
    body = vector({("n1", "GPU-a"): 1})
    body["data"]["result"].append({"metric": {"node": "n1", "device": "GPU-b"}, "value": [0, "x"]})
    body["data"]["result"].append({"metric": {"node": "n1"}, "value": [0, "1"]})
    assert parse_vector(body, "q") == {("n1", "GPU-a"): 1.0}


@pytest.mark.parametrize(
    "body",
    [
        {"status": "error", "errorType": "bad_data", "error": "parse error"},
        {"status": "success", "data": {"resultType": "matrix", "result": []}},
        [],
    ],
)
def test_an_error_answer_is_unavailable(body: Any) -> None:
    with pytest.raises(HealthUnavailable):
        parse_vector(body, "q")


def test_an_outage_snapshot_reads_every_device_unavailable() -> None:
    blind = HealthSnapshot.unavailable()
    assert blind.of("n1", "GPU-a").health == Health.UNAVAILABLE and not Health.UNAVAILABLE.known
    assert all(h.known for h in Health if h is not Health.UNAVAILABLE)
    assert HealthSnapshot().of("n1", "GPU-a").health == Health.UNKNOWN  # answered, no series


def test_the_static_source_can_fail() -> None:
    source = StaticHealth()
    source.set("n1", "GPU-a", Health.HEALTHY, 5.0)
    assert source.snapshot(10.0).eligible == 1
    source.failing = True
    with pytest.raises(HealthUnavailable):
        source.snapshot(10.0)


async def test_prometheus_is_asked_once_per_rule_and_remembers_healthy_since() -> None:
    answers = {
        UNHEALTHY_RULE: {("n1", "GPU-a"): 0, ("n1", "GPU-b"): 1, ("n1", "GPU-c"): 0},
        UNKNOWN_RULE: {("n1", "GPU-a"): 0, ("n1", "GPU-b"): 0, ("n1", "GPU-c"): 1},
    }
    asked: list[str] = []

    async def query(request: web.Request) -> web.Response:
        asked.append(request.query["query"])
        if request.query["query"] == MIG_QUERY:
            return web.json_response(partitions)
        return web.json_response(vector(answers[request.query["query"]]))

    partitions: dict[str, Any] = mig_vector({("n1", "GPU-a"): ["MIG-2", "MIG-1"]})

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    async with TestServer(app) as server:
        source = PrometheusHealth(str(server.make_url("/")))
        first = await asyncio.to_thread(source.snapshot, 100.0)
        assert asked == [UNHEALTHY_RULE, UNKNOWN_RULE, MIG_QUERY]
        assert first.partitions_of("n1", "GPU-a") == ("MIG-1", "MIG-2")
        assert first.partitions_of("n1", "GPU-b") == ()
        assert first.eligible == 3
        assert first.of("n1", "GPU-a").health == Health.HEALTHY
        assert first.of("n1", "GPU-a").healthy_since == 100.0
        assert first.of("n1", "GPU-b").health == Health.UNHEALTHY
        assert first.of("n1", "GPU-c").health == Health.UNKNOWN
        partitions = {"status": "error", "error": "no such series"}
        second = await asyncio.to_thread(source.snapshot, 160.0)
        assert second.of("n1", "GPU-a").healthy_since == 100.0  # still the same healthy run
        assert second.partitions == {}  # no partitions known is no health evidence: the pass goes on
        answers[UNKNOWN_RULE][("n1", "GPU-a")] = 1
        await asyncio.to_thread(source.snapshot, 200.0)
        answers[UNKNOWN_RULE][("n1", "GPU-a")] = 0
        fourth = await asyncio.to_thread(source.snapshot, 260.0)
        assert fourth.of("n1", "GPU-a").healthy_since == 260.0  # a break starts a new run
        saved = dict(answers[UNHEALTHY_RULE]), dict(answers[UNKNOWN_RULE])
        answers[UNHEALTHY_RULE], answers[UNKNOWN_RULE] = {}, {}
        with pytest.raises(HealthUnavailable, match="no series"):  # rules not loaded: no breaker input
            await asyncio.to_thread(source.snapshot, 300.0)
        answers[UNHEALTHY_RULE], answers[UNKNOWN_RULE] = saved
        after = await asyncio.to_thread(source.snapshot, 360.0)
        # Nothing vouched for the device during the outage: its healthy run starts again.
        assert after.of("n1", "GPU-a").healthy_since == 360.0
        port = server.port
    with pytest.raises(HealthUnavailable):
        await asyncio.to_thread(PrometheusHealth(f"http://127.0.0.1:{port}", timeout_seconds=2).snapshot, 0.0)
