"""The simulated cluster: a Kubernetes API server subset (`simulator.apiserver`) and a simulated fleet
of GPU nodes (kubelets, devices, NVML) driven by scenarios.

Layer rule: `simulator.apiserver` owns every API object and knows nothing of the fleet; the fleet
writes through the in-process `Store` API, API clients through HTTP. Nothing in gpuhealth's
production packages imports `simulator`.
"""
