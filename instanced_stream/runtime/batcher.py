"""The batcher: records in, windows out, one task per batch, published in batch order.

Flow per record: track its offset -> parse (a bad record: dead letter) -> window ->
batch task (a bounded number in flight) -> solve -> wait until the previous batch has
handed its records to the producer -> deliver (instanced_stream/runtime/delivery.py). Sending in
batch order keeps each instance's outputs in its input order (the producer keeps the
order of sends per partition) while the acknowledgements of several batches are awaited
side by side; the ledger acks each partition's offsets in offset order, so commits never
pass unfinished work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.model import Model
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.solve import Solver
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.tokenizer import Tokenizer
from instanced_stream.core.validate import Validator
from instanced_stream.errors import BadRecord
from instanced_stream.llm.limiter import Limiter
from instanced_stream.ops.metrics import Metrics
from instanced_stream.runtime.budget import Budget
from instanced_stream.runtime.coordinator import Coordinator
from instanced_stream.runtime.delivery import BATCH_TRIES, Delivery, retried
from instanced_stream.runtime.intake import parse_item
from instanced_stream.runtime.offsets import Entry, OffsetLedger
from instanced_stream.runtime.probe import Probe
from instanced_stream.runtime.publish import Order
from instanced_stream.runtime.records import Planned, RecordBuilder, bad_record
from instanced_stream.runtime.windowing import Windower
from instanced_stream.settings import Settings

__all__ = ["Batcher", "Item"]

log = logging.getLogger("stream.processor")


@dataclass(slots=True, eq=False)
class Item:
    """An instance in a window: a delivered record (with its ledger entry), or a next
    turn of a workflow (no entry: its input was finished with its first turn). Its
    prompt tokens are counted from `text` only when a window needs them exactly."""

    instance: Instance
    entry: Entry | None
    text: bytes
    tokens: int | None = None


def make_solver(llm: Model, spec: AgentSpec, settings: Settings) -> Solver:
    return Solver(
        llm, PromptBuilder(spec), Validator(spec), settings.max_attempts, spec.advice.max_consults
    )


class Batcher:
    def __init__(
        self,
        settings: Settings,
        spec: AgentSpec,
        llm: Model,
        *,
        ledger: OffsetLedger,
        limiter: Limiter,
        metrics: Metrics,
        builder: RecordBuilder,
        delivery: Delivery,
        coordinator: Coordinator,
        probe: Probe,
        worker: str,
    ) -> None:
        self.settings = settings
        self.llm = llm
        self.solver = make_solver(llm, spec, settings)
        self.ledger = ledger
        self.limiter = limiter
        self.metrics = metrics
        self.builder = builder
        self.delivery = delivery
        self.coordinator = coordinator
        self.probe = probe
        self.worker = worker
        self.tokenizer = Tokenizer(spec.model.name)
        self.budget = Budget(spec, self.tokenizer, self.solver.prompt.system, limiter)
        self.windower: Windower[Item] = Windower(
            max_items=spec.window.max_items,
            max_wait_s=spec.window.max_wait_ms / 1000,
            max_tokens=self.budget.item_tokens,
            on_close=self._launch,
            tokens_of=self._tokens_of,
            capacity=self.budget.capacity,
            bound_of=self._bound_of,
        )
        self.batches = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self._last: Order | None = None  # the latest batch's place among the publishes
        self._queued_turns: set[str] = set()  # instances whose next turn is on its way
        self._draining = asyncio.Event()  # set on shutdown: take no more records

    def reconfigure(self, spec: AgentSpec) -> None:
        """A new spec; batches in flight finish as they were asked."""
        solver = make_solver(self.llm, spec, self.settings)
        self.budget.reconfigure(spec, solver.prompt.system)
        self.solver = solver
        self.windower.max_tokens = self.budget.item_tokens

    def start(self) -> None:
        self.windower.start()

    async def drain(self, deadline_s: float) -> int:
        """Stops taking records, launches the open window, and gives the batches in
        flight `deadline_s` to be delivered; returns how many did not make it."""
        self._draining.set()
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        with contextlib.suppress(TimeoutError):  # launching the window waits for a slot
            await asyncio.wait_for(self.windower.flush("drain"), deadline_s)
        pending = set(self.tasks)
        if pending:
            log.info("draining: %d batches in flight, up to %.0fs", len(pending), deadline_s)
            _, pending = await asyncio.wait(pending, timeout=max(0.0, end - loop.time()))
        return len(pending)

    async def stop(self) -> None:
        await self.windower.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def offer(
        self,
        value: bytes | None,
        key: bytes | None,
        source: SourcePosition,
        ack: Callable[[], object],
    ) -> None:
        """Takes one delivered record. Awaits while all batch slots are busy."""
        if self._draining.is_set():
            await asyncio.Event().wait()  # shutting down: left to the next owner
        entry = self.ledger.track((source.topic, source.partition), source.offset, ack)
        self.metrics.items_in.inc()
        try:
            instance = parse_item(
                value,
                key,
                source,
                self.settings.max_record_bytes,
                state_input=self.builder.spec.accept_state_input,  # follows reconfigure
            )
            assert value is not None  # parse_item refuses a missing value
            item = Item(instance, entry, value)
            room = self.budget.item_tokens
            if self._bound_of(item) > room and (tokens := self._tokens_of(item)) > room:
                raise BadRecord(
                    "too_large",
                    f"record is about {tokens} tokens; a request has room for "
                    f"{self.budget.item_tokens} (window.max_input_tokens less the "
                    "instructions, tools and advisors)",
                )
        except BadRecord as exc:
            log.warning(
                "dead letter %s at %s/%d/%d: %s",
                exc.code,
                source.topic,
                source.partition,
                source.offset,
                exc.message,
                extra={
                    "code": exc.code,
                    "topic": source.topic,
                    "partition": source.partition,
                    "offset": source.offset,
                },
            )
            await self.delivery.publish(self.builder.letter(bad_record(exc, source, value)))
            self.ledger.finish(entry)
            return
        admitted = self.coordinator.admit(instance)
        if admitted is None:  # redelivered; its turn was applied and its records kept
            self.metrics.count({"redelivered_skipped": 1})
            await self.coordinator.flush()
            self.ledger.finish(entry)
            return
        item.instance = admitted
        await self.windower.add(item)

    async def enqueue_turn(self, inst: Instance) -> None:
        """An instance ready for its next turn joins the window like any item."""
        if inst.id in self._queued_turns:
            return
        self._queued_turns.add(inst.id)
        self.metrics.count({"turns": 1})
        await self.windower.add(Item(inst, None, orjson.dumps([inst.payload, inst.state])))

    def _tokens_of(self, item: Item) -> int:
        if item.tokens is None:
            item.tokens = self.tokenizer.count(item.text.decode("utf-8", "replace"))
        return item.tokens

    def _bound_of(self, item: Item) -> int:
        return self.tokenizer.bound(len(item.text)) if item.tokens is None else item.tokens

    async def _launch(self, items: list[Item], reason: str) -> None:
        await self.limiter.acquire()
        self.batches += 1
        batch_id = f"{self.worker}-{self.batches}"
        order = self._last = Order(self._last)
        self.metrics.observe_batch(len(items), reason)
        self.metrics.batch_started()
        task = asyncio.create_task(self._run(batch_id, items, order), name=batch_id)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(
        self,
        batch_id: str,
        items: list[Item],
        order: Order,
    ) -> None:
        instances = [item.instance for item in items]
        failed = False
        try:
            planned = await self._solved(batch_id, instances)
            # Publish in batch order so each instance's outputs keep its input order
            # (instanced_stream/runtime/publish.py, Order).
            order.keys = {r.key for r in planned.records if r.key is not None}
            await order.turn()
            await self.delivery.deliver(
                batch_id,
                instances,
                [item.entry for item in items],
                planned,
                self.coordinator,
                order,
            )
            for inst in instances:
                self._queued_turns.discard(inst.id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every fallback failed: never let a batch end unseen
            # The ordering gate stays closed: a later batch must not publish before this
            # one, which the group redoes after the worker stops.
            failed = True
            await self.delivery.fatal(batch_id, exc)
        finally:
            if not failed:
                order.finish()
            self.limiter.release()
            self.metrics.batch_ended()

    async def _solved(self, batch_id: str, instances: list[Instance]) -> Planned:
        """Solves the batch into its records; an unexpected error retries it, then
        dead-letters its items with the error, so nothing is acked without an outcome."""

        async def solve() -> Planned:
            outcome = await self.solver.solve(instances)
            self.probe.at("solved")  # every answer in hand, no record built yet
            self.budget.learn(outcome, len(instances))
            self.metrics.observe_tokens(
                outcome.prompt_tokens,
                outcome.completion_tokens,
                outcome.cached_tokens,
                len({id(a.instance) for a in outcome.answers}),
                outcome.reasoning_tokens,
            )
            return self.builder.batch(batch_id, outcome, self.coordinator.rehearsal())

        planned = await retried(batch_id, "solving", solve)
        if isinstance(planned, Exception):
            return self.builder.internal_errors(batch_id, instances, planned, BATCH_TRIES)
        return planned
