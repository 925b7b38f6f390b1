"""The continuity watch: every record on an assigned partition reaches its handler.

faust can drop records between the client and the handlers without a word (see
instanced_stream/runtime/offsets.py): in the restart tests, the rest of a new assignment's first
fetch vanished, records were skipped while later ones were handled, and once, in CI, a
partition's records stayed on the broker unfetched. The ledger caps every commit below
the first record its handler never saw, so nothing is lost; but such records would wait
for the next restart, and a workflow waiting for one would wait until its deadline.

So, every few seconds, for each tracked partition:
- newly assigned: the ledger learns where reading began (its committed offset, else its
  earliest), and commits nothing before that;
- a gap (offsets never handled while later ones were) seen on two checks in a row: the
  partition is sought back to it (handlers are idempotent: a repeated result, approval or
  input finds its change applied); the first record that comes again shows where the
  broker has data, so a gap Kafka itself leaves (transaction markers, compaction) closes;
- idle, with its end past the next offset the handler expects, on two checks in a row:
  consumed but never handled (the position is past it), it is sought back there; never
  consumed (the position rests there), it is resumed in faust if faust holds it
  paused, and sought there, which makes the client fetch it afresh. After a few tries
  with nothing new, such a tail is left alone (uncommitted: a restart reads it again).
A handler busy on one record for a minute is reported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from instanced_stream.runtime.offsets import OffsetLedger, TopicPartition

__all__ = ["Client", "Continuity", "Handling"]

log = logging.getLogger("stream.processor")

_TRIES = 3  # re-reads of one gap before it counts as Kafka's own
_BUSY_REPORT_S = 60.0  # a handler busy this long on one record is reported


@dataclass(slots=True)
class Handling:
    """Whether a topic's handler is at work, and since when it works or waits."""

    busy: int = 0
    since: float = 0.0  # when it last finished a record (idle since then)
    started: float = 0.0  # when its current record began
    reported: bool = False

    @contextmanager
    def one(self) -> Iterator[None]:
        if not self.busy:
            self.started, self.reported = time.monotonic(), False
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1
            self.since = time.monotonic()

    def idle_for(self, now: float) -> float:
        return 0.0 if self.busy else now - self.since


class Client(Protocol):
    """The watch's view of the Kafka consumer."""

    async def ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Where the partitions end on the broker now (one round trip for all: the end a
        fetch last saw goes stale when the client stops fetching a partition)."""

    async def position(self, tp: TopicPartition) -> int | None:
        """The client's consumed position."""

    async def starts(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Where reading of the partitions began: the committed offset, else the earliest
        (one round trip for all that have none)."""

    async def seek(self, tp: TopicPartition, offset: int) -> None: ...

    def held(self, tp: TopicPartition) -> str | None:
        """Why the client does not fetch the partition now (paused, flow stopped), or None."""

    def release(self, tp: TopicPartition) -> None:
        """Lets the client fetch the partition again."""


class Continuity:
    def __init__(
        self, ledger: OffsetLedger, topics: Iterable[str], client: Client, idle_s: float = 2.0
    ) -> None:
        self.ledger = ledger
        self.handling = {topic: Handling(since=time.monotonic()) for topic in topics}
        self.client = client
        self.idle_s = idle_s
        self._tries: dict[TopicPartition, tuple[int, int]] = {}  # (offset, re-reads)
        self._resting: dict[TopicPartition, int] = {}  # a tail seen at this offset last check
        self._gaps: dict[TopicPartition, int] = {}  # a gap's start seen on the last check
        self._passed: dict[TopicPartition, int] = {}  # a tail given up on, below this
        self.reread = 0  # records sought back to, for the metrics and tests
        self.refetched = 0  # partitions made to fetch again

    async def begin(self, assigned: Iterable[TopicPartition]) -> None:
        """Tells the ledger where reading of newly assigned partitions began (nothing of
        theirs is committed before)."""
        new = [tp for tp in assigned if tp[0] in self.handling and not self.ledger.begun(tp)]
        if new:
            for tp, start in (await self.client.starts(new)).items():
                self._passed.pop(tp, None)
                self.ledger.begin(tp, start)

    async def check(self, assigned: Iterable[TopicPartition]) -> None:
        """Learns where reading of new partitions began, seeks back gaps the handlers
        never saw, and every idle partition whose records were consumed but never
        handled, or were never fetched."""
        now = time.monotonic()
        assigned = [tp for tp in assigned if tp[0] in self.handling]
        await self.begin(assigned)
        idle: list[TopicPartition] = []
        for tp in assigned:
            handling = self.handling[tp[0]]
            busy_s = now - handling.started
            if handling.busy and not handling.reported and busy_s >= _BUSY_REPORT_S:
                handling.reported = True
                log.warning(
                    "%s: its handler has been on the same records for %.0f s (backpressure "
                    "while the LLM is down looks like this; else it is stuck)",
                    tp[0],
                    busy_s,
                )
            is_idle = not handling.busy and handling.idle_for(now) >= self.idle_s
            gap = self.ledger.gap(tp)
            if gap is not None:
                await self._gap(tp, gap, is_idle)
            else:
                self._gaps.pop(tp, None)
                if is_idle:
                    idle.append(tp)
        ends = await self.client.ends(idle) if idle else {}
        for tp in idle:
            await self._check(tp, ends.get(tp))

    async def _gap(self, tp: TopicPartition, gap: tuple[int, int], idle: bool) -> None:
        # Seen once, the gap may be records read again on their way (after a rewind,
        # records fetched before it can come first); twice at the same offset, it is not.
        # A gap is never passed over: the commit waits below it, and a restart reads it.
        start, end = gap
        if self._gaps.get(tp) != start:
            self._gaps[tp] = start
            return
        at, tries = self._tries.get(tp, (start, 0))
        tries = tries if at == start else 0
        if tries and not idle:
            return  # sought already; the handler is still on the records before them
        self._tries[tp] = (start, tries + 1)
        if tries < _TRIES:
            log.warning(
                "%s/%d: %d..%d were never handled while later records were (the client "
                "skipped them); reading them again",
                *tp,
                start,
                end - 1,
            )
            self.reread += end - start
        if self.client.held(tp) is not None:
            self.client.release(tp)
        self.ledger.sought(tp, start)
        await self.client.seek(tp, start)

    async def _check(self, tp: TopicPartition, end: int | None) -> None:
        # The position costs a round trip through faust's consumer thread: asked only
        # where the partition's end lies past what was handled.
        expected = self.ledger.seen_next(tp)
        if expected is not None:
            expected = max(expected, self._passed.get(tp, expected))
        if not end or expected is None or end <= expected:
            self._resting.pop(tp, None)
            return
        position = await self.client.position(tp)
        if position is None:
            return
        unfetched = position <= expected
        # Once may be a record on its way (a fetch under way, or one consumed and queued
        # in faust for the handler): twice in a row (checks are seconds apart) is a stall.
        if self._resting.get(tp) != expected:
            self._resting[tp] = expected
            return
        if unfetched:
            held = self.client.held(tp)
            what = f"were never fetched ({held or 'not held'})"
        else:
            what = "were consumed but never handled"
        self._resting.pop(tp, None)
        upto = (end if unfetched else position) - 1
        at, tries = self._tries.get(tp, (expected, 0))
        tries = tries if at == expected else 0
        if tries >= _TRIES:
            log.info(
                "%s/%d: %d..%d brought nothing after %d tries; passed over (uncommitted: "
                "a restart or rebalance reads them again)",
                *tp,
                expected,
                upto,
                tries,
            )
            self._passed[tp] = upto + 1
            self._tries.pop(tp, None)
            return
        self._tries[tp] = (expected, tries + 1)
        log.warning("%s/%d: %d..%d %s; reading them again", *tp, expected, upto, what)
        if unfetched:
            self.client.release(tp)
            self.refetched += 1
        else:
            self.reread += position - expected
        await self.client.seek(tp, expected)
