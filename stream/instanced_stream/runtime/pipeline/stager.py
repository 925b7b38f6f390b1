"""The stager: consumed records in, cross-partition windows out, each solved batch staged
onto the units of its items' partitions (docs/architecture.md, exactly once).

Batches still span every partition this process owns (fewer, fuller LLM requests); what
binds an item to exactly-once delivery is its slot on its partition's unit. Once a batch
is solved, each item's records go onto its own slot and the slot is finished; the unit
commits its finished, contiguous prefix in one transaction. An item whose unit was
dropped meanwhile (revoked, fenced, failed) stages nothing: its partition's next owner
redoes it, from the last commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import orjson

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.model import Model
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.solve import Outcome, Solver
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.tokenizer import Tokenizer
from instanced_stream.core.validate import Validator
from instanced_stream.errors import BadRecord
from instanced_stream.faultpoints import Probe
from instanced_stream.kafka.publish import forwarded, home_partition
from instanced_stream.kafka.schemas import output_frames
from instanced_stream.llm.limiter import Limiter
from instanced_stream.observe.metrics import Metrics
from instanced_stream.observe.telemetry import batch_span, context_of
from instanced_stream.retry import RetryPolicy
from instanced_stream.runtime.pipeline.outcomes.records import (
    Planned,
    RecordBuilder,
    bad_record,
)
from instanced_stream.runtime.pipeline.staged import Staged
from instanced_stream.runtime.pipeline.staging import Staging
from instanced_stream.runtime.pipeline.tier import ONLINE, Tier
from instanced_stream.runtime.pipeline.windows.intake import read_item
from instanced_stream.runtime.pipeline.windows.spend import Spend
from instanced_stream.runtime.pipeline.windows.twins import Twins
from instanced_stream.runtime.pipeline.windows.window_size import WindowSize
from instanced_stream.runtime.pipeline.windows.windowing import Windower
from instanced_stream.runtime.pipeline.workflows import Flows, recalled
from instanced_stream.runtime.quality.control import QualityControl
from instanced_stream.runtime.units.unit import Slot, Unit
from instanced_stream.settings import Settings

__all__ = [
    "BATCH_TRIES",
    "QueuedTurns",
    "Stager",
    "make_solver",
    "orphaned",
    "retried",
]

log = logging.getLogger("stream.processor")

BATCH_TRIES = 3
_BACKOFF = RetryPolicy(base_s=0.5, cap_s=5.0)  # a batch's step that raised
_T = TypeVar("_T")


def make_solver(llm: Model, spec: AgentSpec, settings: Settings) -> Solver:
    return Solver(
        llm, PromptBuilder(spec), Validator(spec), settings.max_attempts, spec.advice.max_consults
    )


async def retried(batch_id: str, what: str, step: Callable[[], Awaitable[_T]]) -> _T | Exception:
    """Runs `step` up to BATCH_TRIES times; its result, or the last error. A bug must cost
    a retry, never an item: the caller dead-letters with the error."""
    error: Exception = RuntimeError(f"{what} was not tried")
    for attempt in range(1, BATCH_TRIES + 1):
        try:
            return await step()
        except Exception as exc:
            log.exception(
                "batch %s: %s failed (try %d of %d)",
                batch_id,
                what,
                attempt,
                BATCH_TRIES,
                extra={"batch_id": batch_id},
            )
            error = exc
            await asyncio.sleep(_BACKOFF.delay(attempt))
    return error


def orphaned(tasks: Mapping[asyncio.Task[None], list[Staged]]) -> list[asyncio.Task[None]]:
    """The batches in flight none of whose items' units is alive any more (their
    partitions closed here): nothing they answer could be staged, so they are cancelled
    and their limiter slots freed, instead of waiting for the model."""
    return [task for task, items in tasks.items() if not any(i.unit.alive for i in items)]


class QueuedTurns:
    """Instances whose next turn is on its way, each with the unit it was offered on. A
    turn offered on a unit dropped since (revoked, failed) holds nothing back: the
    partition's next unit here offers it again (it used to wait for a turn never run)."""

    def __init__(self) -> None:
        self.by_instance: dict[str, Unit] = {}

    def add(self, instance: str, unit: Unit) -> bool:
        """Whether the turn is to be offered now: its unit is alive, and no turn of the
        instance is on its way on a unit that is."""
        queued = self.by_instance.get(instance)
        if not unit.alive or (queued is not None and queued.alive):
            return False
        self.by_instance[instance] = unit
        return True

    def done(self, items: Iterable[Staged]) -> None:
        """These items' turns are no longer on their way."""
        for item in items:
            if self.by_instance.get(item.instance.id) is item.unit:
                del self.by_instance[item.instance.id]


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
        self._queued_turns = QueuedTurns()
        self.llm = llm
        self.solver = make_solver(llm, spec, settings)
        self.limiter = limiter
        self.metrics = metrics
        self.builder = builder
        self.staging = Staging(settings, metrics=metrics, builder=builder, tier=tier, flows=flows)
        builder.frames = output_frames(settings, spec)  # refuses a breaking output schema
        self.probe = probe
        self.worker = worker
        self.tokenizer = Tokenizer(spec.model.name)
        # The one author of the window's size: spec, limiter, output budget, quality.
        self.size = WindowSize(spec, self.tokenizer, self.solver.prompt.system, limiter)
        self.windower: Windower[Staged] = Windower(
            size=self.size,
            max_wait_s=spec.window.max_wait_ms / 1000,
            on_close=self.launch,
            tokens_of=functools.partial(_tokens_of, self.tokenizer),
            bound_of=functools.partial(_bound_of, self.tokenizer),
            free=lambda item: self.twins.free(item.instance),
        )
        # quality.*: the shadow sample (its controller moves the size), second opinions.
        self.quality = QualityControl(spec, llm, metrics, settings.max_attempts, self.size, second)
        self.twins = Twins(spec, self.solver.prompt.system)  # dedupe: twins asked once
        self.spend = Spend(spec.budget, metrics)  # budget: paced to the spend ceiling
        self.batches = 0
        self.tasks: dict[asyncio.Task[None], list[Staged]] = {}  # batches in flight
        self.draining = False

    def reconfigure(self, spec: AgentSpec) -> None:
        """A new spec (from the context topic) for the batches, their records and the
        workflows; batches in flight finish as asked."""
        solver = make_solver(self.llm, spec, self.settings)
        self.size.reconfigure(spec, solver.prompt.system)
        self.solver = solver
        self.quality.reconfigure(spec)
        self.twins.reconfigure(spec, solver.prompt.system)
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
        pending = set(self.tasks)
        if pending:
            log.info("draining: %d batches in flight, up to %.0fs", len(pending), deadline_s)
            _, pending = await asyncio.wait(pending, timeout=max(0.0, end - time.monotonic()))
        return len(pending)

    async def stop(self) -> None:
        await self.quality.stop()
        await self.windower.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

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
        await self.tier.offer(item, self)

    async def offer_turn(self, unit: Unit, inst: Instance) -> None:
        """A workflow's next turn joins the window like any item."""
        if not self._queued_turns.add(inst.id, unit):
            return
        self.metrics.count({"turns": 1})
        text = orjson.dumps([inst.payload, inst.state, inst.plan])  # what its turn shows
        await self.tier.offer(Staged(inst, unit, None, text), self)

    async def add(self, item: Staged) -> None:
        await self.windower.add(item)

    async def launch(self, items: list[Staged], reason: str) -> None:
        self.twins.closed()
        await self.limiter.acquire()
        await self.spend.wait()  # held here, the windower and the intake hold too
        self.batches += 1
        batch_id = f"{self.worker}-{self.batches}"
        self.metrics.observe_batch(len(items), reason)
        self.metrics.batch_started()
        task = asyncio.create_task(self._run(batch_id, items), name=batch_id)
        self.tasks[task] = items
        task.add_done_callback(lambda done: self.tasks.pop(done, None))

    async def _run(self, batch_id: str, items: list[Staged]) -> None:
        try:
            live = [i for i in items if i.unit.alive]
            if not live:
                return  # every item's partition moved on: its new owner redoes them
            with batch_span(batch_id, [context_of(i.slot.headers) for i in live if i.slot]):
                planned = await self._solved(batch_id, live)
            try:
                self.staging.stage(batch_id, live, planned)
            except Exception as exc:  # a bug: the units redo their prefix, nothing is lost
                log.exception("batch %s: staging failed", batch_id)
                for item in live:
                    item.unit.fail(exc)
        finally:
            self._queued_turns.done(items)  # staged, or never to be (its unit dropped)
            self.limiter.release()
            self.metrics.batch_ended()
            self.spend.ended()

    async def _solved(self, batch_id: str, items: list[Staged]) -> Planned:
        """The batch's records; an unexpected error retries it, then dead-letters its
        items with the error, so nothing is committed without an outcome."""
        instances = [i.instance for i in items]

        async def solve() -> Planned:
            # Each content asked once: twins and cached answers are not asked again.
            outcome = await self.twins.answered(instances, self._ask)
            self.probe.at("solved")
            if self.flows is not None:
                outcome = await self._read_back(items, outcome)
            self.metrics.observe_tokens(
                outcome.prompt_tokens,
                outcome.completion_tokens,
                outcome.cached_tokens,
                len({id(a.instance) for a in outcome.answers}),
            )
            flow = self.flows.rehearsal() if self.flows is not None else None
            planned = self.builder.batch(batch_id, outcome, flow)
            self.probe.at("after_llm")  # the batch's records built, none staged yet
            return planned

        planned = await retried(batch_id, "solving", solve)
        if isinstance(planned, Exception):
            return self.builder.internal_errors(batch_id, instances, planned, BATCH_TRIES)
        return planned

    async def _read_back(self, items: list[Staged], outcome: Outcome) -> Outcome:
        """The states the answer's turns are played on, read back where a workflow
        finished while the batch was asked (a unit reopened offered its turn again, and
        that batch ended it first): every item's instance, just before the rehearsal,
        with nothing awaited between. An item whose unit is gone, or failed reading back,
        is left out of the outcome (its partition's owner redoes it); the others go on."""
        assert self.flows is not None
        gone: set[str] = set()
        for item in items:
            if not await recalled(self.flows.stores, item.unit, item.instance.id):
                gone.add(item.instance.id)
        gone |= {i.instance.id for i in items if not i.unit.alive}
        return _without(outcome, gone) if gone else outcome

    async def _ask(self, instances: list[Instance]) -> Outcome:
        outcome = await self.solver.solve(instances)
        self.size.learn(outcome, len(instances))
        await self.quality.after(outcome)
        return outcome


def _without(outcome: Outcome, gone: set[str]) -> Outcome:
    """`outcome` less everything about the instances `gone` (their units redo them)."""
    return dataclasses.replace(
        outcome,
        answers=[a for a in outcome.answers if a.instance.id not in gone],
        unanswered=[u for u in outcome.unanswered if u.instance.id not in gone],
        refusals=[r for r in outcome.refusals if r[1] is None or r[1].id not in gone],
    )
