"""Replay: a timeline of device and node events played through gpuhealth's own decisions.

Pure: no I/O, no clock. The timeline (`timeline`) says what happened to the hardware; the alerting
model (`alerting`) says which of the shipped alerts that raises and when Alertmanager delivers
them, or a recorded alert history (`history`: Prometheus' ALERTS samples) gives them; the engine
(`engine`) runs every delivery through the webhook's intake and every record through the
reconciler's policy, breaker and rate limit on a virtual clock; `outcomes` accounts what it did.
No Kubernetes, Prometheus or HTTP: the functions the responder runs, called directly.
"""
