"""The continuity watch: every record the Kafka client consumed reaches its handler.

faust hands a new assignment's first records to the streams while it is still seeking
the partitions to their committed offsets, and the rest of that fetch can then vanish:
the client's position moves past records no handler ever sees (it happened in the
restart tests, on the results topic, about one run in four under load). The ledger caps
every commit, so none is committed past them; but they would wait for the next
rebalance, and a workflow waiting for such a result would wait until its deadline.

So, every few seconds, for each partition whose handler is idle: if the client's
position is past the next offset the handler expects, the partition is sought back
there and the records come again (handlers are idempotent: a repeated result, approval
or input finds its change applied). A gap Kafka itself leaves (transaction markers,
compaction) reads as nothing new; after a few tries it is passed over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from stream.runtime.offsets import OffsetLedger, TopicPartition

__all__ = ["Continuity", "Handling"]

log = logging.getLogger("stream.processor")

_TRIES = 3  # re-reads of one gap before it counts as Kafka's own


@dataclass(slots=True)
class Handling:
    """Whether a topic's handler is at work, and since when it waits for records."""

    busy: int = 0
    since: float = 0.0

    @contextmanager
    def one(self) -> Iterator[None]:
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1
            self.since = time.monotonic()

    def idle_for(self, now: float) -> float:
        return 0.0 if self.busy else now - self.since


class Continuity:
    """`highwater(tp)`: the end of the partition as last fetched (cheap, no round trip);
    `position(tp)`: the client's consumed position; `start(tp)`: where reading of a
    partition began (its committed offset, else its earliest); `seek(tp, offset)`."""

    def __init__(
        self,
        ledger: OffsetLedger,
        topics: Iterable[str],
        highwater: Callable[[TopicPartition], int | None],
        position: Callable[[TopicPartition], Awaitable[int | None]],
        start: Callable[[TopicPartition], Awaitable[int | None]],
        seek: Callable[[TopicPartition, int], Awaitable[None]],
        idle_s: float = 2.0,
    ) -> None:
        self.ledger = ledger
        self.handling = {topic: Handling(since=time.monotonic()) for topic in topics}
        self.highwater, self.position, self.start, self.seek = highwater, position, start, seek
        self.idle_s = idle_s
        self._tries: dict[TopicPartition, tuple[int, int]] = {}  # (offset, re-reads)
        self.reread = 0  # records sought back to, for the metrics and tests

    async def check(self, assigned: Iterable[TopicPartition]) -> None:
        """Seeks back every idle partition whose position passed records never seen."""
        now = time.monotonic()
        for tp in assigned:
            handling = self.handling.get(tp[0])
            if handling is None or handling.idle_for(now) < self.idle_s:
                continue
            # The position and the start cost a round trip through faust's consumer
            # thread: asked only where the partition's end lies past what was handled.
            end, expected = self.highwater(tp), self.ledger.seen_next(tp)
            if not end or (expected is not None and end <= expected):
                continue
            position = await self.position(tp)
            if expected is None:
                expected = await self.start(tp)
                if position is not None and expected is not None and position <= expected:
                    self.ledger.pass_over(tp, expected)  # the baseline: next time is cheap
            if position is None or expected is None or position <= expected:
                self._tries.pop(tp, None)
                continue
            at, tries = self._tries.get(tp, (expected, 0))
            tries = tries if at == expected else 0
            if tries >= _TRIES:
                log.info("%s/%d: %d..%d hold no records; passed over", *tp, expected, position - 1)
                self.ledger.pass_over(tp, position)
                self._tries.pop(tp, None)
                continue
            self._tries[tp] = (expected, tries + 1)
            log.warning(
                "%s/%d: %d..%d were consumed but never handled; reading them again",
                *tp,
                expected,
                position - 1,
            )
            self.reread += position - expected
            await self.seek(tp, expected)
