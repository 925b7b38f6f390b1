"""The stager: the pipeline's stages built and connected, consumed records and next turns
in (docs/architecture.md, exactly once). It holds no step of an item's walk itself; the
walk, module by module, is docs/architecture.md's "The walk of one item".

Batches still span every partition this process owns (fewer, fuller LLM requests); what
binds an item to exactly-once delivery is its slot on its partition's unit.

What the stager is given from outside the pipeline comes as two frozen values, built once
by the composition root (runtime/assembly.py) and handed through `assemble_pipeline`
whole: how the pipeline reaches the model (`ModelAccess`) and what the process hosting
it lends it (`Hosting`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from aiokafka import ConsumerRecord

from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.model import Model
from instanced_stream.core.tokenizer import Tokenizer
from instanced_stream.faultpoints import NO_PROBE, Probe
from instanced_stream.kafka.schemas import output_frames
from instanced_stream.llm.limiter import Limiter
from instanced_stream.observe.metrics import Metrics
from instanced_stream.runtime.pipeline.admission import Admission
from instanced_stream.runtime.pipeline.dispatch import Dispatch
from instanced_stream.runtime.pipeline.journal import AnswerJournal
from instanced_stream.runtime.pipeline.outcomes.records import (
    RecordBuilder,
)
from instanced_stream.runtime.pipeline.queued_turns import QueuedTurns
from instanced_stream.runtime.pipeline.shared import Shared
from instanced_stream.runtime.pipeline.staged import Settled, Staged, bound_of, freeing, tokens_of
from instanced_stream.runtime.pipeline.staging import Staging
from instanced_stream.runtime.pipeline.tier import ONLINE, Tier
from instanced_stream.runtime.pipeline.windows.window_size import WindowSize
from instanced_stream.runtime.pipeline.windows.windowing import Windower
from instanced_stream.runtime.pipeline.workflows import Flows
from instanced_stream.runtime.units.unit import Slot, Unit, UnitGone
from instanced_stream.settings import Settings

__all__ = ["Hosting", "ModelAccess", "Stager"]

log = logging.getLogger("stream.processor")


@dataclass(frozen=True, slots=True)
class ModelAccess:
    """How the pipeline gets a window answered: the model it asks (`llm`), the limiter of
    its requests in flight, model.escalate's client (`second`), the tier items reach the
    model by (`ONLINE`, or the Batch API's `Submissions`), and the answer journal a redo
    takes its answers from instead of asking again (None: STREAM_ANSWER_JOURNAL off)."""

    llm: Model
    limiter: Limiter
    second: Model | None = None
    tier: Tier = ONLINE
    journal: AnswerJournal | None = None


@dataclass(frozen=True, slots=True)
class Hosting:
    """What the process that runs the pipeline lends it: its name (`worker`, in its
    batches' ids and its workflows' records), its metrics, its fault probe (`NO_PROBE` in
    production) and where the next turns a batch's turns made ready go (`ready`: the
    service's `Routes.ready`; None: nobody takes them, a rig that looks itself)."""

    worker: str
    metrics: Metrics
    probe: Probe = NO_PROBE
    ready: Callable[[Unit, list[Instance]], None] | None = None


class Stager:
    """Wiring: builds admission, the windower, dispatch and staging on the live spec and
    connects them. Each reads the spec from its one holder (`LiveSpec`, core/live_spec.py)
    when it needs it: a change installed there is heard by all, and written into none.
    `builder` and `flows` (None: a stateless spec) are the pipeline's own, built on the
    same live spec (`assemble_pipeline`)."""

    def __init__(
        self,
        settings: Settings,
        live: LiveSpec,
        access: ModelAccess,
        hosting: Hosting,
        *,
        builder: RecordBuilder,
        flows: Flows | None = None,
    ) -> None:
        tier, metrics, limiter = access.tier, hosting.metrics, access.limiter
        self.tier = tier
        self.flows = flows
        self.metrics = metrics
        self.builder = builder
        # Read once, at the start: the outputs' schemas are the start's (docs/schema-registry.md),
        # and the context topic changes advisors and inputs, not the model (its tokenizer)
        # or the window's wait.
        spec = live.spec
        builder.frames = output_frames(settings, spec)  # refuses a breaking output schema
        self.queued_turns = QueuedTurns()
        self.tokenizer = Tokenizer(spec.model.name)
        # The one author of the window's size: spec, limiter, output budget, quality.
        self.size = WindowSize(live, self.tokenizer, limiter)
        self.staging = Staging(
            settings,
            metrics=metrics,
            builder=builder,
            tier=tier,
            flows=flows,
            ready=hosting.ready,
        )
        shared = Shared(
            settings, live, metrics, builder, flows, self.size, self.tokenizer, self.queued_turns
        )
        self.dispatch = Dispatch(
            shared,
            access.llm,
            limiter=limiter,
            probe=hosting.probe,
            worker=hosting.worker,
            staging=self.staging,
            second=access.second,
            journal=access.journal,
        )
        self.admission = Admission(shared)
        self.windower: Windower[Staged] = Windower(
            size=self.size,
            max_wait_s=spec.window.max_wait_ms / 1000,
            on_close=self.dispatch.launch,
            tokens_of=functools.partial(tokens_of, self.tokenizer),
            bound_of=functools.partial(bound_of, self.tokenizer),
            free=freeing(self.dispatch.twins),
        )
        self.draining = False

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

    async def landed(self, units: Collection[Unit], deadline_s: float) -> int:
        """Gives the batches in flight with items on `units` (suspended: their partitions
        revoked) up to `deadline_s` to come back and be journaled and staged on them, so
        the revocation's commit carries their outcomes; returns how many did not. A batch
        launched meanwhile with items of theirs is waited for too: its answer would come
        back as late."""
        end = time.monotonic() + deadline_s
        ids = {id(u) for u in units}
        while pending := [
            task
            for task, items in self.dispatch.tasks.items()
            if any(id(i.unit) in ids for i in items)
        ]:
            left = end - time.monotonic()
            if left <= 0:
                return len(pending)
            await asyncio.wait(pending, timeout=left)
        return 0

    async def stop(self) -> None:
        await self.windower.stop()
        await self.dispatch.stop()

    async def take(self, unit: Unit, record: ConsumerRecord[bytes, bytes], slot: Slot) -> None:
        """One fetched input record, tracked on `slot` of its unit: admitted and handed
        on, unless its unit no longer serves (its partition's next owner redoes it). An
        error fails its unit only (a dependency refusing, a bug): the partition is
        reopened after a back-off, the others go on."""
        try:
            unit.check()
            await self._handed(await self.admission.fetched(unit, record, slot))
        except UnitGone:
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("partition %d: an input could not be taken", record.partition)
            unit.fail(exc)

    async def offer(
        self, unit: Unit, source: SourcePosition, key: bytes | None, value: bytes | None, slot: Slot
    ) -> None:
        """One consumed input record, tracked on `slot` of its unit. Awaits while every
        batch slot is busy (the caller pauses fetching meanwhile)."""
        await self._handed(await self.admission.record(unit, source, key, value, slot))

    async def _handed(self, item: Staged | Settled | None) -> None:
        """What admission made of a record: its outcome written, or the item windowed."""
        if isinstance(item, Settled):
            self.staging.settle(item)
        elif item is not None:
            await self.tier.offer(item, self.windower)

    async def offer_turn(self, unit: Unit, inst: Instance) -> None:
        """A workflow's next turn joins the window like any item."""
        item = self.admission.turn(unit, inst)
        if item is not None:
            await self.tier.offer(item, self.windower)
