"""Admission: a consumed record read into an item for a window, or its outcome settled
at once (a dead letter, a forwarded copy, a turn committed before); a workflow's next
turn likewise, one at a time.

The first stage of one item's walk, in runtime/pipeline/:

- `Admission.record` reads the record (`read_item`, windows/intake.py), refuses one too
  large for a request, forwards a context message to the context topic where the spec
  allows (`accept_context_input`) and a stateful input to its home partition, recalls
  and admits its instance (`Flows.admit`, workflows.py); it returns the `Staged` item, a
  plain value, or None when the slot is settled already. `Admission.turn` does the same
  for a workflow's next turn (`QueuedTurns`, queued_turns.py);
- the stager (stager.py) hands the item to the tier (`Tier.offer`, tier.py) with the
  windower (`Windower.add`, windows/windowing.py); a closed window goes to
  `Dispatch.launch` (dispatch.py), the solved batch to `Staging.stage` (staging.py).

Nothing here calls the stager back: it returns the item. A bad record's dead letter is
counted by staging (`Staging.count`), the one counter of what records mean.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.tokenizer import Tokenizer
from instanced_stream.errors import BadRecord
from instanced_stream.kafka.publish import forwarded, forwarded_context, home_partition
from instanced_stream.observe.metrics import Metrics
from instanced_stream.runtime.pipeline.outcomes.records import RecordBuilder, bad_record
from instanced_stream.runtime.pipeline.queued_turns import QueuedTurns
from instanced_stream.runtime.pipeline.staged import Staged, bound_of, tokens_of
from instanced_stream.runtime.pipeline.staging import Staging
from instanced_stream.runtime.pipeline.windows.intake import CONTEXT_ON_INPUT, read_item
from instanced_stream.runtime.pipeline.windows.window_size import WindowSize
from instanced_stream.runtime.pipeline.workflows import Flows, recalled
from instanced_stream.runtime.units.unit import Slot, Unit
from instanced_stream.settings import Settings

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

    def __init__(
        self,
        settings: Settings,
        live: LiveSpec,
        *,
        metrics: Metrics,
        builder: RecordBuilder,
        staging: Staging,
        size: WindowSize,
        tokenizer: Tokenizer,
        queued_turns: QueuedTurns,
        flows: Flows | None,
    ) -> None:
        self.settings = settings
        self.live = live  # the spec, read at each use
        self.metrics = metrics
        self.builder = builder
        self.staging = staging
        self.size = size
        self.tokenizer = tokenizer
        self.queued_turns = queued_turns
        self.flows = flows

    async def record(
        self, unit: Unit, source: SourcePosition, key: bytes | None, value: bytes | None, slot: Slot
    ) -> Staged | None:
        """One consumed input record, tracked on `slot` of its unit: the item for a window,
        or None when its slot is already finished (a dead letter, a forwarded copy, a
        turn committed before) or its unit failed recalling its instance."""
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
            if exc.code == CONTEXT_ON_INPUT and self._forwards(exc):
                # Written in this unit's transaction with the offset: once, or not at all.
                self.metrics.count({"context_forwarded": 1})
                origin = (source.topic, source.partition, source.offset)
                copy = forwarded_context(
                    origin,
                    self.settings.topics.context,
                    str(exc.data["context_key"]),
                    bytes(exc.data["json"]),
                    slot.headers,
                )
                unit.finish(slot, [copy])
                return None
            _log_letter(exc, source)
            letter = self.builder.letter(bad_record(exc, source, value))
            self.staging.count(letter)
            unit.finish(slot, letter.records)
            return None
        if self.flows is not None:
            home = home_partition(instance.id, self.settings.partitions)
            if home != source.partition:
                # One instance's state lives in one unit: its input is forwarded, in this
                # unit's transaction with the offset, to the partition its id keys to.
                self.metrics.count({"forwarded": 1})
                origin = (source.topic, source.partition, source.offset)
                copy = forwarded(origin, instance.id, value or b"", home, slot.headers)
                unit.finish(slot, [copy])
                return None
            if not await recalled(self.flows.stores, unit, instance.id):
                return None  # its unit failed: the partition is reopened and the input redone
            admitted, item.changes = self.flows.admit(instance)
            if admitted is None:  # its turn was committed before: nothing to redo
                self.metrics.count({"redelivered_skipped": 1})
                unit.finish(slot, item.changes)
                return None
            item.instance = admitted
        return item

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
