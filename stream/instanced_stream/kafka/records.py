"""The record the product writes to Kafka (`OutRecord`): its topic, key, value and
headers, the input record it answers (`Origin`), and a state change's place in its
order. `publish.py` sends them; the runtime and the activity SDK build them."""

from __future__ import annotations

from dataclasses import dataclass

from instanced_stream.kafka.tracing import Headers

__all__ = ["Origin", "OutRecord"]


Origin = tuple[str, int, int] | None  # (topic, partition, offset) of an input record


@dataclass(frozen=True, slots=True)
class OutRecord:
    topic: str
    key: bytes | None
    value: bytes
    origin: Origin = None  # the input record this one answers
    partition: int | None = None  # None: the key decides
    headers: Headers = ()  # else the origin's traceparent (kafka/tracing.py)
    # A state store's change order (its changelog records, > 0): however a transaction
    # gathers its records, these are written in it, so compaction keeps the newest.
    seq: int = 0
