"""gpuhealth core: what every part shares.

Layer rule: modules here hold plain data, settings, the clock and the command line.
Only `gpuhealth.kube` touches the `kubernetes` package (it is an adapter); nothing here
imports `pynvml`.
"""

__version__ = "0.1.0"
