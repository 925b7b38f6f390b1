"""Lag: per assigned input partition, the records not committed yet, as the metrics and
KEDA read it. An open unit's is the end less its oldest record still waiting for its
outcome (or its position); a partition whose unit is not open (restoring, failing) shows
its whole backlog, the end less the committed offset, never nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from instanced_stream.runtime.engine.unit import Unit

__all__ = ["lag_of"]


async def lag_of(
    consumer: AIOKafkaConsumer,
    topic: str,
    units: Mapping[int, Unit],
    opening: Mapping[int, Any],
    positions: Mapping[TopicPartition, int],
) -> dict[int, int]:
    """`topic`: the input; `units`: the open ones; `opening`: the partitions whose unit
    is not open; `positions`: the next offset each partition owes."""
    out: dict[int, int] = {}
    for p, unit in sorted(units.items()):
        tp = TopicPartition(topic, p)
        end = consumer.highwater(tp)
        oldest = unit.oldest_open(topic)
        position = oldest if oldest is not None else positions.get(tp)
        if end is not None and position is not None:
            out[p] = max(0, end - position)
    owned = consumer.assignment()
    waiting = [tp for tp in (TopicPartition(topic, p) for p in sorted(opening)) if tp in owned]
    if waiting:
        ends = await consumer.end_offsets(waiting)
        for tp in waiting:
            committed = await consumer.committed(tp)
            out[tp.partition] = max(0, ends[tp] - (committed or 0))
    return out
