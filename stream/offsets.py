"""Acks each partition's records strictly in offset order.

Batches finish out of order (several LLM requests are in flight), but faust's commit
logic tolerates a one-offset hole at the head of its acked list and commits past it (the
trap behind faust issue #606). So the processor never hands faust an out-of-order ack:
the ledger holds finished records until every earlier record of the same partition has
finished too, and only then acks them, oldest first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["Entry", "OffsetLedger", "TopicPartition"]

TopicPartition = tuple[str, int]


@dataclass(slots=True, eq=False)
class Entry:
    tp: TopicPartition
    offset: int
    ack: Callable[[], object]
    finished: bool = False
    dropped: bool = False


class OffsetLedger:
    def __init__(self) -> None:
        self._open: dict[TopicPartition, deque[Entry]] = {}
        self.acked = 0

    def track(self, tp: TopicPartition, offset: int, ack: Callable[[], object]) -> Entry:
        """Registers a record as it is delivered (delivery is in offset order per partition)."""
        entry = Entry(tp, offset, ack)
        self._open.setdefault(tp, deque()).append(entry)
        return entry

    def finish(self, entry: Entry) -> None:
        """Marks a record done; acks the partition's finished prefix."""
        if entry.dropped:
            return  # its partition was revoked: the new owner redoes it
        entry.finished = True
        queue = self._open[entry.tp]
        while queue and queue[0].finished:
            queue.popleft().ack()
            self.acked += 1

    def drop(self, tps: Iterable[TopicPartition]) -> int:
        """Forgets revoked partitions; their unfinished records will never be acked here."""
        dropped = 0
        for tp in tps:
            for entry in self._open.pop(tp, ()):
                entry.dropped = True
                dropped += 1
        return dropped

    def open_count(self) -> int:
        return sum(len(q) for q in self._open.values())

    def lowest_open(self, tp: TopicPartition) -> int | None:
        queue = self._open.get(tp)
        return queue[0].offset if queue else None
