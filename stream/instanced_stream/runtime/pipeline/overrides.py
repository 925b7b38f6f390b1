"""The context topic on Kafka: loads the override messages at start, then follows them.

What the messages mean and how they merge into the spec is pure and lives in
instanced_stream.core.overrides; this module only reads the compacted topic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiokafka import TopicPartition

from instanced_stream.core.overrides import Messages, Refused, apply_overrides
from instanced_stream.core.spec import AgentSpec
from instanced_stream.kafka import clients
from instanced_stream.kafka.topics import partitions, read_topic

__all__ = ["OverrideFollower", "load_overrides"]

log = logging.getLogger("stream.context")


async def load_overrides(bootstrap: str, topic: str) -> tuple[Messages, dict[int, int]]:
    """The latest message per key, and where each partition ended (to follow from)."""
    messages: Messages = {}
    ends: dict[int, int] = {}
    async for rec in read_topic(bootstrap, topic):
        if rec.key is not None:
            messages[rec.key.decode("utf-8", "replace")] = rec.value
        ends[rec.partition] = rec.offset + 1
    return messages, ends


class OverrideFollower:
    """Follows the context topic after the initial load; calls back with each new spec."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        base: AgentSpec,
        messages: Messages,
        ends: dict[int, int],
        on_change: Callable[[AgentSpec, Refused], None],
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.base = base
        self.messages = dict(messages)
        self.ends = ends
        self.on_change = on_change
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="context-follower")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _apply(self, batch: dict[TopicPartition, list[Any]]) -> None:
        """Applies a batch of context messages as one change: all of it, or (should the
        new spec fail to build or install) none of it."""
        before = dict(self.messages)
        for records in batch.values():
            for rec in records:
                if rec.key is not None:
                    self.messages[rec.key.decode("utf-8", "replace")] = rec.value
        if self.messages == before:
            return
        try:
            spec, refused = apply_overrides(self.base, self.messages)
            self.on_change(spec, refused)
        except Exception:
            self.messages = before  # the running configuration stays as it was
            raise
        log.info(
            "context changed: %d advisors, %d global inputs", len(spec.advisors), len(spec.inputs)
        )

    async def _run(self) -> None:
        consumer = clients.consumer(self.bootstrap)
        try:  # a stop while it starts (SIGTERM while joining) closes it too
            await consumer.start()
            tps = [
                TopicPartition(self.topic, p) for p in await partitions(self.bootstrap, self.topic)
            ]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, self.ends.get(tp.partition, 0))
            while True:
                try:
                    batch = await consumer.getmany(timeout_ms=1000)
                    self._apply(batch)
                except Exception:  # the follower must outlive a bad message or a hiccup
                    log.exception("context follower: this change was not applied")
                    await asyncio.sleep(1.0)
        finally:
            await consumer.stop()
