"""The Kafka runtime: the processor, on aiokafka's public API (DESIGN.md section 8).

Modules (imported where used): `service` (the processor assembled and run: fetch loop,
timers, drain), `membership` (the consumer group; a unit per owned input partition),
`unit` (one partition's slots and its transactional commits), `store` (a unit's state,
restored from its changelog partition), `stager` (cross-partition windows, solved
batches staged onto their items' units), `workflows` (results, approvals, turns and
deadlines as state changes staged with their outputs; `guard`: their size limit),
`records` (a solved batch to its records, pure), `budget` (what a window may hold),
`intake` (records to instances), `windowing`, `publish` (the activity SDK's producer),
`clients` (every Kafka client), `topics`, `security`, `overrides` (the compacted context
topic), `probe` (named moments, for the fault campaign), `tracing`, `scopes`.
"""

__all__ = [
    "budget",
    "clients",
    "guard",
    "intake",
    "membership",
    "overrides",
    "probe",
    "publish",
    "records",
    "scopes",
    "security",
    "service",
    "stager",
    "store",
    "topics",
    "tracing",
    "unit",
    "windowing",
    "workflows",
]
