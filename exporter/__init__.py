"""The exporter: pod status observer, replayable device directory, NVML readings, device metrics.

Layers: `snapshot`, `parse`, `identity`, `state` are pure data and decisions (no I/O);
`directory` (SQLite), `observer` (Kubernetes watch), `nvml_*` (NVML) and `server` (HTTP) are
adapters; `cli` is the entry point. Only adapter modules import `kubernetes` or `pynvml`.
"""
