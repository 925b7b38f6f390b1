"""The exactly-once kernel (docs/architecture.md, exactly once): the unit of one owned
input partition, with its transactional producer, what is staged on it and its commits
(`unit`); the sending of its records, with the refused ones replaced and the producer
they broke renewed (`collector`); the producers the units are given and renewed with
(`producers`); a unit's opening outside the assignment callback (`opening`) and the
states each assigned partition goes through (`lifecycle`); the results and approvals
applied in order per partition (`lanes`); the work not committed yet and its lag
(`backlog`); the records read for the running units (`fetcher`); the units' manager,
which drives each partition's lifecycle and owns the units (`unit_manager`); and the
group: which member owns which partition (`assignor`), its callbacks (`rebalance`) and
the processor's place in its consumer group, the three built around one consumer
(`membership`)."""

__all__ = [
    "assignor",
    "backlog",
    "collector",
    "fetcher",
    "lanes",
    "lifecycle",
    "membership",
    "opening",
    "producers",
    "rebalance",
    "unit",
    "unit_manager",
]
