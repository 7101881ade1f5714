"""The leader's loop over the records: the phase machine that walks the release ladder (`policy`, pure),
the loop that observes, applies and writes (`reconciler`), the circuit breaker (`breaker`, pure) and its
ConfigMap (`breaker_store`), the new-quarantine bucket (`limits`, pure), device health from Prometheus
(`health`) and Events on the records (`events`).
"""
