"""The NVIDIA device plugin's extended resources: one home for their names.

The plugin advertises whole GPUs (and, under MIG strategy `single`, MIG partitions; time-sliced
replicas too) as `nvidia.com/gpu`, and under MIG strategy `mixed` each MIG profile's partitions
as `nvidia.com/mig-<profile>` (`nvidia.com/mig-3g.40gb`). GPU feature discovery labels the node
with the strategy (`nvidia.com/mig.strategy`) and the time-slicing replicas per GPU
(`nvidia.com/gpu.replicas`).
"""

from __future__ import annotations

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""Under MIG strategy mixed: `nvidia.com/mig-<profile>`."""
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
"""GPU feature discovery's node label: how the device plugin advertises MIG partitions (`single`:
each one unit of `nvidia.com/gpu`; `mixed`: `nvidia.com/mig-<profile>`; `none`)."""


def gpu_resource(name: str) -> bool:
    """Whether `name` is one of the device plugin's GPU resources (`nvidia.com/gpu`, `nvidia.com/mig-*`)."""
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def mig_resource(profile: str) -> str:
    """The resource of a MIG profile's partitions under strategy mixed."""
    return MIG_RESOURCE_PREFIX + profile
