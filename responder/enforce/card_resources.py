"""Which extended resources the kubelet hands a quarantined device-plugin card's units as.

A whole GPU is one unit of `nvidia.com/gpu` (a time-sliced one, one per replica). A MIG card's
units are its partitions, and GPU feature discovery's node label `nvidia.com/mig.strategy` says
how the NVIDIA device plugin advertises them: `single`, each one unit of `nvidia.com/gpu`;
`mixed`, each one unit of `nvidia.com/mig-<profile>` for its MIG profile (`3g.40gb`), which the
record knows from NVML (`QuarantineSpec.profiles`). Holders (`responder.enforce.hold`) ask for
these resources, and so do the card's checks on the kubelet's route
(`responder.enforce.node_annotation.through_kubelet`): a request for any other resource could
never be given the card.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from gpuhealth.plugin_resources import GPU_RESOURCE, MIG_RESOURCE_PREFIX, MIG_STRATEGY_LABEL, mig_resource
from responder.records import Quarantine


def mig_strategy(node: Mapping[str, Any] | None) -> str:
    """The node's MIG strategy as its label says (empty: not labelled)."""
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    value = labels.get(MIG_STRATEGY_LABEL)
    return value if isinstance(value, str) else ""


def card_units(record: Quarantine, node: Mapping[str, Any] | None) -> dict[str, int] | None:
    """Resource -> how many units of it the card is, as the kubelet hands them out on `node`;
    None where that cannot be told: a MIG card on a `mixed` node whose partitions' profiles are
    not all known, or on a node without the label."""
    partitions = record.spec.partitions
    if not partitions:
        return {GPU_RESOURCE: 1}
    strategy = mig_strategy(node)
    if strategy == "single":
        return {GPU_RESOURCE: len(partitions)}
    if strategy != "mixed":
        return None
    profiles = dict(record.spec.profiles)
    if not all(profiles.get(p) for p in partitions):
        return None
    return dict(sorted(Counter(mig_resource(profiles[p]) for p in partitions).items()))


def hold_resources(record: Quarantine, node: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The resources a fill of the card's node asks the kubelet for: the card's (`card_units`);
    where those cannot be told, every MIG resource the node advertises if it advertises any (the
    fill finds out which units are the card's, as it finds out which GPU), else `nvidia.com/gpu`."""
    known = card_units(record, node)
    if known is not None:
        return tuple(known)
    capacity = (((node or {}).get("status") or {}).get("capacity")) or {}
    migs = tuple(sorted(str(n) for n in capacity if str(n).startswith(MIG_RESOURCE_PREFIX)))
    return migs if record.spec.partitions and migs else (GPU_RESOURCE,)
