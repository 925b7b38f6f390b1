"""The exactly-once engine (docs/architecture.md): the group's membership and
assignment (`membership`), the unit of one input partition with its transactional producer
and commits (`unit`), its state store restored from the changelog (`store`), the batcher
that stages solved batches onto units (`stager`), the instances it batches (`staged`) and
the tier it is given (`tier`: online, or the Batch API's), workflows' results, approvals,
turns and deadlines as staged state changes (`workflows`), and the compacted context topic
(`overrides`). Nothing else in `runtime/` knows about transactions."""

__all__ = [
    "membership",
    "overrides",
    "staged",
    "stager",
    "store",
    "tier",
    "unit",
    "workflows",
]
