"""Creates the topics the product uses, with the partition count ops chose.

Explicit creation instead of broker auto-create: auto-created topics get the broker's
default of one partition, which would silently cap a deployment at one processor.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any

import orjson
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.admin import NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from stream.core.spec import AgentSpec
from stream.runtime import clients
from stream.settings import Settings

__all__ = [
    "activity_topics",
    "ensure_product_topics",
    "ensure_topics",
    "partitions",
    "product_topics",
    "read_json",
    "read_topic",
    "state_changelog",
]

log = logging.getLogger("stream.topics")


def state_changelog(settings: Settings) -> str:
    """faust names a table's changelog `<app id>-<table>-changelog`."""
    return f"{settings.topic_prefix}{settings.app_id}-state-changelog"


def activity_topics(settings: Settings, spec: AgentSpec) -> list[str]:
    t = settings.topics
    return [tool.topic or t.activity(tool.name) for tool in spec.tools if tool.kind == "activity"]


def product_topics(settings: Settings, spec: AgentSpec) -> list[str]:
    t = settings.topics
    names = [t.input, t.dead_letter, t.no_action]
    if spec.advisors:
        names += [t.advice, t.review]
    # Results, done and approvals are always there: awaited calls need no plan.
    names += [t.results, t.done, t.proposals, t.approvals]
    return names + activity_topics(settings, spec)


async def ensure_product_topics(bootstrap: str, settings: Settings, spec: AgentSpec) -> None:
    """Every topic the product uses; the context topic is compacted, one partition, so
    every processor reads all of it in order."""
    await ensure_topics(bootstrap, product_topics(settings, spec), settings.partitions)
    await ensure_topics(
        bootstrap, [settings.topics.context], 1, config={"cleanup.policy": "compact"}
    )
    # The state table's changelog, co-partitioned with the input topic: each instance's
    # state is written to its input's partition.
    await ensure_topics(
        bootstrap,
        [state_changelog(settings)],
        settings.partitions,
        config={"cleanup.policy": "compact"},
    )


async def ensure_topics(
    bootstrap: str,
    names: Iterable[str],
    count: int,
    replication: int = 1,
    config: dict[str, str] | None = None,
) -> list[str]:
    """Creates the missing ones; returns what was created. Existing topics are left alone."""
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [n for n in dict.fromkeys(names) if n not in existing]
        if missing:
            # Another replica may have created one first: that is fine.
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(
                    [
                        NewTopic(
                            n,
                            num_partitions=count,
                            replication_factor=replication,
                            topic_configs=config or {},
                        )
                        for n in missing
                    ]
                )
            log.info("created topics %s with %d partitions", missing, count)
        return missing
    finally:
        await admin.close()


async def partitions(bootstrap: str, topic: str) -> list[int]:
    """The topic's partition numbers, straight from the broker (none if it is missing)."""
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        # Asking about a missing topic by name would make the broker auto-create it with
        # one partition, capping a later deployment at one processor: look first.
        if topic not in set(await admin.list_topics()):
            return []
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return sorted(
        p["partition"]
        for d in described
        if d.get("error_code") == 0
        for p in d.get("partitions", [])
    )


async def read_topic(bootstrap: str, topic: str) -> AsyncIterator[ConsumerRecord[bytes, bytes]]:
    """Yields every record on a topic, from the beginning up to its end at the call."""
    tps = [TopicPartition(topic, p) for p in await partitions(bootstrap, topic)]
    if not tps:
        return
    consumer = clients.consumer(bootstrap)
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
                        yield rec
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
    finally:
        await consumer.stop()


async def read_json(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every record's value on a topic, parsed (what the demo and the tests inspect)."""
    return [orjson.loads(rec.value or b"{}") async for rec in read_topic(bootstrap, topic)]
