"""Moving checkpointed work off a quarantined device: the pure plan, its caps and verdicts (`plan`) and
the executor that observes, carries the effects out and keeps the record's entries (`executor`), with
its collaborators for the jobs' Leases (`leases`), the tenant's pods (`tenant_pods`) and the evidence
of unrecoverable pods (`evidence_store`, whose data is the pure `evidence`'s).
"""
