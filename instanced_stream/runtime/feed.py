"""The feed: the input topic's records, taken from faust's consumer one whole fetch at a
time and handed to the pipeline as they came, without faust's per-record machinery.

faust hands each record to its agent on its own: two asyncio tasks to wait for it, an
Event, its stream's bookkeeping and sensors. With a fast model that was about a fifth of
the processor's time, and the input topic needs none of it: its records are acked by the
offset ledger (instanced_stream/runtime/offsets.py), not by faust, and they go to a batcher that
wants many at once. So the feed takes the input topic's records out of each fetch before
faust sees them. faust still subscribes to the topic, balances it with the table it is
co-partitioned with, pauses it while its table recovers and seeks it after a rebalance;
the commit of its offsets is the ledger's, as for every tracked topic (app.py).

Backpressure: while more than `max_buffered` records wait here, the input partitions are
left out of the next fetches (the client keeps what it already fetched for them), so
the results and approvals topics are still read while the LLM is slow or down.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from instanced_stream.core.messages import SourcePosition
from instanced_stream.runtime.continuity import Handling
from instanced_stream.runtime.intake import source_of
from instanced_stream.runtime.tracing import TRACES

__all__ = ["Feed", "Offer"]

# value, key, where it came from, its ack: the pipeline's `offer`.
Offer = Callable[
    [bytes | None, bytes | None, SourcePosition, Callable[[], object]], Awaitable[None]
]
Fetch = Callable[..., Awaitable[dict[Any, list[Any]]]]

_HELD_FETCH_S = 0.05  # a fetch's wait while the input is held back


def _acked() -> None:
    """The ledger acks in offset order and commits its own point: faust is told nothing."""


class Feed:
    def __init__(self, topic: str, handling: Handling, max_buffered: int = 2000) -> None:
        self.topic = topic
        self.handling = handling
        self.max_buffered = max_buffered
        self.owned: set[tuple[str, int]] = set()  # input partitions assigned now
        self.buffered = 0
        self.left = 0  # records of partitions revoked before they were offered
        self._chunks: deque[list[Any]] = deque()
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._seen_at: Callable[[Any], None] = lambda tp: None

    # ---------------------------------------------------------------- faust's side

    def tap(self, consumer: Any, monitor: Any = None) -> None:
        """Takes the input topic's records out of every fetch of faust's `consumer`
        (once: it is called on every assignment)."""
        if getattr(consumer, "_fed_by", None) is self:
            return
        consumer._fed_by = self
        fetch: Fetch = consumer._getmany  # faust's one call into the client's fetcher
        if monitor is not None:
            inbound = monitor.stream_inbound_time
            self._seen_at = lambda tp: inbound.__setitem__(tp, time.monotonic())

        async def getmany(active_partitions: Any, timeout: float) -> dict[Any, list[Any]]:  # noqa: ASYNC109
            active = active_partitions
            if active and not self._room.is_set():
                rest = {tp for tp in active if tp.topic != self.topic}
                if not rest:
                    # Nothing else to read; an empty set would fetch every partition.
                    try:
                        await asyncio.wait_for(self._room.wait(), timeout)
                    except TimeoutError:
                        return {}
                    rest = active
                else:
                    # A fetch waits its whole timeout when nothing comes: the input must
                    # not wait that long once there is room again.
                    timeout = min(timeout, _HELD_FETCH_S)
                active = rest
            records = await fetch(active_partitions=active, timeout=timeout)
            mine = [tp for tp in records if tp.topic == self.topic]
            for tp in mine:
                self.put(records.pop(tp))
                self._seen_at(tp)  # faust's stall warnings watch the input's streams
            return records

        consumer._getmany = getmany

    def put(self, records: list[Any]) -> None:
        """One partition's records of one fetch, in offset order."""
        if records:
            self._chunks.append(records)
            self.buffered += len(records)
            self._arrived.set()
            if self.buffered >= self.max_buffered:
                self._room.clear()

    def assigned(self, tps: Iterable[tuple[str, int]]) -> None:
        self.owned.update(tp for tp in tps if tp[0] == self.topic)

    def revoked(self, tps: Iterable[tuple[str, int]]) -> None:
        self.owned.difference_update(tps)

    # ---------------------------------------------------------------- the pipeline's side

    async def run(self, offer: Offer) -> None:
        """Offers every record taken, in the order taken; runs until cancelled."""
        while True:
            if not self._chunks:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            chunk = self._chunks.popleft()
            with self.handling.one():
                try:
                    await self._offer(chunk, offer)
                finally:
                    self.buffered -= len(chunk)
                    if self.buffered < self.max_buffered // 2:
                        self._room.set()

    async def _offer(self, chunk: list[Any], offer: Offer) -> None:
        for rec in chunk:
            tp = (rec.topic, rec.partition)
            if tp not in self.owned:
                # Fetched before its partition was revoked: its next owner reads it.
                self.left += 1
                continue
            source = source_of(rec.topic, rec.partition, rec.offset, rec.key, rec.timestamp)
            if rec.headers:
                TRACES.remember((rec.topic, rec.partition, rec.offset), rec.headers)
            await offer(rec.value, rec.key, source, _acked)
