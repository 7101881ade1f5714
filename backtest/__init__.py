"""`gpuhealth backtest`: gpuhealth's decisions replayed over a fleet's recorded alert history.

An entry point of the product, above the services: it joins the rules (which alerts exist, their
timings) and the responder (its replay engine and settings), which never import each other.
`inputs` and the pure parts (`window`, `pods`, `cordon`, `report`) do no I/O; `prometheus` is the
HTTP adapter; `cli` is the executor.
"""
