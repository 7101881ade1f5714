"""The simulated Kubernetes API server: an in-process object store (`store.Store`) and an aiohttp
app (`app.create_app`) serving the subset of the Kubernetes API gpuhealth uses, faithfully enough
for the official `kubernetes` client. No network I/O below `app.py`: the store, selectors, patching,
validation and PDB arithmetic work on plain data.
"""
