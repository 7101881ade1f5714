"""`kubectl gpuhealth`: the kubectl plugin (console script `kubectl-gpuhealth`, found on PATH).

Entry-point layer, beside `demo` and `bench`: it puts together what the exporter shows (the
device view, `exporter.devices_view`) and what the responder records (`DeviceQuarantine`,
the breaker), which no single service may import. It shares their commands' code and speaks
kubectl's flags: `--kubeconfig`, `--context`, `-n/--namespace`, `-A`, `-l/--selector`,
`-o table|wide|json|yaml`, `--no-headers` (docs/kubectl-plugin.md).

- `cli`: the parser, namespace resolution and the quarantine and breaker commands;
- `devices`: `kubectl gpuhealth devices` and its sources (exporter pods through the
  apiserver's pod proxy, `--exporter-url`, a local directory file);
- `join` (pure): merging exporter views, filters, and a pod's devices joined with both.
"""
