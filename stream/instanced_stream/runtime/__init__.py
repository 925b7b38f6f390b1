"""The processor, on aiokafka's public API (docs/architecture.md). Its rooms, each
importing only from those before it (`tests/unit/test_layout.py`):

- `pipeline.windows` and `pipeline.outcomes`: the pipeline's rooms that need no broker,
  what goes into a request (an item read, its twins, its window) and what comes out of
  one (a solved batch's records and dead letters);
- `quality`: quality control of the decisions;
- `state`: a unit's state store, the order of its changes, the read-back of retired
  states;
- `units`: the exactly-once kernel, the unit of one input partition (its transactional
  producer and commits, its opening) and the group that assigns the units;
- `pipeline`: consumed records to staged outcomes (the stager, its tier, workflows, a
  unit's restore, the context topic);
- `batch_api`: the provider's Batch API tier;

and `service`, which assembles and runs them."""

__all__ = [
    "batch_api",
    "pipeline",
    "quality",
    "service",
    "state",
    "units",
]
