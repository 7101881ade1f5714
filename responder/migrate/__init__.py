"""Moving checkpointed work off a quarantined device: the pure plan, its caps and verdicts (`plan`) and
the executor that observes, carries the effects out and keeps the record's entries (`executor`).
"""
