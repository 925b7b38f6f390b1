"""Acks each partition's records strictly in offset order, and commits nothing past a
record its handler never saw.

Batches finish out of order (several LLM requests are in flight), but faust's commit
logic tolerates a one-offset hole at the head of its acked list and commits past it (the
trap behind faust issue #606). So the processor never hands faust an out-of-order ack:
the ledger holds finished records until every earlier record of the same partition has
finished too, and only then acks them, oldest first.

faust can also drop records between the client and the handler without a word: a stream
skips (and acks) records of an older generation or read while its flow was stopped, and
the fetcher drops the rest of a fetch when the flow stops. When nothing seeks the
partition back (faust seeks only partitions with a committed offset above 0), the
handler then sees the records after them, and a commit of those would lose them. So the
ledger also keeps which offsets were delivered since the partition was assigned, from
where reading began (`begin`): the commit never passes the first offset not delivered,
and the continuity watch seeks such a gap back (instanced_stream/runtime/continuity.py).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["Entry", "OffsetLedger", "TopicPartition"]

TopicPartition = tuple[str, int]


@dataclass(slots=True, eq=False)
class Entry:
    tp: TopicPartition
    offset: int
    ack: Callable[[], object]
    finished: bool = False
    dropped: bool = False


@dataclass(slots=True)
class _Coverage:
    """The offsets delivered since the partition was assigned, as sorted disjoint
    half-open runs, and where reading began (None until the watch learns it)."""

    runs: list[list[int]] = field(default_factory=list)
    base: int | None = None
    probe: tuple[int, int] | None = None  # (sought to, the end delivered then)

    def add(self, start: int, end: int) -> None:
        runs = self.runs
        if runs and runs[-1][0] <= start <= runs[-1][1]:  # the common case: in order
            runs[-1][1] = max(runs[-1][1], end)
            return
        i = bisect_right(runs, [start, end])
        lo = i - 1 if i and runs[i - 1][1] >= start else i
        hi = i
        while hi < len(runs) and runs[hi][0] <= end:
            hi += 1
        if lo < hi:
            start, end = min(start, runs[lo][0]), max(end, runs[hi - 1][1])
        runs[lo:hi] = [[start, end]]

    def high(self) -> int | None:
        return self.runs[-1][1] if self.runs else self.base

    def frontier(self) -> int | None:
        """The first offset from `base` on that was not delivered."""
        if self.base is None:
            return None
        for start, end in self.runs:
            if start <= self.base < end:
                return end
        return self.base

    def gap(self) -> tuple[int, int] | None:
        """The first run of offsets never delivered with later ones delivered."""
        at = self.frontier()
        if at is None:
            return None
        later = [start for start, _ in self.runs if start > at]
        return (at, later[0]) if later else None


class OffsetLedger:
    def __init__(self) -> None:
        self._open: dict[TopicPartition, deque[Entry]] = {}
        self._rewind: dict[TopicPartition, int] = {}
        self._seen: dict[TopicPartition, _Coverage] = {}
        self.acked = 0

    def track(self, tp: TopicPartition, offset: int, ack: Callable[[], object]) -> Entry:
        """Registers a record as it is delivered."""
        entry = Entry(tp, offset, ack)
        self._open.setdefault(tp, deque()).append(entry)
        seen = self._seen.get(tp)
        if seen is None:
            seen = self._seen[tp] = _Coverage()
        if seen.probe is not None and seen.probe[0] <= offset < seen.probe[1]:
            # The first record read again after a seek: the broker holds nothing before it.
            seen.add(seen.probe[0], offset)
            seen.probe = None
        seen.add(offset, offset + 1)
        return entry

    def begin(self, tp: TopicPartition, offset: int) -> None:
        """Where reading of the partition began: nothing is committed before this is known."""
        seen = self._seen.setdefault(tp, _Coverage())
        if seen.base is None:
            seen.base = offset

    def begun(self, tp: TopicPartition) -> bool:
        seen = self._seen.get(tp)
        return seen is not None and seen.base is not None

    def seen_next(self, tp: TopicPartition) -> int | None:
        """The offset after the highest one delivered since the partition was assigned
        (where reading began, while nothing was; None: not known yet)."""
        seen = self._seen.get(tp)
        return None if seen is None else seen.high()

    def gap(self, tp: TopicPartition) -> tuple[int, int] | None:
        """Offsets `[start, end)` never delivered while later ones were."""
        seen = self._seen.get(tp)
        return None if seen is None else seen.gap()

    def sought(self, tp: TopicPartition, offset: int) -> None:
        """The partition was sought back to `offset` to read a gap again: the first record
        from there on, below what was delivered by then, shows where the broker has data."""
        seen = self._seen.get(tp)
        high = None if seen is None else seen.high()
        if seen is not None and high is not None and offset < high:
            seen.probe = (offset, high)

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
            self._seen.pop(tp, None)
            for entry in self._open.pop(tp, ()):
                entry.dropped = True
                dropped += 1
                self._rewind[tp] = min(entry.offset, self._rewind.get(tp, entry.offset))
        return dropped

    def rewinds(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Where to re-read partitions that come back to us after a rebalance.

        faust seeks a partition it keeps across a rebalance back to its committed offset
        only when that is above 0, so records that were in flight when it was revoked (and
        dropped here) might never come again: the caller seeks these partitions back to
        their oldest dropped offset."""
        return {tp: self._rewind.pop(tp) for tp in list(tps) if tp in self._rewind}

    def commit_point(self, tp: TopicPartition) -> int | None:
        """The highest offset that may be committed: the oldest unfinished record, or the
        first offset from where reading began that was never delivered; None while where
        reading began is not known, or nothing was delivered.

        faust also acks on its own (it skips records of an older consumer generation that
        were queued before a rebalance) and commits past a hole when its committed offset
        is 0 or unknown; so this, not faust's proposal, is what the processor commits."""
        seen = self._seen.get(tp)
        frontier = None if seen is None or not seen.runs else seen.frontier()
        if frontier is None:
            return None  # nothing delivered since the assignment: nothing to commit
        queue = self._open.get(tp)
        # Not queue[0]: after a rewind, re-read older offsets queue behind newer ones.
        return min(frontier, min(e.offset for e in queue)) if queue else frontier

    def open_count(self) -> int:
        return sum(len(q) for q in self._open.values())

    def lowest_open(self, tp: TopicPartition) -> int | None:
        queue = self._open.get(tp)
        return queue[0].offset if queue else None
