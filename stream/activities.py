"""The Activity SDK: handlers for activity topics, `async def handler(call, tool, context)`.

- `call`: the full call, arguments and meta properties (`_instance` is the producer's id,
  `_outputPath` when the processor awaits a result);
- `tool`: the tool's own definition from the agent spec, so a handler can read its schema;
- `context`: the messages the call imported through its scopes, from its own instance only.

Delivery is at least once; the worker drops call_ids it has already handled in this
process, and handlers should be idempotent across restarts (key on `call_id`).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from pydantic import ValidationError

from stream.errors import SpecError
from stream.models import ActivityRecord, Call, DeadLetter
from stream.publish import OutRecord, Publisher
from stream.settings import Settings
from stream.spec import AgentSpec, Tool

__all__ = ["Activities", "Handler", "load_activities"]

log = logging.getLogger("stream.activities")

Handler = Callable[[Call, Tool, list[dict[str, Any]]], Awaitable[Any]]

_TRIES = 3
_SEEN = 100_000


class Activities:
    """A registry of handlers, one per tool name, plus the worker that runs them."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.handled = 0
        self.duplicates = 0
        self.failed = 0
        self._seen: OrderedDict[str, None] = OrderedDict()

    def activity(self, name: str | None = None) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.handlers[name or fn.__name__] = fn
            return fn

        return register

    def _first_time(self, call_id: str) -> bool:
        if call_id in self._seen:
            self.duplicates += 1
            return False
        self._seen[call_id] = None
        if len(self._seen) > _SEEN:
            self._seen.popitem(last=False)
        return True

    async def handle(self, record: ActivityRecord, tool: Tool) -> None:
        """Runs the handler for one record, retrying; raises after the last try."""
        handler = self.handlers[record.tool]
        for attempt in range(1, _TRIES + 1):
            try:
                await handler(record.call, tool, record.context)
                self.handled += 1
                return
            except Exception:
                if attempt == _TRIES:
                    raise
                log.warning(
                    "activity %s failed on %s (try %d)",
                    record.tool,
                    record.call_id,
                    attempt,
                    exc_info=True,
                )
                await asyncio.sleep(0.2 * attempt)

    async def run(
        self,
        settings: Settings,
        spec: AgentSpec,
        bootstrap: str,
        stop: asyncio.Event | None = None,
        group: str | None = None,
    ) -> None:
        """Consumes the activity topics of the registered tools until `stop` is set."""
        tools = {t.name: t for t in spec.tools if t.name in self.handlers}
        unknown = set(self.handlers) - set(tools)
        if unknown:
            raise SpecError(f"handlers for tools the spec does not declare: {sorted(unknown)}")
        topics = {t.topic or settings.topics.activity(t.name): t for t in tools.values()}
        consumer = AIOKafkaConsumer(
            *topics,
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            group_id=group or f"{settings.topic_prefix}activities.{spec.name}",
        )
        publisher = Publisher(bootstrap, client_id="stream-activities")
        await consumer.start()
        await publisher.start()
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=300)
                for tp, records in batch.items():
                    for rec in records:
                        await self._one(rec.value, topics[tp.topic], settings, publisher)
                if batch:
                    await consumer.commit()
        finally:
            await consumer.stop()
            await publisher.stop()

    async def _one(
        self, value: bytes | None, tool: Tool, settings: Settings, publisher: Publisher
    ) -> None:
        try:
            record = ActivityRecord.model_validate_json(value or b"")
        except ValidationError as exc:
            log.error("not an activity record on %s: %s", tool.name, exc.errors()[:1])
            return
        if not self._first_time(record.call_id):
            return
        try:
            await self.handle(record, tool)
        except Exception as exc:
            self.failed += 1
            log.exception("activity %s gave up on %s", record.tool, record.call_id)
            letter = DeadLetter(
                code="activity_failed",
                reason=f"handler raised {exc!r}",
                scope="call",
                instance=record.instance,
                source=record.source,
                call=record.call.wire(),
                attempts=_TRIES,
            )
            await publisher.publish(
                [
                    OutRecord(
                        settings.topics.dead_letter,
                        record.instance.encode(),
                        orjson.dumps(letter.model_dump(mode="json", exclude_none=True)),
                    )
                ]
            )


def load_activities(target: str) -> Activities:
    """Finds the Activities registry in a module name or a .py file path."""
    if target.endswith(".py") or Path(target).is_file():
        path = Path(target).resolve()
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise SpecError(f"cannot import activities from {target}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    found = [v for v in vars(module).values() if isinstance(v, Activities)]
    if len(found) != 1:
        raise SpecError(f"{target} must define exactly one Activities registry, found {len(found)}")
    return found[0]
