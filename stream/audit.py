"""Conservation check: every input item must end as a published call, an explicit
NoAction, or an item-level dead letter. Reports missing, duplicated and unexpected records.

Shipped as `stream audit` so users can run the same check against their own topics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import BaseModel, Field

from stream.models import ITEM_CODES
from stream.settings import Topics

__all__ = ["AuditReport", "audit", "read_topic"]

Position = tuple[str, int, int]


class AuditReport(BaseModel):
    inputs: int
    accounted: int
    missing: list[Position] = Field(description="Input items with no outcome yet")
    duplicate_calls: int = Field(description="Activity records whose call_id was seen before")
    unexpected: int = Field(description="Outcomes whose source is not on the input topic")
    calls_by_tool: dict[str, int]
    fire_and_forget: int
    reviewed: int = Field(description="Calls the advice gate sent to the review topic")
    no_action: int
    dead_letters: dict[str, int] = Field(description="Dead letters by code (item and call)")
    item_dead_letters: int
    instances_in_calls: list[str] = Field(default_factory=list, exclude=True)

    @property
    def unaccounted(self) -> int:
        return len(self.missing)


async def read_topic(bootstrap: str, topic: str) -> AsyncIterator[tuple[int, int, bytes | None]]:
    """Yields (partition, offset, value) of everything on a topic up to its current end."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    parts = [
        p["partition"]
        for d in described
        if d.get("error_code") == 0
        for p in d.get("partitions", [])
    ]
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    if not tps:
        return
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        todo = {tp for tp in tps if ends[tp] > 0}
        while todo:
            batch = await consumer.getmany(*todo, timeout_ms=1000)
            for tp, records in batch.items():
                for rec in records:
                    if rec.offset < ends[tp]:
                        yield tp.partition, rec.offset, rec.value
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
    finally:
        await consumer.stop()


async def audit(bootstrap: str, topics: Topics, activity_topics: list[str]) -> AuditReport:
    """Reads the input topic and every outcome topic (activity, review, no-action, dead
    letters) and reports which input items have no outcome."""
    input_topic = topics.input
    inputs: set[Position] = set()
    async for partition, offset, _ in read_topic(bootstrap, input_topic):
        inputs.add((input_topic, partition, offset))
    accounted: set[Position] = set()
    unexpected = 0
    calls: Counter[str] = Counter()
    letters: Counter[str] = Counter()
    seen_ids: set[str] = set()
    duplicates = fire_and_forget = no_action = item_letters = reviewed = 0
    instances: list[str] = []

    def mark(source: dict[str, object] | None) -> None:
        nonlocal unexpected
        if not source:
            return
        pos = (str(source["topic"]), int(source["partition"]), int(source["offset"]))  # type: ignore[call-overload]
        if pos[0] != input_topic:
            return
        if pos in inputs:
            accounted.add(pos)
        else:
            unexpected += 1

    for topic in [*activity_topics, topics.review]:
        async for _, _, value in read_topic(bootstrap, topic):
            rec = orjson.loads(value or b"{}")
            if rec.get("call_id") in seen_ids:
                duplicates += 1
                continue
            seen_ids.add(rec.get("call_id"))
            if topic == topics.review:
                reviewed += 1
            else:
                calls[rec.get("tool", "?")] += 1
            if "_outputPath" not in rec.get("call", {}):
                fire_and_forget += 1
            instances.append(str(rec.get("instance")))
            mark(rec.get("source"))
    async for _, _, value in read_topic(bootstrap, topics.no_action):
        no_action += 1
        mark(orjson.loads(value or b"{}").get("source"))
    async for _, _, value in read_topic(bootstrap, topics.dead_letter):
        rec = orjson.loads(value or b"{}")
        letters[rec.get("code", "?")] += 1
        if rec.get("scope") == "item" and rec.get("code") in ITEM_CODES:
            item_letters += 1
            mark(rec.get("source"))
    return AuditReport(
        inputs=len(inputs),
        accounted=len(accounted),
        missing=sorted(inputs - accounted),
        duplicate_calls=duplicates,
        unexpected=unexpected,
        calls_by_tool=dict(calls),
        fire_and_forget=fire_and_forget,
        reviewed=reviewed,
        no_action=no_action,
        dead_letters=dict(letters),
        item_dead_letters=item_letters,
        instances_in_calls=instances,
    )
