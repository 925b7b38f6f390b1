"""The stager: consumed records read and admitted into cross-partition windows; it builds
the window, dispatch (dispatch.py) and staging (staging.py) and connects them
(docs/architecture.md, exactly once).

One item's walk, in runtime/pipeline/:

- `Stager.offer` reads the record (`read_item`, windows/intake.py) into a `Staged` item,
  dead-letters a bad or too large one, forwards a stateful input to its home partition,
  recalls and admits its instance (`Flows.admit`, workflows.py); `Stager.offer_turn` does
  the same for a workflow's next turn (one at a time: `QueuedTurns`, queued_turns.py);
- the item goes to the tier (`Tier.offer`, tier.py) with the windower, which adds it to
  the open window (`Windower.add`, windows/windowing.py);
- a closed window goes to `Dispatch.launch` (the windower's `on_close`): solved, retried,
  read back, built into records (`Planned`);
- the solved batch goes forward to `Staging.stage` (staging.py): each item's records onto
  its own slot.

Batches still span every partition this process owns (fewer, fuller LLM requests); what
binds an item to exactly-once delivery is its slot on its partition's unit. The unit
commits its finished, contiguous prefix in one transaction. An item whose unit was
dropped meanwhile (revoked, fenced, failed) stages nothing: its partition's next owner
redoes it, from the last commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any

import orjson

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.model import Model
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.tokenizer import Tokenizer
from instanced_stream.errors import BadRecord
from instanced_stream.faultpoints import Probe
from instanced_stream.kafka.publish import forwarded, home_partition
from instanced_stream.kafka.schemas import output_frames
from instanced_stream.llm.limiter import Limiter
from instanced_stream.observe.metrics import Metrics
from instanced_stream.runtime.pipeline.dispatch import Dispatch, make_solver
from instanced_stream.runtime.pipeline.outcomes.records import (
    RecordBuilder,
    bad_record,
)
from instanced_stream.runtime.pipeline.queued_turns import QueuedTurns
from instanced_stream.runtime.pipeline.staged import Staged
from instanced_stream.runtime.pipeline.staging import Staging
from instanced_stream.runtime.pipeline.tier import ONLINE, Tier
from instanced_stream.runtime.pipeline.windows.intake import read_item
from instanced_stream.runtime.pipeline.windows.window_size import WindowSize
from instanced_stream.runtime.pipeline.windows.windowing import Windower
from instanced_stream.runtime.pipeline.workflows import Flows, recalled
from instanced_stream.runtime.units.unit import Slot, Unit
from instanced_stream.settings import Settings

__all__ = ["Stager"]

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


def _tokens_of(tokenizer: Tokenizer, item: Staged) -> int:
    if item.tokens is None:
        item.tokens = tokenizer.count(item.text.decode("utf-8", "replace"))
    return item.tokens


def _bound_of(tokenizer: Tokenizer, item: Staged) -> int:
    """A cheap upper bound of the item's tokens, or its count once known."""
    return tokenizer.bound(len(item.text)) if item.tokens is None else item.tokens


class Stager:
    def __init__(
        self,
        settings: Settings,
        spec: AgentSpec,
        llm: Model,
        *,
        limiter: Limiter,
        metrics: Metrics,
        builder: RecordBuilder,
        probe: Probe,
        worker: str,
        flows: Flows | None = None,
        second: Model | None = None,  # model.escalate's client
        tier: Tier = ONLINE,
    ) -> None:
        self.settings = settings
        self.tier = tier
        self.flows = flows
        self.llm = llm
        self.metrics = metrics
        self.builder = builder
        builder.frames = output_frames(settings, spec)  # refuses a breaking output schema
        self.queued_turns = QueuedTurns()
        self.tokenizer = Tokenizer(spec.model.name)
        solver = make_solver(llm, spec, settings)
        # The one author of the window's size: spec, limiter, output budget, quality.
        self.size = WindowSize(spec, self.tokenizer, solver.prompt.system, limiter)
        self.staging = Staging(settings, metrics=metrics, builder=builder, tier=tier, flows=flows)
        self.dispatch = Dispatch(
            settings,
            spec,
            llm,
            size=self.size,
            solver=solver,
            limiter=limiter,
            metrics=metrics,
            builder=builder,
            probe=probe,
            worker=worker,
            staging=self.staging,
            queued_turns=self.queued_turns,
            flows=flows,
            second=second,
        )
        self.windower: Windower[Staged] = Windower(
            size=self.size,
            max_wait_s=spec.window.max_wait_ms / 1000,
            on_close=self.dispatch.launch,
            tokens_of=functools.partial(_tokens_of, self.tokenizer),
            bound_of=functools.partial(_bound_of, self.tokenizer),
            free=lambda item: self.dispatch.twins.free(item.instance),
        )
        self.draining = False

    def reconfigure(self, spec: AgentSpec) -> None:
        """A new spec (from the context topic) for the batches, their records and the
        workflows; batches in flight finish as asked."""
        solver = make_solver(self.llm, spec, self.settings)
        self.size.reconfigure(spec, solver.prompt.system)
        self.dispatch.reconfigure(spec, solver)
        self.builder.spec = spec
        if self.flows is not None:  # a finish advisor from the context is heard too
            self.flows.workflow.spec = spec

    def start(self) -> None:
        self.windower.start()

    async def drain(self, deadline_s: float) -> int:
        """Launches the open window, gives batches `deadline_s`; returns how many missed."""
        self.draining = True
        end = time.monotonic() + deadline_s
        with contextlib.suppress(TimeoutError):  # launching the window waits for a slot
            await asyncio.wait_for(self.windower.flush("drain"), deadline_s)
        pending = set(self.dispatch.tasks)
        if pending:
            log.info("draining: %d batches in flight, up to %.0fs", len(pending), deadline_s)
            _, pending = await asyncio.wait(pending, timeout=max(0.0, end - time.monotonic()))
        return len(pending)

    async def stop(self) -> None:
        await self.windower.stop()
        await self.dispatch.stop()

    async def offer(
        self, unit: Unit, source: SourcePosition, key: bytes | None, value: bytes | None, slot: Slot
    ) -> None:
        """One consumed input record, tracked on `slot` of its unit. Awaits while every
        batch slot is busy (the caller pauses fetching meanwhile)."""
        self.metrics.items_in.inc()
        try:
            instance, text = await read_item(  # plain JSON, or Avro / JSON Schema (registry)
                self.settings,
                value,
                key,
                source,
                state_input=self.builder.spec.accept_state_input,  # follows reconfigure
            )
            item = Staged(instance, unit, slot, text)
            room = self.size.item_tokens
            tokens = _bound_of(self.tokenizer, item)
            if tokens > room and (tokens := _tokens_of(self.tokenizer, item)) > room:
                raise BadRecord(
                    "too_large",
                    f"record is about {tokens} tokens; a request has room for {room} "
                    "(window.max_input_tokens less the instructions, tools and advisors)",
                )
        except BadRecord as exc:
            _log_letter(exc, source)
            letter = self.builder.letter(bad_record(exc, source, value))
            self.staging.count(letter)
            unit.finish(slot, letter.records)
            return
        if self.flows is not None:
            home = home_partition(instance.id, self.settings.partitions)
            if home != source.partition:
                # One instance's state lives in one unit: its input is forwarded, in this
                # unit's transaction with the offset, to the partition its id keys to.
                self.metrics.count({"forwarded": 1})
                origin = (source.topic, source.partition, source.offset)
                copy = forwarded(origin, instance.id, value or b"", home, slot.headers)
                unit.finish(slot, [copy])
                return
            if not await recalled(self.flows.stores, unit, instance.id):
                return  # its unit failed: the partition is reopened and the input redone
            admitted, item.changes = self.flows.admit(instance)
            if admitted is None:  # its turn was committed before: nothing to redo
                self.metrics.count({"redelivered_skipped": 1})
                unit.finish(slot, item.changes)
                return
            item.instance = admitted
        await self.tier.offer(item, self.windower)

    async def offer_turn(self, unit: Unit, inst: Instance) -> None:
        """A workflow's next turn joins the window like any item."""
        if not self.queued_turns.add(inst.id, unit):
            return
        self.metrics.count({"turns": 1})
        text = orjson.dumps([inst.payload, inst.state, inst.plan])  # what its turn shows
        await self.tier.offer(Staged(inst, unit, None, text), self.windower)
