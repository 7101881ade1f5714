"""Which cluster-mode exporter shard a node belongs to: a stable hash of the node name.

A fleet too large for one cluster-mode exporter runs M of them (`--shard N --total-shards M`,
as kube-state-metrics does). Every exporter still lists and watches everything (the API cannot
filter by a hash), and keeps only the objects of the nodes in its shard: a node's pods, its
ResourceSlices, its kubelet Lease and its Node all carry the node's name, so a device, the pods
that hold it and every series about its node land in one shard together.

The hash is FNV-1a, 64 bits, over the node name's UTF-8 bytes, modulo M (kube-state-metrics
hashes an object's UID the same way; we hash the node name so that a node is never split).
Python's `hash()` is salted per process and would send a node to a different shard on every
restart; FNV-1a is a fixed arithmetic function, so every process, Python version and machine
agrees, and an operator can compute a node's shard by hand.

When M changes, a node keeps its shard only where `h mod M_old == h mod M_new`; the others
move, and each restarted shard lists them afresh. Every node is in exactly one shard for any
M, so after every shard runs with the new M each device is exported exactly once.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuhealth.fields import SettingsError

FNV64_OFFSET = 0xCBF29CE484222325
"""FNV-1a's 64-bit offset basis."""
FNV64_PRIME = 0x100000001B3
"""FNV-1a's 64-bit prime."""
_MASK64 = (1 << 64) - 1


def fnv1a_64(data: bytes) -> int:
    """FNV-1a, 64 bits: for each byte, xor it in, then multiply by the prime (mod 2**64)."""
    h = FNV64_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV64_PRIME) & _MASK64
    return h


def shard_of(node: str, total_shards: int) -> int:
    """The shard (0 .. total_shards-1) that owns `node`; ValueError for a bad name or count."""
    if not isinstance(node, str) or not node:
        raise ValueError(f"a node name must be a non-empty string, got {node!r}")
    if isinstance(total_shards, bool) or not isinstance(total_shards, int) or total_shards < 1:
        raise ValueError(f"total_shards must be a whole number of at least 1, got {total_shards!r}")
    return fnv1a_64(node.encode("utf-8")) % total_shards


@dataclass(frozen=True)
class Shard:
    """One exporter's part of the fleet: shard `index` of `total` (0 <= index < total)."""

    index: int = 0
    """This exporter's shard, from 0 (`--shard`)."""
    total: int = 1
    """How many shards the fleet is split into (`--total-shards`); 1: unsharded, every node."""

    def __post_init__(self) -> None:
        for name in ("index", "total"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SettingsError(f"Shard.{name} must be a whole number, got {value!r}")
        if self.total < 1:
            raise SettingsError(f"Shard.total must be at least 1 (shards), got {self.total}")
        if not 0 <= self.index < self.total:
            raise SettingsError(
                f"Shard.index must be from 0 to total - 1 = {self.total - 1}, got {self.index}"
            )

    @property
    def sharded(self) -> bool:
        """True when the fleet is split (more than one shard)."""
        return self.total > 1

    def owns(self, node: str) -> bool:
        """True when `node` belongs to this shard (always, unsharded)."""
        return self.total == 1 or shard_of(node, self.total) == self.index


UNSHARDED = Shard()
"""The one shard of an unsharded exporter (node mode, or a single cluster-mode exporter)."""


MEMO_LIMIT = 100_000
"""Node names an `OwnedNodes` remembers before it starts afresh: ten times the largest fleets
(a cluster that recycles node names, as autoscalers do, must not grow it for ever)."""


@dataclass
class OwnedNodes:
    """`Shard.owns`, remembered by node name: the exporter asks it for every watch event.

    Hashing a name costs about 4.5 us in Python, a dictionary lookup about 50 ns; the exporter
    of a 10,000-node shard confirms tens of thousands of pods a minute."""

    shard: Shard
    _memo: dict[str, bool] = field(default_factory=dict, repr=False)

    def __call__(self, node: str) -> bool:
        owned = self._memo.get(node)
        if owned is None:
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()
            owned = self._memo[node] = self.shard.owns(node)
        return owned
