"""Creates the topics the product uses, with the partition count ops chose.

Explicit creation instead of broker auto-create: auto-created topics get the broker's
default of one partition, which would silently cap a deployment at one processor.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from stream.settings import Settings
from stream.spec import AgentSpec

__all__ = ["activity_topics", "ensure_topics", "product_topics"]

log = logging.getLogger("stream.topics")


def activity_topics(settings: Settings, spec: AgentSpec) -> list[str]:
    t = settings.topics
    return [tool.topic or t.activity(tool.name) for tool in spec.tools if tool.kind == "activity"]


def product_topics(settings: Settings, spec: AgentSpec) -> list[str]:
    t = settings.topics
    names = [t.input, t.dead_letter, t.no_action]
    if spec.advisors:
        names += [t.advice, t.review]
    return names + activity_topics(settings, spec)


async def ensure_topics(
    bootstrap: str, names: Iterable[str], partitions: int, replication: int = 1
) -> list[str]:
    """Creates the missing ones; returns what was created. Existing topics are left alone."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [n for n in dict.fromkeys(names) if n not in existing]
        if missing:
            # Another replica may have created one first: that is fine.
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(
                    [
                        NewTopic(n, num_partitions=partitions, replication_factor=replication)
                        for n in missing
                    ]
                )
            log.info("created topics %s with %d partitions", missing, partitions)
        return missing
    finally:
        await admin.close()
