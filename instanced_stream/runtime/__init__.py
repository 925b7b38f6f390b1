"""The Kafka runtime: the faust processor app and the parts it is built from.

Modules (imported where used, so that importing one does not start faust):
`app` (the faust app: agents, timers, rebalances), `feed` (the input topic, a whole
fetch at a time), `processor` (the pipeline, assembled from: `batcher` (offer, window,
launch, in-flight order), `records` (a solved batch to its records, pure), `delivery`
(publish, dead-letter, retry, fatal, offsets) and `coordinator` (workflows: results,
approvals, turns, expiry; `guard`: the size limit of its records)), `budget` (what a
window may hold), `intake` (records to instances), `windowing`, `offsets` (commit in
offset order), `publish`, `clients` (every Kafka client), `topics`, `security`,
`overrides` (the compacted context topic), `probe` (named moments, for the fault
campaign).
"""

__all__ = [
    "app",
    "batcher",
    "budget",
    "clients",
    "coordinator",
    "delivery",
    "feed",
    "guard",
    "intake",
    "offsets",
    "overrides",
    "probe",
    "processor",
    "publish",
    "records",
    "security",
    "topics",
    "windowing",
]
