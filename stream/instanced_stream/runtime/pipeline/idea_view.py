"""The Idea Process as the live page shows it: the processor follows the compacted Idea
Process topic (read_committed, every partition: the shares of units on other processors
too) and keeps each key's latest record; the page asks for the plans' graphs and counts
summed (core/idea_process.py `current`).

Counts only: the page has no login, so per-instance rows stay on the state changelog
(`stream process-idea --instance ID`). A processor whose spec has no plan writes no
record and shows none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiokafka import TopicPartition
from pydantic import ValidationError

from instanced_stream.core.idea_process import IdeaProcessRecord, current
from instanced_stream.kafka import clients
from instanced_stream.kafka.topics import partitions

__all__ = ["IdeaView"]

log = logging.getLogger("stream.ideas")


class IdeaView:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.latest: dict[bytes, IdeaProcessRecord] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="idea-view")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def plans(self) -> list[dict[str, Any]]:
        """Each plan edition's graph with its counts, the newest first."""
        return [p.model_dump(mode="json") for p in current(list(self.latest.values()))]

    def take(self, key: bytes | None, value: bytes | None) -> None:
        """A record of the topic, in its partition's order."""
        if key is None:
            return
        if not value:
            self.latest.pop(key, None)
            return
        try:
            self.latest[key] = IdeaProcessRecord.model_validate_json(value)
        except ValidationError as exc:  # another version's record: not shown
            log.debug("idea process record %r not read: %s", key, exc)

    async def _follow(self) -> None:
        while True:  # the topic may not exist yet, or the broker may be away: again
            try:
                await self._read()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("idea process topic not followed: %r", exc)
            await asyncio.sleep(2.0)

    async def _read(self) -> None:
        found = await partitions(self.bootstrap, self.topic)
        if not found:
            return
        consumer = clients.consumer(self.bootstrap)
        await consumer.start()
        try:
            tps = [TopicPartition(self.topic, p) for p in found]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            self.latest = {}
            while True:
                batch = await consumer.getmany(timeout_ms=1000)
                for records in batch.values():
                    for rec in records:
                        self.take(rec.key, rec.value)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()
