"""The backlog: per assigned input partition, the work not committed yet. Its lag, as
the metrics and KEDA read it: an open unit's is the end less its oldest record still
waiting for its outcome (or its position); a partition whose unit is not open
(restoring, failing) shows its whole backlog, the end less the committed offset, never
nothing. Its cap: a unit tracking that many records not committed has its input held.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from instanced_stream.runtime.units.unit import Unit

__all__ = ["held", "lag_of"]


def held(topic: str, units: Mapping[int, Unit], hold: bool, cap: int) -> list[TopicPartition]:
    """The input partitions to hold: all of them (`hold`: backpressure), or each whose
    unit tracks `cap` records not committed yet (one partition whose prefix waits, a slow
    item at its head, must not fill the process's memory nor hold the others back)."""
    return [
        TopicPartition(topic, p)
        for p, unit in sorted(units.items())
        if hold or sum(map(len, unit.slots.values())) >= cap
    ]


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
