"""Global messages from the compacted context topic: advisors and global inputs that ops
change without redeploying the spec.

Each record's key names the message (an advisor id, or an input's name); the latest
record per key wins and a tombstone removes it. Context messages override the spec's
advisors of the same id. A message that does not validate is refused, with a reason
naming the message and the field, and the rest still apply: one bad record must not stop
a running processor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from stream.core.spec import AgentSpec
from stream.runtime.security import options_for
from stream.runtime.topics import partitions, read_topic

__all__ = ["ContextFollower", "apply_context", "load_context"]

log = logging.getLogger("stream.context")

Messages = dict[str, bytes | None]


def _problem(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
    )


def apply_context(spec: AgentSpec, messages: Messages) -> tuple[AgentSpec, list[tuple[str, str]]]:
    """The spec with the context messages merged in, and the refused ones with reasons."""
    base = spec.model_dump(by_alias=True)
    advisors: dict[str, Any] = {a["id"]: a for a in base["advisors"]}
    inputs: dict[str, Any] = {}
    refused: list[tuple[str, str]] = []
    for key, value in sorted(messages.items()):
        if value is None:
            continue  # a tombstone: the message was removed
        try:
            message = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            refused.append((key, f"context message {key!r} is not JSON: {exc}"))
            continue
        kind = message.get("type") if isinstance(message, dict) else None
        if kind not in ("advisor", "input"):
            refused.append((key, f"context message {key!r}: type must be advisor or input"))
            continue
        trial_advisors, trial_inputs = dict(advisors), dict(inputs)
        if kind == "advisor":
            trial_advisors[str(message.get("id", key))] = message
        else:
            trial_inputs[key] = message
        try:
            AgentSpec.model_validate(
                {
                    **base,
                    "advisors": list(trial_advisors.values()),
                    "inputs": [*base["inputs"], *trial_inputs.values()],
                }
            )
        except ValidationError as exc:
            refused.append((key, f"context message {key!r} refused: {_problem(exc)}"))
            continue
        advisors, inputs = trial_advisors, trial_inputs
    merged = AgentSpec.model_validate(
        {**base, "advisors": list(advisors.values()), "inputs": [*base["inputs"], *inputs.values()]}
    )
    return merged, refused


async def load_context(bootstrap: str, topic: str) -> tuple[Messages, dict[int, int]]:
    """The latest message per key, and where each partition ended (to follow from)."""
    messages: Messages = {}
    ends: dict[int, int] = {}
    async for rec in read_topic(bootstrap, topic):
        if rec.key is not None:
            messages[rec.key.decode("utf-8", "replace")] = rec.value
        ends[rec.partition] = rec.offset + 1
    return messages, ends


class ContextFollower:
    """Follows the context topic after the initial load; calls back with each new spec."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        base: AgentSpec,
        messages: Messages,
        ends: dict[int, int],
        on_change: Callable[[AgentSpec, list[tuple[str, str]]], None],
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.base = base
        self.messages = dict(messages)
        self.ends = ends
        self.on_change = on_change
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="context-follower")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            **options_for(self.bootstrap),
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            tps = [
                TopicPartition(self.topic, p) for p in await partitions(self.bootstrap, self.topic)
            ]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, self.ends.get(tp.partition, 0))
            while True:
                batch = await consumer.getmany(timeout_ms=1000)
                changed = False
                for records in batch.values():
                    for rec in records:
                        if rec.key is not None:
                            self.messages[rec.key.decode("utf-8", "replace")] = rec.value
                            changed = True
                if changed:
                    spec, refused = apply_context(self.base, self.messages)
                    log.info(
                        "context changed: %d advisors, %d global inputs",
                        len(spec.advisors),
                        len(spec.inputs),
                    )
                    self.on_change(spec, refused)
        finally:
            await consumer.stop()
