"""Kafka plumbing, the floor above the core: every client the product opens (`clients`),
their TLS/SASL options (`security`), the topic names and admin (`topics`), the record the
product writes (`records`) and the producer wrapper the activity SDK and the runtime share
(`publish`), trace headers (`tracing`), and the Schema Registry: its client and input
decoding (`registry`), the output subjects (`schemas`). Nothing here knows about units,
batches or transactions' meaning."""

__all__ = [
    "clients",
    "publish",
    "records",
    "registry",
    "schemas",
    "security",
    "topics",
    "tracing",
]
