"""The Kubernetes adapter layer: everything that speaks the Kubernetes API, for every service.

Layer rule: only this package (and the NVML adapter `exporter/nvml_pynvml.py`, for `pynvml`)
imports the `kubernetes` client; services above it see plain dicts, typed resources and the
error classes here, never the client's models. Inside, only `config` and `transport` import
`kubernetes`; the other modules are pure, so importing them stays cheap.

- `config`: an ApiClient from a kubeconfig or the in-cluster service account.
- `transport`: one HTTP request to the apiserver, raw bytes back (`KubeTransport`).
- `errors`: the error vocabulary (`NotFound`, `Conflict`, `Gone`, ...) and the one mapping
  from an HTTP status and Status body to it.
- `resources`: `Resource` (group, version, plural, scope) and the paths built from it.
- `client`: `KubeClient`, the typed synchronous surface: list, watch, get, create, update,
  patch, delete, status subresource, dry-run.
- `watch`: the watch stream's wire format (lines, events, ERROR events).
- `reflector`: the list-then-watch loop with resume, bookmarks and relist on 410.
- `backoff`: `Backoff`, the one throttling helper for retries.
- `lease`: leader election's rules as pure data and decisions (the Lease record, expiry on
  the local monotonic clock, the next action, release, the renew deadline).
- `elector`: `LeaderElector`, the async campaign over `KubeClient` that runs the leader's
  work as a fenced `Term` and releases the Lease on shutdown.
- `meta`: object metadata helpers: resourceVersion order, RFC 3339 times, well-known names.
"""
