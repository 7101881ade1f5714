"""The scheduler extender for device-plugin GPUs: the pure filter (`filter`), its HTTP endpoint (`server`)
and the node and pod cache it filters against (`capacity`).
"""
