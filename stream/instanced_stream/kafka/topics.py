"""Creates the topics the product uses, with the partition count ops chose.

Explicit creation instead of broker auto-create: auto-created topics get the broker's
default of one partition, which would silently cap a deployment at one processor.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any, Self

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.wire import json_bytes
from instanced_stream.errors import StreamError
from instanced_stream.kafka import clients
from instanced_stream.settings import Settings

__all__ = [
    "PARTITIONS_PER_REQUEST",
    "TopicReader",
    "activity_topics",
    "answer_journal",
    "batch_changelog",
    "check_partitions",
    "ensure_product_topics",
    "ensure_topics",
    "partitions",
    "product_topics",
    "read_changelog",
    "read_json",
    "read_topic",
    "record_limits",
    "state_changelog",
    "topic_batches",
]

log = logging.getLogger("stream.topics")

_DEFAULT_RF = "default.replication.factor"
_WEEK_MS = 7 * 24 * 3600 * 1000


def state_changelog(settings: Settings) -> str:
    """The state's compacted changelog, `<app id>-state-changelog` (the name faust gave
    it, kept so that existing deployments restore their state)."""
    return f"{settings.topic_prefix}{settings.app_id}-state-changelog"


def batch_changelog(settings: Settings) -> str:
    """The batch tier's record of submitted Batch API lines, co-partitioned with the input."""
    return f"{settings.topic_prefix}{settings.app_id}-batches-changelog"


def answer_journal(settings: Settings) -> str:
    """The journal of answers not yet committed (runtime/pipeline/journal.py),
    co-partitioned with the input."""
    return f"{settings.topic_prefix}{settings.app_id}-answers-journal"


def activity_topics(settings: Settings, spec: AgentSpec) -> list[str]:
    t = settings.topics
    return [tool.topic or t.activity(tool.name) for tool in spec.tools if tool.kind == "activity"]


def product_topics(settings: Settings, spec: AgentSpec) -> list[str]:
    t = settings.topics
    names = [t.input, t.dead_letter, t.no_action, t.state_updates]
    if spec.advisors:
        names += [t.advice, t.review]
    # Results, done and approvals are always there: awaited calls need no plan.
    names += [t.results, t.done, t.proposals, t.approvals]
    return names + activity_topics(settings, spec)


async def ensure_product_topics(bootstrap: str, settings: Settings, spec: AgentSpec) -> None:
    """Every topic the product uses; the context topic is compacted, one partition, so
    every processor reads all of it in order. Replication and min.insync.replicas come
    from the settings; unset, the broker's defaults apply."""
    durable = {"replication": settings.replication_factor}
    isr = settings.min_insync_replicas
    plain = {"min.insync.replicas": str(isr)} if isr else {}
    compact = {**plain, "cleanup.policy": "compact"}
    await ensure_topics(
        bootstrap, product_topics(settings, spec), settings.partitions, config=plain, **durable
    )
    await ensure_topics(bootstrap, [settings.topics.context], 1, config=compact, **durable)
    # The state table's changelog, co-partitioned with the input topic: each instance's
    # state is written to its input's partition.
    # The Idea Process topic too: each partition's unit writes its share to its own
    # partition, keyed by the plan's edition and the partition (core/idea_process.py).
    await ensure_topics(
        bootstrap,
        [state_changelog(settings), batch_changelog(settings), settings.topics.ideas],
        settings.partitions,
        config=compact,
        **durable,
    )
    # Written outside the units' transactions; an entry nobody takes (its spec changed)
    # goes with its retention, a week (runtime/pipeline/journal.py, RETENTION_MS).
    journal = {**compact, "cleanup.policy": "compact,delete", "retention.ms": str(_WEEK_MS)}
    await ensure_topics(
        bootstrap, [answer_journal(settings)], settings.partitions, config=journal, **durable
    )


async def check_partitions(bootstrap: str, settings: Settings) -> None:
    """A stateful workflow routes results and approvals by the input's partition number,
    and its state table's changelog shares the input's partitioning: once the input
    topic has more partitions than the changelog (someone added some), instances would
    be cut off from their state. Refuse to start instead (README: growing a stateful
    deployment)."""
    t = settings.topics
    counts = {
        name: len(await partitions(bootstrap, name))
        for name in (t.input, t.results, t.approvals, state_changelog(settings))
    }
    # Not listed yet: created a moment ago, with STREAM_PARTITIONS.
    counts = {name: n for name, n in counts.items() if n}
    counts[f"STREAM_PARTITIONS={settings.partitions}"] = settings.partitions
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"{name}: {n}" for name, n in counts.items())
        raise StreamError(
            f"a stateful spec needs one partition count everywhere, found {shown}: "
            "partitions were added or STREAM_PARTITIONS changed; see docs/operations.md, "
            "'Growing a stateful deployment'"
        )


async def _default_replication(admin: Any) -> int:
    """The broker's default.replication.factor (the CreateTopics versions aiokafka speaks
    cannot ask the broker to choose), else 1."""
    try:
        broker = (await admin.describe_cluster())["brokers"][0]["node_id"]
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, str(broker), {_DEFAULT_RF: None})]
        )
        for resource in response.resources:
            for entry in resource[4]:
                if entry[0] == _DEFAULT_RF:
                    return int(entry[1])
    except Exception:
        log.warning("broker default replication factor unknown; using 1", exc_info=True)
    return 1


# A KRaft controller refuses a request that would write more than 10,000 metadata records
# at once (a record per partition, and per topic and config): twelve topics of 1,024
# partitions in one CreateTopics fail whole. Half of it leaves room for those records.
PARTITIONS_PER_REQUEST = 5_000


def topic_batches(names: list[str], count: int) -> list[list[str]]:
    """`names` in groups whose partitions (`count` each) one request may create; a topic
    larger than that alone goes in a group of its own."""
    per = max(1, PARTITIONS_PER_REQUEST // max(count, 1))
    return [names[i : i + per] for i in range(0, len(names), per)]


async def ensure_topics(
    bootstrap: str,
    names: Iterable[str],
    count: int,
    replication: int | None = 1,
    config: dict[str, str] | None = None,
) -> list[str]:
    """Creates the missing ones; returns what was created. Existing topics are left alone.
    `replication` None: the broker's default."""
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [n for n in dict.fromkeys(names) if n not in existing]
        if missing:
            replication = replication or await _default_replication(admin)
            for batch in topic_batches(missing, count):
                # Another replica may have created one first: that is fine.
                response = None
                with contextlib.suppress(TopicAlreadyExistsError):
                    response = await admin.create_topics(
                        [
                            NewTopic(
                                n,
                                num_partitions=count,
                                replication_factor=replication,
                                topic_configs=config or {},
                            )
                            for n in batch
                        ]
                    )
                _raise_refusals(response)
            log.info("created topics %s with %d partitions", missing, count)
        return missing
    finally:
        await admin.close()


def _raise_refusals(response: Any) -> None:
    """The broker answers per topic; a refused one (say, more replicas than brokers) must
    stop the start with its reason, not leave a topic missing without a word."""
    refused = [
        f"{err[0]}: {err[2] if len(err) > 2 and err[2] else f'error {err[1]}'}"
        for err in getattr(response, "topic_errors", [])
        if err[1] not in (0, TopicAlreadyExistsError.errno)
    ]
    if refused:
        raise StreamError("the broker refused to create topics: " + "; ".join(refused))


class TopicReader:
    """Reads many topics over one admin client and one consumer, each started on first
    need and closed when the `async with` ends. A client start is a bootstrap and a few
    round trips: an audit reads some nine topics, and tests poll audits about once a
    second, so a pair of clients per topic was ~18 client starts a second.

    The broker's topic metadata is fetched once and kept for the reader's life (asked
    again only for a topic it did not list): a reader lives for one job, so a partition
    added meanwhile is seen by the next reader. Reads share the consumer and so run one
    at a time: a read started before the last one finished takes the consumer over, and
    the older read fails rather than go on from partitions it no longer holds."""

    def __init__(self, bootstrap: str) -> None:
        self._bootstrap = bootstrap
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None
        # topic -> its partition numbers, for the topics the broker listed without error
        self._partitions_by_topic: dict[str, list[int]] | None = None
        # Counts reads begun: a read whose number is no longer the latest lost the consumer.
        self._reads_begun = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        admin, consumer = self._admin, self._consumer
        self._admin = self._consumer = None
        try:
            if consumer is not None:
                await consumer.stop()
        finally:
            if admin is not None:
                await admin.close()

    async def _started_admin(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = clients.admin(self._bootstrap)
            await admin.start()
            self._admin = admin
        return self._admin

    async def _started_consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = clients.consumer(self._bootstrap)
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def partitions(self, topic: str) -> list[int]:
        """The topic's partition numbers, from the broker (none if it is missing)."""
        if self._partitions_by_topic is None or topic not in self._partitions_by_topic:
            admin = await self._started_admin()
            # Every topic's metadata, not the one asked for: asking about a missing topic
            # by name would make the broker auto-create it with one partition, capping a
            # later deployment at one processor. It is the request list_topics makes.
            described = await admin.describe_topics()
            self._partitions_by_topic = {
                d["topic"]: sorted(p["partition"] for p in d.get("partitions", []))
                for d in described
                if d.get("error_code") == 0
            }
        return list(self._partitions_by_topic.get(topic, []))

    async def read(
        self, topic: str, since_ms: int | None = None, since_offset: int | None = None
    ) -> AsyncGenerator[ConsumerRecord[bytes, bytes], None]:
        """Yields every record on a topic up to its end at the call: from the beginning,
        or from the first record at or after `since_ms` (epoch ms), or from
        `since_offset` on every partition (so a scheduled reader need not hold what
        retention keeps)."""
        tps = [TopicPartition(topic, p) for p in await self.partitions(topic)]
        if not tps:
            return
        consumer = await self._started_consumer()
        self._reads_begun += 1
        this_read = self._reads_begun
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        todo = {tp for tp in tps if ends[tp] > 0}
        if since_ms is not None:
            found = await consumer.offsets_for_times(dict.fromkeys(todo, since_ms))
            todo = {tp for tp in todo if found.get(tp) is not None}
            for tp in todo:
                consumer.seek(tp, found[tp].offset)
        elif since_offset is not None:
            for tp in list(todo):
                if since_offset >= ends[tp]:
                    todo.discard(tp)
                elif since_offset > await consumer.position(tp):
                    consumer.seek(tp, since_offset)
        while todo:
            batch = await consumer.getmany(*todo, timeout_ms=1000)
            for tp, records in batch.items():
                for rec in records:
                    if rec.offset < ends[tp]:
                        yield rec
            # The caller may have started another read while this one was paused at a
            # yield: the consumer now holds that read's partitions.
            if this_read != self._reads_begun:
                raise StreamError(
                    f"reading {topic}: another read of this TopicReader took its consumer; "
                    "finish one read before starting the next"
                )
            # Every partition, not only those that returned records: an aborted transaction
            # at a partition's end moves the position past it with no record to show.
            for tp in list(todo):
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)


async def partitions(bootstrap: str, topic: str) -> list[int]:
    """The topic's partition numbers, straight from the broker (none if it is missing)."""
    async with TopicReader(bootstrap) as reader:
        return await reader.partitions(topic)


async def read_topic(
    bootstrap: str, topic: str, since_ms: int | None = None, since_offset: int | None = None
) -> AsyncIterator[ConsumerRecord[bytes, bytes]]:
    """TopicReader.read over a reader of its own, for a caller reading one topic."""
    # aclosing: a caller that stops early closes the read before its reader's clients.
    async with (
        TopicReader(bootstrap) as reader,
        contextlib.aclosing(reader.read(topic, since_ms, since_offset)) as records,
    ):
        async for rec in records:
            yield rec


async def read_json(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every record's value on a topic, parsed (what the demo and the tests inspect)."""
    return [orjson.loads(json_bytes(rec.value)) async for rec in read_topic(bootstrap, topic)]


async def record_limits(bootstrap: str, topics: set[str]) -> dict[str, int]:
    """Each topic's `max.message.bytes` as the broker holds it now (ops may lower it on a
    live topic): what a record batch written there may weigh."""
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        resources = [
            ConfigResource(ConfigResourceType.TOPIC, t, {"max.message.bytes": None})
            for t in sorted(topics)
        ]
        responses = await admin.describe_configs(resources)
    finally:
        await admin.close()
    found: dict[str, int] = {}
    for response in responses:
        for resource in response.resources:
            for entry in resource[4]:
                if entry[0] == "max.message.bytes" and entry[1] is not None:
                    found[str(resource[3])] = int(entry[1])
    return found


async def read_changelog(bootstrap: str, topic: str, partition: int) -> dict[str, bytes]:
    """A compacted changelog partition as it stands: read read_committed to its last
    stable offset, each key's latest value, deleted keys (tombstones) left out."""
    tp = TopicPartition(topic, partition)
    out: dict[str, bytes] = {}
    consumer = clients.consumer(bootstrap)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        while await consumer.position(tp) < end:
            found = await consumer.getmany(tp, timeout_ms=1000)
            for rec in found.get(tp, []):
                key = rec.key.decode() if rec.key else None
                if key is None:
                    continue
                if rec.value:
                    out[key] = rec.value
                else:
                    out.pop(key, None)
    finally:
        await consumer.stop()
    return out
