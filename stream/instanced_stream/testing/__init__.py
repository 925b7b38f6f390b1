"""Test and demo support a user can import too: the OpenAI-compatible LLM simulator
(`sim`), the local Apache Kafka launcher (`broker`, `jars`), the local Schema Registry
(`schema_registry`), sample items (`samples`) and
the crash-point injector of the fault campaign (`faults`). Modules are imported where
used."""

__all__ = [
    "broker",
    "faults",
    "jars",
    "samples",
    "schema_registry",
    "sim",
]
