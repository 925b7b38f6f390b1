"""The processor, on aiokafka's public API (docs/architecture.md). Sub-packages, each
importing only from those before it: `steps` (pipeline steps, no Kafka), `quality`
(quality control), `engine` (the exactly-once engine: membership, units, stores, the
stager, workflows), `batch` (the Batch API tier); `service` assembles and runs them."""

__all__ = [
    "batch",
    "engine",
    "quality",
    "service",
    "steps",
]
