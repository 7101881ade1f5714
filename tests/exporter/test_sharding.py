"""The shard of a node (`exporter.sharding`): a stable hash of its name, modulo the shard count.

Aspects covered: the hash is FNV-1a 64 (its published test vectors); the shard of a name is the
same in another interpreter started with a different hash seed (never Python's salted `hash()`);
for any name and any shard count, exactly one shard owns the name and always the same one; the
split of a large fleet of realistic node names is even within statistical bounds; when the shard
count changes, the restarted shards cover every node exactly once again (and while only some have
restarted, a node can be in none or two: what the docs tell operators); a shard that is not one is
refused with the field named; the memo of owned nodes answers as the shard does and stays
bounded.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter import sharding
from exporter.sharding import UNSHARDED, OwnedNodes, Shard, fnv1a_64, shard_of
from gpuhealth.fields import SettingsError

NODE_NAMES = st.text(min_size=1, max_size=80)
"""Any non-empty text: a node name is a DNS subdomain, but the hash must not care."""
TOTALS = st.integers(min_value=1, max_value=64)


def test_the_hash_is_fnv1a_64() -> None:
    # The published FNV-1a 64-bit vectors: the empty string is the offset basis.
    assert fnv1a_64(b"") == 0xCBF29CE484222325
    assert fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64(b"foobar") == 0x85944171F73967E8


def test_a_node_s_shard_is_the_same_in_another_process_with_another_hash_seed() -> None:
    names = ["gpu-node-00001", "ip-10-0-3-17.ec2.internal", "nœud-ü", "a" * 253]
    program = (
        "import json, sys\n"
        "from exporter.sharding import shard_of\n"
        "names = json.loads(sys.argv[1])\n"
        "print(json.dumps([[shard_of(n, m) for m in (2, 3, 7, 16)] for n in names]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", program, json.dumps(names)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) == [[shard_of(n, m) for m in (2, 3, 7, 16)] for n in names]


@given(NODE_NAMES, TOTALS)
def test_every_node_is_in_exactly_one_shard_and_always_the_same(node: str, total: int) -> None:
    owners = [index for index in range(total) if Shard(index, total).owns(node)]
    assert owners == [shard_of(node, total)]
    assert 0 <= owners[0] < total
    assert shard_of(node, total) == shard_of(node, total)


@given(NODE_NAMES)
def test_unsharded_owns_every_node(node: str) -> None:
    assert UNSHARDED.owns(node) and not UNSHARDED.sharded and shard_of(node, 1) == 0


def _fleets() -> dict[str, list[str]]:
    rng = random.Random(25)
    return {
        "sequential": [f"gpu-node-{i:05d}" for i in range(20_000)],
        "cloud": [f"ip-10-{i // 65536}-{i // 256 % 256}-{i % 256}.ec2.internal" for i in range(20_000)],
        "random": [
            "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789-", k=16)) for _ in range(20_000)
        ],
    }


@pytest.mark.parametrize("fleet", ["sequential", "cloud", "random"])
@pytest.mark.parametrize("total", [2, 3, 5, 7, 8, 16, 32])
def test_a_large_fleet_splits_evenly(fleet: str, total: int) -> None:
    """Each shard's node count within six standard deviations of its mean.

    Were the hash a uniform random function, a shard's count of N names would be Binomial(N, 1/M):
    mean N/M, standard deviation sqrt(N (1/M)(1 - 1/M)). Six of them (for N = 20,000 and M = 32:
    625 +- 148) leaves a skewed hash nowhere to hide and a fair one a chance of about 1e-9 per shard
    to fall outside. The names are fixed (no draw at test time), so the verdict never changes
    between runs: the bound says why it is not tighter, not that it could flake.
    """
    names = _fleets()[fleet]
    counts = Counter(shard_of(n, total) for n in names)
    n, p = len(names), 1 / total
    mean, sd = n * p, (n * p * (1 - p)) ** 0.5
    assert sorted(counts) == list(range(total))
    assert all(abs(count - mean) <= 6 * sd for count in counts.values()), (counts, mean, sd)


@given(st.lists(NODE_NAMES, min_size=1, max_size=200, unique=True), TOTALS, TOTALS)
def test_after_the_shard_count_changes_the_restarted_shards_cover_every_node_once(
    nodes: list[str], before: int, after: int
) -> None:
    def owners(shards: list[Shard], node: str) -> list[Shard]:
        return [s for s in shards if s.owns(node)]

    old = [Shard(i, before) for i in range(before)]
    new = [Shard(i, after) for i in range(after)]
    for node in nodes:
        assert len(owners(old, node)) == 1
        assert len(owners(new, node)) == 1
        # A node stays where it was exactly when its hash leaves the same remainder.
        stays = owners(old, node)[0].index == owners(new, node)[0].index
        assert stays == (fnv1a_64(node.encode()) % before == fnv1a_64(node.encode()) % after)


def test_while_shards_restart_one_at_a_time_a_node_can_be_in_none_or_two() -> None:
    # M from 2 to 3: shard 0 restarted with M=3, shard 1 still runs with M=2, shard 2 is new.
    mixed = [Shard(0, 3), Shard(1, 2), Shard(2, 3)]
    coverage = Counter(sum(s.owns(f"gpu-node-{i:05d}") for s in mixed) for i in range(1_000))
    assert coverage[0] > 0 and coverage[2] > 0 and coverage[1] > 0
    restarted = [Shard(i, 3) for i in range(3)]
    assert {sum(s.owns(f"gpu-node-{i:05d}") for s in restarted) for i in range(1_000)} == {1}


@given(st.lists(NODE_NAMES, min_size=1, max_size=50), TOTALS, st.data())
def test_the_memo_answers_as_the_shard_does(nodes: list[str], total: int, data: st.DataObject) -> None:
    shard = Shard(data.draw(st.integers(0, total - 1)), total)
    owned = OwnedNodes(shard)
    for node in [*nodes, *reversed(nodes)]:  # asked again: remembered, the same answer
        assert owned(node) == shard.owns(node)


def test_the_memo_starts_afresh_at_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sharding, "MEMO_LIMIT", 3)
    owned = OwnedNodes(Shard(0, 2))
    answers = [owned(f"n{i}") for i in range(10)]
    assert answers == [Shard(0, 2).owns(f"n{i}") for i in range(10)]
    assert len(owned._memo) <= 3


@pytest.mark.parametrize(
    ("index", "total", "message"),
    [
        (0, 0, "Shard.total must be at least 1"),
        (3, 3, "Shard.index must be from 0 to total - 1 = 2, got 3"),
        (-1, 2, "Shard.index must be from 0 to total - 1 = 1, got -1"),
        (True, 2, "Shard.index must be a whole number"),
        (0, 2.0, "Shard.total must be a whole number"),
    ],
)
def test_a_shard_out_of_range_is_refused_with_the_field_named(
    index: object, total: object, message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        Shard(index, total)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("node", "total", "message"),
    [
        ("", 2, "a node name must be a non-empty string"),
        ("n", 0, "total_shards must be a whole number of at least 1"),
    ],
)
def test_shard_of_refuses_what_has_no_shard(node: str, total: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shard_of(node, total)
