"""The Kafka runtime: the faust processor app and the parts it is built from.

Modules (imported where used, so that importing one does not start faust):
`processor` (the app and its pipeline), `intake` (records to instances), `windowing`,
`offsets` (commit in offset order), `publish`, `topics`, `security`, `context` (the
compacted override topic).
"""

__all__ = [
    "context",
    "intake",
    "offsets",
    "processor",
    "publish",
    "security",
    "topics",
    "windowing",
]
