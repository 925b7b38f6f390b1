"""Dispatch: a closed window launched as one batch, solved (twins asked once, quality,
the window's size learned), retried, and handed on as records to stage.

Its place in an item's walk: docs/architecture.md, "The walk of one item". Inside it, a
batch runs as a task (`Dispatch._run`): `Dispatch._solved` asks each content once
(`Dispatch._once`, with the plain values of `Twins.split`, windows/twins.py), the solver
through `Dispatch._ask` (the quality sample and the window's size learn from each answer
there), reads workflow states back (`Dispatch._read_back`) and builds the batch's
records, making its turns on a transaction of the stores (`Flows.change`); the solved
batch (`Solved`, a plain value) goes forward to staging. Nothing is awaited between
building a batch and staging it: the states its turns read are still the stores' when
staging stores them.

A batch's step that raises is retried (`retried`) and then dead-letters its items with
the error: a bug costs a retry, never an item. A batch none of whose units is held any
more is `orphaned`: the service cancels it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import Edition
from instanced_stream.core.model import Model
from instanced_stream.core.solve import Answer, Outcome
from instanced_stream.core.workflow import Workflow
from instanced_stream.faultpoints import Probe
from instanced_stream.llm.limiter import Limiter
from instanced_stream.observe.telemetry import batch_span, context_of
from instanced_stream.retry import RetryPolicy
from instanced_stream.runtime.pipeline.journal import AnswerJournal
from instanced_stream.runtime.pipeline.shared import Shared
from instanced_stream.runtime.pipeline.solved import Solved
from instanced_stream.runtime.pipeline.staged import Staged
from instanced_stream.runtime.pipeline.staging import Staging
from instanced_stream.runtime.pipeline.windows.spend import Spend
from instanced_stream.runtime.pipeline.windows.twins import Twins, merge
from instanced_stream.runtime.pipeline.workflows import recalled
from instanced_stream.runtime.quality.control import QualityControl
from instanced_stream.runtime.state.transaction import Transaction

__all__ = ["BATCH_TRIES", "Dispatch", "orphaned", "retried"]

log = logging.getLogger("stream.processor")

BATCH_TRIES = 3
_BACKOFF = RetryPolicy(base_s=0.5, cap_s=5.0)  # a batch's step that raised
_T = TypeVar("_T")


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
    """The batches in flight none of whose items' units is held any more (their
    partitions closed here): nothing they answer could be staged, so they are cancelled
    and their limiter slots freed, instead of waiting for the model."""
    return [task for task, items in tasks.items() if not any(i.unit.held for i in items)]


class Dispatch:
    """Launches closed windows as batches, solves them and hands their records to staging;
    owns the batches in flight, the quality sample, the twins and the spend. A batch is
    asked, sampled and built on the edition of the spec live when it was launched."""

    def __init__(
        self,
        shared: Shared,
        llm: Model,
        *,
        limiter: Limiter,
        probe: Probe,
        worker: str,
        staging: Staging,
        second: Model | None = None,  # model.escalate's client
        journal: AnswerJournal | None = None,
    ) -> None:
        settings, live, size = shared.settings, shared.live, shared.size
        self.settings = settings
        self.journal = journal  # answers kept until committed: a redo does not ask again
        self.live = live
        self.llm = llm
        self.size = size
        self.limiter = limiter
        self.metrics = shared.metrics
        self.builder = shared.builder
        self.probe = probe
        self.worker = worker
        self.staging = staging
        self.queued_turns = shared.queued_turns
        self.flows = shared.flows
        metrics = shared.metrics
        # quality.*: the shadow sample (its controller moves the size), second opinions.
        self.quality = QualityControl(live, llm, metrics, settings.max_attempts, size, second)
        self.twins = Twins(live)  # dedupe: twins asked once
        # budget: paced to the spend ceiling (read once: the context topic does not change it)
        self.spend = Spend(live.spec.budget, metrics)
        self.batches = 0
        self.tasks: dict[asyncio.Task[None], list[Staged]] = {}  # batches in flight

    async def stop(self) -> None:
        await self.quality.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def launch(self, items: list[Staged], reason: str) -> None:
        """A closed window (`items`) as one batch: waits for a limiter slot and the spend
        pace, then solves and stages it in a task of its own, on the spec live now."""
        self.twins.closed()
        await self.limiter.acquire()
        await self.spend.wait()  # held here, the windower and the intake hold too
        self.batches += 1
        batch_id = f"{self.worker}-{self.batches}"
        self.metrics.observe_batch(len(items), reason)
        self.metrics.batch_started()
        # The batch keeps this edition to its end: a change meanwhile is the next batch's.
        edition = self.live.edition
        task = asyncio.create_task(self._run(batch_id, items, edition), name=batch_id)
        self.tasks[task] = items
        task.add_done_callback(lambda done: self.tasks.pop(done, None))

    async def _run(self, batch_id: str, items: list[Staged], edition: Edition) -> None:
        try:
            live = [i for i in items if i.unit.held]
            if not live:
                return  # every item's partition moved on: its new owner redoes them
            with batch_span(batch_id, [context_of(i.slot.headers) for i in live if i.slot]):
                solved = await self._solved(batch_id, live, edition)
            try:
                self.staging.stage(batch_id, live, solved)
            except Exception as exc:  # a bug: the units redo their prefix, nothing is lost
                log.exception("batch %s: staging failed", batch_id)
                for item in live:
                    item.unit.fail(exc)
        finally:
            self.queued_turns.done(items)  # staged, or never to be (its unit dropped)
            self.limiter.release()
            self.metrics.batch_ended()
            self.spend.ended()

    async def _solved(self, batch_id: str, items: list[Staged], edition: Edition) -> Solved:
        """The batch's records; an unexpected error retries it, then dead-letters its
        items with the error, so nothing is committed without an outcome."""
        instances = [i.instance for i in items]
        # A redo's answers that came back before its crash: taken once, outside the
        # retries (runtime/pipeline/journal.py).
        taken, asked = self._journaled(instances, edition)

        async def solve() -> Solved:
            # Each content asked once: twins and cached answers are not asked again.
            outcome = await self._once(asked, edition) if asked else Outcome()
            if self.journal is not None:  # durable before anything of it is staged
                await self.journal.write(outcome.answers, edition)
                outcome.answers += taken
            self.probe.at("solved")
            if self.flows is not None:
                outcome = await self._read_back(items, outcome)
            self.metrics.observe_tokens(
                outcome.prompt_tokens,
                outcome.completion_tokens,
                outcome.cached_tokens,
                len({id(a.instance) for a in outcome.answers}),
            )
            tx, flow = self._turns(edition)
            planned = self.builder.at(edition).batch(batch_id, outcome, flow)
            if self.journal is not None:  # each entry leaves with its item's outcome
                planned.records += self.journal.tombstones(outcome.answers)
            self.probe.at("after_llm")  # the batch's records built, none staged yet
            return Solved(planned, tx)

        solved = await retried(batch_id, "solving", solve)
        if not isinstance(solved, Exception):
            return solved
        tx, flow = self._turns(edition)
        return Solved(
            self.builder.internal_errors(batch_id, instances, solved, BATCH_TRIES, flow), tx
        )

    def _journaled(
        self, instances: list[Instance], edition: Edition
    ) -> tuple[list[Answer], list[Instance]]:
        """(the answers the journal holds for `instances`, those to ask)."""
        if self.journal is None:
            return [], instances
        return self.journal.take(instances, edition)

    def _turns(self, edition: Edition) -> tuple[Transaction | None, Workflow | None]:
        """A transaction for a batch's turns, and the workflow over it on the batch's
        `edition` (stateless: none)."""
        if self.flows is None:
            return None, None
        tx = self.flows.change()
        return tx, self.flows.over(tx, edition)

    async def _read_back(self, items: list[Staged], outcome: Outcome) -> Outcome:
        """The states the answer's turns are played on, read back where a workflow
        finished while the batch was asked (a unit reopened offered its turn again, and
        that batch ended it first): every item's instance, just before its turn is
        made, with nothing awaited between. An item whose unit is gone, or failed reading back,
        is left out of the outcome (its partition's owner redoes it); the others go on."""
        assert self.flows is not None
        gone: set[str] = set()
        for item in items:
            if not await recalled(self.flows.stores, item.unit, item.instance.id):
                gone.add(item.instance.id)
        gone |= {i.instance.id for i in items if not i.unit.held}
        return _without(outcome, gone) if gone else outcome

    async def _once(self, instances: list[Instance], edition: Edition) -> Outcome:
        """The outcome of the whole window, each content asked once: its twins here, in
        the cache, or asked by another batch in flight (windows/twins.py)."""
        split = self.twins.split(instances, edition)
        try:
            outcome = await self._ask(split.asked, edition)
        except BaseException:  # a failed ask must not leave twins elsewhere waiting for it
            self.twins.settle(split, None)
            raise
        self.twins.settle(split, outcome)
        alone = await self.twins.waited(split)  # their twin's batch ended without an answer
        if alone:
            merge(outcome, await self._ask(alone, edition))
        return self.twins.expand(outcome, split)

    async def _ask(self, instances: list[Instance], edition: Edition) -> Outcome:
        solver = edition.solver(self.llm, self.settings.max_attempts)
        outcome = await solver.solve(instances)
        self.size.learn(outcome, len(instances))
        await self.quality.after(outcome, edition)
        return outcome


def _without(outcome: Outcome, gone: set[str]) -> Outcome:
    """`outcome` less everything about the instances `gone` (their units redo them)."""
    return dataclasses.replace(
        outcome,
        answers=[a for a in outcome.answers if a.instance.id not in gone],
        unanswered=[u for u in outcome.unanswered if u.instance.id not in gone],
        refusals=[r for r in outcome.refusals if r[1] is None or r[1].id not in gone],
    )
