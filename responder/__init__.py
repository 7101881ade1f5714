"""The responder: the Alertmanager webhook that quarantines devices, migrates checkpointed
work off them and releases them again (the service itself is filled in by the next issue).

Layers, as in the exporter: pure data and decisions at the bottom (no I/O), adapters
(Kubernetes, HTTP) at the edge, the entry point on top. Only adapter modules import
`kubernetes`. Built so far, all pure: `alerts` (Alertmanager webhook deliveries as
validated data), `records` (the `DeviceQuarantine` record, manifest in `deploy/crds/`),
`limits` (token buckets a new leader rebuilds from the records), `breaker` (the circuit
breaker's two triggers) and `metrics` (the families the rules already query).
"""
