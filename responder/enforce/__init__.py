"""Enforcement backends: how a device is quarantined, behind one protocol (`backends`); the device's
identity from the API (`identity`, pure); the DeviceTaintRule backend (`taint_rules`) and the node-annotation
backend (`node_annotation`); which pods hold a device (`holders`); the shipped backends, declared once
(`shipped`).
"""
