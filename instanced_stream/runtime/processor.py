"""The processor's pipeline: everything between a delivered record and its acknowledged
outcome, assembled from pieces with one job each:

- `Batcher` (batcher.py): offer, window, launch, in-flight ordering, solving;
- `RecordBuilder` (records.py): a solved batch to the records to publish, pure;
- `Delivery` (delivery.py): publish, dead-letter on refusal, retry, fatal, offsets;
- `Coordinator` (coordinator.py): results, approvals, turns and expiry of workflows.

The faust app around it (agents, timers, rebalances) is in app.py; docs/architecture.md
draws the whole.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.model import Model
from instanced_stream.core.overrides import Refused
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.workflow import Workflow
from instanced_stream.llm.factory import resolve_api_key
from instanced_stream.llm.limiter import Limiter
from instanced_stream.ops.metrics import Metrics
from instanced_stream.runtime.batcher import Batcher, Item
from instanced_stream.runtime.coordinator import Coordinator
from instanced_stream.runtime.delivery import Delivery, Fatal, Sink
from instanced_stream.runtime.offsets import Entry, OffsetLedger
from instanced_stream.runtime.probe import NO_PROBE, Probe
from instanced_stream.runtime.records import RecordBuilder, call_id
from instanced_stream.runtime.windowing import Windower
from instanced_stream.settings import Settings

# resolve_api_key: its home is instanced_stream.llm.factory; re-exported for older imports.
__all__ = ["ModelClient", "Pipeline", "call_id", "limiter_for", "resolve_api_key"]

log = logging.getLogger("stream.processor")


class ModelClient(Model, Protocol):
    """The model as the pipeline holds it: it answers, and it is closed at the end."""

    async def close(self) -> None: ...


def limiter_for(spec: AgentSpec, metrics: Metrics) -> Limiter:
    """The in-flight limiter the spec asks for, reporting its limit to the metrics."""
    return Limiter(
        spec.window.max_in_flight, adaptive=spec.window.adaptive, on_change=metrics.on_limit
    )


class Pipeline:
    """Assembled once, from what it is given: `llm` must have been built with the same
    `metrics` (as its listener) and `limiter`; left out, both are made here (tests)."""

    def __init__(
        self,
        settings: Settings,
        spec: AgentSpec,
        llm: ModelClient,
        publisher: Sink,
        *,
        metrics: Metrics | None = None,
        limiter: Limiter | None = None,
        workflow: Workflow | None = None,
        on_fatal: Fatal | None = None,
        probe: Probe = NO_PROBE,
    ) -> None:
        self.spec = spec
        self.llm = llm
        self.publisher = publisher
        self.workflow = workflow
        if metrics is None:
            metrics = Metrics(spec.model)
        self.metrics = metrics
        self.limiter = limiter if limiter is not None else limiter_for(spec, metrics)
        self.ledger = OffsetLedger()
        self.worker = secrets.token_hex(3)
        if workflow is not None:
            # Every state this process changes carries its id: recovery takes over only
            # what an earlier process (or a moved partition's last owner) left.
            workflow.owner = self.worker
        self.builder = RecordBuilder(spec, settings.topics, llm.model)
        self.delivery = Delivery(
            publisher,
            self.builder,
            self.metrics,
            self.ledger,
            probe,
            on_fatal,
            settings.max_output_bytes,
        )
        self.coordinator = Coordinator(
            workflow, self.builder, self.delivery, self.metrics, self.worker
        )
        self.batcher = Batcher(
            settings,
            spec,
            llm,
            ledger=self.ledger,
            limiter=self.limiter,
            metrics=self.metrics,
            builder=self.builder,
            delivery=self.delivery,
            coordinator=self.coordinator,
            probe=probe,
            worker=self.worker,
        )
        self.started = False

    @property
    def windower(self) -> Windower[Item]:
        return self.batcher.windower

    @property
    def tasks(self) -> set[asyncio.Task[None]]:
        """The batches in flight."""
        return self.batcher.tasks

    @property
    def stats(self) -> Counter[str]:
        """Every count so far, read from the metrics (a copy: nothing counts here)."""
        return Counter(self.metrics.counts())

    def reconfigure(self, spec: AgentSpec, refused: Refused) -> None:
        """Takes a new spec (from the context topic); batches in flight finish as asked."""
        self.refused(refused)
        self.batcher.reconfigure(spec)
        self.builder.spec = self.spec = spec
        if self.workflow is not None:
            self.workflow.spec = spec  # a finish advisor from the context is heard too

    def refused(self, refused: Refused) -> None:
        """Says which context messages were refused, and why."""
        for key, reason in refused:
            log.error("context message %s refused: %s", key, reason)
        self.metrics.context_refused.set(len(refused))

    async def start(self) -> None:
        await self.publisher.start()
        self.batcher.start()
        self.started = True

    async def drain(self, deadline_s: float) -> None:
        """Shutdown (SIGTERM): lets the batches in flight finish, so a rolling update
        does not ask the model again for what it already answered."""
        left = await self.batcher.drain(deadline_s)
        if left:
            log.warning("drain: %d batches still in flight at the deadline; redone later", left)
        else:
            log.info("drain: every batch in flight was delivered")

    async def stop(self) -> None:
        self.started = False
        await self.batcher.stop()
        await self.publisher.stop()
        await self.llm.close()

    async def offer(
        self,
        value: bytes | None,
        key: bytes | None,
        source: SourcePosition,
        ack: Callable[[], object],
    ) -> None:
        """Takes one delivered record. Awaits while all batch slots are busy."""
        await self.batcher.offer(value, key, source, ack)

    async def on_result(self, value: bytes | None, entry: Entry | None) -> None:
        """An activity's result for an awaited call: into state, then maybe a next turn."""
        await self._next_turns(await self.coordinator.on_result(value))
        if entry is not None:
            self.ledger.finish(entry)

    async def on_approval(self, value: bytes | None, entry: Entry | None) -> None:
        """A person approved or rejected a lazy plan's proposal."""
        await self._next_turns(await self.coordinator.on_approval(value))
        if entry is not None:
            self.ledger.finish(entry)

    async def expire(self, owns: Callable[[int], bool] = lambda _: True) -> None:
        """Awaited calls past their deadline, of the partitions this worker owns."""
        await self._next_turns(await self.coordinator.expire(time.time(), owns))

    async def recover(self, owns: Callable[[int], bool]) -> None:
        """Newly owned partitions: what their workflows owe goes out, their ready
        instances take their next turn."""
        await self._next_turns(await self.coordinator.recover(owns))

    async def _next_turns(self, instances: list[Instance]) -> None:
        for inst in instances:
            await self.batcher.enqueue_turn(inst)
