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
        self._next: dict[TopicPartition, int] = {}
        self._rewind: dict[TopicPartition, int] = {}
        self._seen: dict[TopicPartition, int] = {}  # one past the highest offset delivered
        self.acked = 0

    def track(self, tp: TopicPartition, offset: int, ack: Callable[[], object]) -> Entry:
        """Registers a record as it is delivered (delivery is in offset order per partition)."""
        entry = Entry(tp, offset, ack)
        self._open.setdefault(tp, deque()).append(entry)
        if offset >= self._seen.get(tp, 0):
            self._seen[tp] = offset + 1
        return entry

    def seen_next(self, tp: TopicPartition) -> int | None:
        """The offset after the highest one delivered here since the partition was
        assigned (None: nothing delivered yet)."""
        return self._seen.get(tp)

    def pass_over(self, tp: TopicPartition, offset: int) -> None:
        """Offsets below `offset` hold nothing to deliver (a gap Kafka itself leaves)."""
        if offset > self._seen.get(tp, 0):
            self._seen[tp] = offset

    def finish(self, entry: Entry) -> None:
        """Marks a record done; acks the partition's finished prefix."""
        if entry.dropped:
            return  # its partition was revoked: the new owner redoes it
        entry.finished = True
        queue = self._open[entry.tp]
        while queue and queue[0].finished:
            done = queue.popleft()
            done.ack()
            self._next[done.tp] = done.offset + 1
            self.acked += 1

    def drop(self, tps: Iterable[TopicPartition]) -> int:
        """Forgets revoked partitions; their unfinished records will never be acked here."""
        dropped = 0
        for tp in tps:
            self._next.pop(tp, None)
            self._seen.pop(tp, None)
            for entry in self._open.pop(tp, ()):
                entry.dropped = True
                dropped += 1
                self._rewind[tp] = min(entry.offset, self._rewind.get(tp, entry.offset))
        return dropped

    def rewinds(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Where to re-read partitions that come back to us after a rebalance.

        faust does not re-seek a partition it keeps across a rebalance, so records that
        were in flight when it was revoked (and dropped here) would never come again:
        the caller seeks these partitions back to their oldest dropped offset."""
        return {tp: self._rewind.pop(tp) for tp in list(tps) if tp in self._rewind}

    def commit_point(self, tp: TopicPartition) -> int | None:
        """The highest offset that may be committed: the oldest unfinished record, or one
        past the last finished one; None when nothing of this partition finished here."""
        queue = self._open.get(tp)
        if queue:
            # Not queue[0]: after a rewind, re-read older offsets queue behind newer ones.
            return min(e.offset for e in queue)
        return self._next.get(tp)

    def cap(self, tp: TopicPartition, offset: int | None) -> int | None:
        """Limits a commit that faust proposes to what this ledger has finished.

        faust also acks on its own (it skips records of an older consumer generation that
        were queued before a rebalance) and then commits past a hole when its committed
        offset is 0 or unknown; this cap keeps such an ack from carrying the commit over
        records that are being redone.
        """
        if offset is None:
            return None
        limit = self.commit_point(tp)
        return None if limit is None else min(offset, limit)

    def open_count(self) -> int:
        return sum(len(q) for q in self._open.values())

    def lowest_open(self, tp: TopicPartition) -> int | None:
        queue = self._open.get(tp)
        return queue[0].offset if queue else None
