"""The feed takes the input topic out of faust's fetches; batches send in order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from instanced_stream.core.messages import SourcePosition
from instanced_stream.runtime.continuity import Handling
from instanced_stream.runtime.feed import Feed
from instanced_stream.runtime.publish import Order


def _rec(topic: str, partition: int, offset: int, key: bytes = b"k") -> Any:
    return SimpleNamespace(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        value=b'{"comment": "hi"}',
        timestamp=1_700_000_000_000,
        headers=[],
    )


class _Consumer:
    """faust's consumer as the feed sees it: one fetch call, answered from a script."""

    def __init__(self, answers: list[dict[Any, list[Any]]]) -> None:
        self.answers = answers
        self.asked: list[tuple[set[Any], float]] = []

    async def _getmany(self, active_partitions: set[Any], timeout: float) -> dict[Any, Any]:  # noqa: ASYNC109
        self.asked.append((set(active_partitions), timeout))
        return self.answers.pop(0) if self.answers else {}


async def _offered(feed: Feed, until: int) -> list[SourcePosition]:
    seen: list[SourcePosition] = []

    async def offer(
        value: bytes | None, key: bytes | None, source: SourcePosition, ack: Callable[[], object]
    ) -> None:
        seen.append(source)

    task = asyncio.create_task(feed.run(offer))
    for _ in range(100):
        if len(seen) >= until:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return seen


async def test_the_input_topic_never_reaches_faust_and_is_offered_in_order() -> None:
    fetched = {
        TP("items", 0): [_rec("items", 0, 5), _rec("items", 0, 6)],
        TP("results", 0): [_rec("results", 0, 1)],
        TP("items", 1): [_rec("items", 1, 9, key=b"x" * 300)],
    }
    consumer = _Consumer([fetched])
    feed = Feed("items", Handling())
    feed.tap(consumer)
    feed.tap(consumer)  # every assignment taps again: only the first one counts
    feed.assigned([("items", 0), ("items", 1), ("results", 0)])
    left = await consumer._getmany(active_partitions={TP("items", 0)}, timeout=1.0)
    assert list(left) == [TP("results", 0)]  # faust still gets every other topic
    seen = await _offered(feed, 3)
    assert [(s.partition, s.offset) for s in seen] == [(0, 5), (0, 6), (1, 9)]
    assert seen[0].timestamp_ms == 1_700_000_000_000 and seen[0].key == "k"
    assert seen[2].key is not None and seen[2].key.endswith("(300 bytes)")  # a huge key, cut


async def test_records_of_a_partition_revoked_meanwhile_are_left_to_its_next_owner() -> None:
    consumer = _Consumer(
        [{TP("items", 0): [_rec("items", 0, 1)], TP("items", 1): [_rec("items", 1, 1)]}]
    )
    feed = Feed("items", Handling())
    feed.tap(consumer)
    feed.assigned([("items", 0), ("items", 1)])
    await consumer._getmany(active_partitions={TP("items", 0)}, timeout=1.0)
    feed.revoked([("items", 1)])
    seen = await _offered(feed, 1)
    assert [(s.partition, s.offset) for s in seen] == [(0, 1)]
    assert feed.left == 1


async def test_a_full_feed_leaves_the_input_out_of_the_next_fetches() -> None:
    big = {TP("items", 0): [_rec("items", 0, i) for i in range(4)]}
    consumer = _Consumer([big])
    feed = Feed("items", Handling(), max_buffered=4)
    feed.tap(consumer)
    feed.assigned([("items", 0)])
    active = {TP("items", 0), TP("results", 0)}
    await consumer._getmany(active_partitions=active, timeout=1.0)
    assert feed.buffered == 4
    await consumer._getmany(active_partitions=active, timeout=1.0)
    # Held back: only the results topic is fetched, and not for the whole second.
    assert consumer.asked[-1][0] == {TP("results", 0)} and consumer.asked[-1][1] < 1.0
    # With nothing else to fetch, the fetch waits for room instead (an empty set would
    # fetch every partition), and gives up after its timeout.
    assert await consumer._getmany(active_partitions={TP("items", 0)}, timeout=0.05) == {}
    assert len(consumer.asked) == 2
    await _offered(feed, 4)
    assert feed.buffered == 0
    await consumer._getmany(active_partitions=active, timeout=1.0)
    assert consumer.asked[-1][0] == active  # room again: the input is fetched


async def test_batches_send_in_order_and_wait_for_an_earlier_batch_of_the_same_instance() -> None:
    first = Order()
    second = Order(first)
    third = Order(second)
    first.keys, second.keys, third.keys = {b"a"}, {b"b"}, {b"a", b"c"}
    sent: list[str] = []

    async def send(name: str, order: Order) -> None:
        await order.turn()
        sent.append(name)
        order.handed()

    tasks = [asyncio.create_task(send("second", second)), asyncio.create_task(send("third", third))]
    await asyncio.sleep(0.01)
    assert sent == []  # the first batch has not handed its records over yet
    first.handed()
    await asyncio.sleep(0.01)
    # The second sends while the first's acks are awaited; the third holds a record of
    # the first's instance "a": it waits until the first has finished (a retry of the
    # first can then never land after it).
    assert sent == ["second"]
    first.finish()
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert sent == ["second", "third"]
    assert first not in third.unfinished  # finished batches are not kept alive
