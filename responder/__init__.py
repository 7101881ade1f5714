"""The responder: the Alertmanager webhook that quarantines devices, migrates checkpointed
work off them and releases them again.

Layers, as in the exporter: pure data and decisions at the bottom (no I/O), adapters
(Kubernetes, HTTP) at the edge, the entry point on top. Only `gpuhealth.kube` imports
`kubernetes`. One subpackage per subsystem, each with a docstring saying what it owns:

- the record, shared by all: `records` (the `DeviceQuarantine` record, manifest in
  `deploy/crds/`), `ladder` (the release ladder's rungs, as data), `metrics` (every family the
  service exposes); all pure;
- `webhook`: Alertmanager deliveries (`alerts`), what one alert records (`intake`, pure), the
  records' conditional writes (`recorder`), `POST /webhook` (`server`);
- `reconcile`: the phase machine walking the ladder (`policy`, pure), the leader's loop
  (`reconciler`), the circuit breaker (`breaker`, pure) and its ConfigMap (`breaker_store`),
  the new-quarantine bucket (`limits`, pure), device health (`health`), Events (`events`);
- `enforce`: the backends' protocol (`backends`), a device's identity from the API
  (`identity`, pure), the DeviceTaintRule and node-annotation backends (`taint_rules`,
  `node_annotation`), who holds a device (`holders`), the shipped backends (`shipped`);
- `checks`: the check rungs' Jobs (`jobs`);
- `migrate`: the pure plan with its caps and verdicts (`plan`) and its executor (`executor`);
- `extender`: the scheduler extender's filter (`filter`, pure), endpoint (`server`) and cache
  (`capacity`).
Entry points: `service` (the app: webhook and extender on every replica, reconciler on the
leader) with `settings`, `config` (`--config FILE`) and `tls`; `commands` (the operator
commands, `gpuhealth quarantine ...`, `gpuhealth breaker ...`); `cli` (`gpuhealth responder`
and the commands' registration, which `gpuhealth.cli` reaches through importlib).
"""
