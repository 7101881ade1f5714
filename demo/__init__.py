"""`gpuhealth demo`: the whole pipeline on loopback, driven by a fault scenario.

Layers: `safety` is pure (which automated actions a scenario's faults warrant, and which
delivered actions break that); `pipeline` is the adapter that starts the simulated cluster,
exporters, Prometheus, Alertmanager and the webhook receivers; `cli` is the entry point.
"""
