"""Test and demo support: the OpenAI-compatible LLM simulator (`sim`), the local Apache
Kafka launcher (`broker`, `jars`) and three-broker cluster (`cluster`), TLS and SASL
listeners for it (`listeners`), the local Schema Registry (`schema_registry`), a real small
model behind llama.cpp's server (`local_model`), sample items (`samples`) and the
crash-point injector of the fault campaign (`faults`). Modules are imported where used."""

__all__ = [
    "broker",
    "cluster",
    "faults",
    "jars",
    "listeners",
    "local_model",
    "samples",
    "schema_registry",
    "sim",
]
