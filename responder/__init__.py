"""The responder: the Alertmanager webhook that quarantines devices, migrates checkpointed
work off them and releases them again.

Layers, as in the exporter: pure data and decisions at the bottom (no I/O), adapters
(Kubernetes, HTTP) at the edge, the entry point on top. Only `gpuhealth.kube` imports
`kubernetes`.

Pure decisions and data: `alerts` (Alertmanager webhook deliveries as validated data),
`records` (the `DeviceQuarantine` record, manifest in `deploy/crds/`), `intake` (what the
webhook records for one alert), `ladder` (the release ladder's rungs, as data), `policy` (the
reconciler's phase machine, walking the ladder), `migration`
(moving checkpointed work off a device), `extender` (the scheduler extender's filter for
device-plugin GPUs), `limits` (token buckets a new leader rebuilds from the records),
`breaker` (the circuit breaker's two triggers), `metrics` (every family the service
exposes). Adapters: `recorder` (writes the intake's decisions, conditionally), `webhook`
(`POST /webhook`), `enforcement` (DeviceTaintRules and the node annotation), `reconciler`
(the leader's loop over the records), `migrator` (migration Leases, checkpoint requests,
evictions), `health` (device health from Prometheus' recording rules), `checks` (probe and
canary Jobs), `events` (Kubernetes Events), `breaker_store` (the breaker's ConfigMap),
`capacity` and `scheduler` (the extender endpoint's node and pod cache), `tls` (certificates
picked up again when they change). Entry points: `service` (the app: webhook and extender
on every replica, reconciler on the leader) with `settings` and `config` (`--config FILE`),
and `cli` (`gpuhealth responder`, `gpuhealth quarantine ...`, `gpuhealth breaker ...`).
"""
