"""Admission: a consumed record read into an item for a window, or its outcome known at
once (a dead letter, a forwarded copy, a turn committed before) handed back as a value
(`Settled`) for staging to write; a workflow's next turn likewise, one at a time. Its
place in an item's walk: docs/architecture.md, "The walk of one item". Nothing here
writes on a unit: what it decides, it returns.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from aiokafka import ConsumerRecord

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.errors import BadRecord
from instanced_stream.kafka.publish import forwarded_context
from instanced_stream.runtime.pipeline.forwarding import forward
from instanced_stream.runtime.pipeline.intake import CONTEXT_ON_INPUT, read_item, source_of
from instanced_stream.runtime.pipeline.outcomes.records import Planned, bad_record
from instanced_stream.runtime.pipeline.shared import Shared
from instanced_stream.runtime.pipeline.staged import Settled, Staged, bound_of, tokens_of
from instanced_stream.runtime.pipeline.workflows import recalled
from instanced_stream.runtime.units.unit import Slot, Unit

__all__ = ["Admission"]

log = logging.getLogger("stream.processor")


def _where(code: str, source: SourcePosition) -> dict[str, Any]:
    """A dead letter's fields for its JSON log line: the code and the record's position."""
    return {
        "code": code,
        "topic": source.topic,
        "partition": source.partition,
        "offset": source.offset,
    }


def _log_letter(exc: BadRecord, source: SourcePosition) -> None:
    log.warning(
        "dead letter %s at %s/%d/%d: %s",
        exc.code,
        source.topic,
        source.partition,
        source.offset,
        exc.message,
        extra=_where(exc.code, source),
    )


class Admission:
    """Reads consumed records and next turns into items for a window, or settles them."""

    def __init__(self, shared: Shared) -> None:
        self.settings = shared.settings
        self.live = shared.live  # the spec, read at each use
        self.metrics = shared.metrics
        self.builder = shared.builder
        self.size = shared.size
        self.tokenizer = shared.tokenizer
        self.queued_turns = shared.queued_turns
        self.flows = shared.flows

    async def fetched(
        self, unit: Unit, record: ConsumerRecord[bytes, bytes], slot: Slot
    ) -> Staged | Settled | None:
        """A fetched input record: `record`, read where it was consumed."""
        rec = record
        source = source_of(rec.topic, rec.partition, rec.offset, rec.key, rec.timestamp)
        return await self.record(unit, source, rec.key, rec.value, slot)

    async def record(
        self, unit: Unit, source: SourcePosition, key: bytes | None, value: bytes | None, slot: Slot
    ) -> Staged | Settled | None:
        """One consumed input record, tracked on `slot` of its unit: the item for a window,
        its outcome when it is known at once (`Settled`: a dead letter, a forwarded copy, a
        turn committed before), or None when its unit failed recalling its instance."""
        self.metrics.items_in.inc()
        try:
            instance, text = await read_item(  # plain JSON, or Avro / JSON Schema (registry)
                self.settings,
                value,
                key,
                source,
                state_input=self.live.spec.accept_state_input,
            )
            item = Staged(instance, unit, slot, text)
            room = self.size.item_tokens
            tokens = bound_of(self.tokenizer, item)
            if tokens > room and (tokens := tokens_of(self.tokenizer, item)) > room:
                raise BadRecord(
                    "too_large",
                    f"record is about {tokens} tokens; a request has room for {room} "
                    "(window.max_input_tokens less the instructions, tools and advisors)",
                )
        except BadRecord as exc:
            return self._refused(exc, unit, source, value, slot)
        if self.flows is not None:
            # One instance's state lives in one unit: an input read elsewhere goes on.
            origin = (source.topic, source.partition, source.offset)
            moved = forward(
                unit,
                slot,
                origin,
                instance.id,
                value,
                partitions=self.settings.partitions,
                headers=slot.headers,
            )
            if moved is not None:
                return moved
            if not await recalled(self.flows.stores, unit, instance.id):
                return None  # its unit failed: the partition is reopened and the input redone
            admitted, item.changes = self.flows.admit(instance)
            if admitted is None:  # its turn was committed before: nothing to redo
                skipped = Planned(records=item.changes)
                skipped.events["redelivered_skipped"] += 1
                return Settled(unit, slot, skipped)
            item.instance = admitted
        return item

    def _refused(
        self, exc: BadRecord, unit: Unit, source: SourcePosition, value: bytes | None, slot: Slot
    ) -> Settled:
        """A record that is no item: a context message forwarded to the context topic
        where the spec allows it, else its dead letter."""
        if exc.code == CONTEXT_ON_INPUT and self._forwards(exc):
            # Written in this unit's transaction with the offset: once, or not at all.
            origin = (source.topic, source.partition, source.offset)
            copy = forwarded_context(
                origin,
                self.settings.topics.context,
                str(exc.data["context_key"]),
                bytes(exc.data["json"]),
                slot.headers,
            )
            planned = Planned(records=[copy])
            planned.events["context_forwarded"] += 1
            return Settled(unit, slot, planned)
        _log_letter(exc, source)
        return Settled(unit, slot, self.builder.letter(bad_record(exc, source, value)))

    def _forwards(self, refused: BadRecord) -> bool:
        """Whether a context message read on the input topic goes on to the context topic:
        the spec allows it (accept_context_input) and it is one the context topic takes."""
        return self.live.spec.accept_context_input and bool(refused.data.get("forwardable"))

    def turn(self, unit: Unit, inst: Instance) -> Staged | None:
        """A workflow's next turn as an item for a window, or None while a turn of its
        instance is on its way (or its unit is gone)."""
        if not self.queued_turns.add(inst.id, unit):
            return None
        self.metrics.count({"turns": 1})
        text = orjson.dumps([inst.payload, inst.state, inst.plan])  # what its turn shows
        return Staged(inst, unit, None, text)
