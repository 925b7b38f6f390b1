"""`stream tail`: a topic's last records across partitions, oldest first, then (with
`-f`) new ones as they arrive.

`--last N` counts records, not offsets. On a topic written in transactions (every output
of an exactly-once processor) each transaction adds a commit marker: an offset that holds
no record, which a read_committed consumer steps over. Records aborted by their writer
hold offsets too and are skipped the same way. So "the last N offsets" can hold fewer
than N records, or none (the last offset of such a topic is always a marker): each
partition is read backwards in growing windows until it has given N records or has no
older ones, and a window is done when the consumer's position passed its end, whether
or not a record came back.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from aiokafka import AIOKafkaConsumer, TopicPartition

from instanced_stream.errors import StreamError
from instanced_stream.kafka import clients
from instanced_stream.ops.console import connected, format_record, topic_layout

__all__ = ["last_records", "tail"]

# A window of markers only returns nothing: getmany then waits its whole timeout, so keep
# it short (positions are checked after each poll).
_POLL_MS = 50


async def _read_windows(
    consumer: AIOKafkaConsumer, windows: dict[TopicPartition, tuple[int, int]]
) -> dict[TopicPartition, list[Any]]:
    """The committed records of `[low, high)` per partition, read at once."""
    found: dict[TopicPartition, list[Any]] = {tp: [] for tp in windows}
    for tp, (low, _) in windows.items():
        consumer.seek(tp, low)
    todo = set(windows)
    while todo:
        for tp, records in (await consumer.getmany(*todo, timeout_ms=_POLL_MS)).items():
            found[tp] += [r for r in records if r.offset < windows[tp][1]]
        # every partition, not only those that returned records: a window of markers
        # and aborted records returns none, and its position still moves past them
        for tp in list(todo):
            if await consumer.position(tp) >= windows[tp][1]:
                todo.discard(tp)
    return found


async def last_records(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition], last: int
) -> list[Any]:
    """Up to `last` records of each partition, its newest, read backwards from its end."""
    if last == 0:
        return []
    starts, ends = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
    found: dict[TopicPartition, list[Any]] = {tp: [] for tp in tps}
    high = dict(ends)
    # a transaction per record at worst (one marker each), so 2N+1 offsets usually hold N
    step = 2 * last + 1
    while active := [tp for tp in tps if len(found[tp]) < last and high[tp] > starts[tp]]:
        windows = {tp: (max(starts[tp], high[tp] - step), high[tp]) for tp in active}
        for tp, records in (await _read_windows(consumer, windows)).items():
            found[tp] = records + found[tp]
            high[tp] = windows[tp][0]
        step *= 4  # markers are at most one offset per record: this ends in a few reads
    for tp in tps:  # a follow starts at the end, whatever was read last
        consumer.seek(tp, ends[tp])
    return [r for tp in tps for r in found[tp][-last:]]


async def tail(
    bootstrap: str,
    topic: str,
    follow: bool = False,
    last: int = 20,
    as_json: bool = False,
    out: TextIO | None = None,
) -> int:
    """Prints a topic's last `last` records across partitions, oldest first; with follow,
    new ones until cancelled. Returns how many it printed."""
    if last < 0:
        raise StreamError(f"--last must be 0 or more, not {last}")
    out, printed = out or sys.stdout, 0

    def emit(records: list[Any], keep: int | None = None) -> None:
        nonlocal printed
        chosen = sorted(records, key=lambda r: (r.timestamp, r.partition, r.offset))
        for r in chosen[len(chosen) - keep :] if keep is not None else chosen:
            out.write(format_record(r, as_json) + "\n")
            printed += 1
        out.flush()

    if not (found := (await topic_layout(bootstrap)).get(topic)):
        raise StreamError(f"topic {topic} does not exist")
    consumer = clients.consumer(bootstrap)
    async with connected(bootstrap, consumer):
        tps = [TopicPartition(topic, p) for p in found]
        consumer.assign(tps)
        seen = await last_records(consumer, tps, last)
        emit(seen, min(last, len(seen)))
        while follow:
            emit([r for rs in (await consumer.getmany(timeout_ms=1000)).values() for r in rs])
    return printed
