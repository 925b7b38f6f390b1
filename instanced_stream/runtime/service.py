"""The processor on units (DESIGN.md section 8): membership, units and the stager,
assembled once and run until SIGTERM or SIGINT.

The fetch loop hands input records to the intake task through a queue of one fetch at a
time, and holds the input partitions (consumer pause) while that queue is full, so an
LLM outage pauses consumption without stalling the group: the consumer keeps polling,
heartbeats and rebalances go on. Nothing here knows about transactions; the units do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from instanced_stream.core.instance import Instance
from instanced_stream.core.overrides import Messages, apply_overrides
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.workflow import Workflow
from instanced_stream.llm.factory import build_llm
from instanced_stream.ops.metrics import Metrics
from instanced_stream.ops.web import WebServer
from instanced_stream.runtime.guard import refused
from instanced_stream.runtime.intake import source_of
from instanced_stream.runtime.membership import Fetched, Membership
from instanced_stream.runtime.overrides import OverrideFollower
from instanced_stream.runtime.probe import NO_PROBE, Probe
from instanced_stream.runtime.processor import limiter_for
from instanced_stream.runtime.publish import OutRecord
from instanced_stream.runtime.records import RecordBuilder
from instanced_stream.runtime.stager import Stager
from instanced_stream.runtime.store import Stores
from instanced_stream.runtime.topics import state_changelog
from instanced_stream.runtime.unit import Unit
from instanced_stream.runtime.workflows import Flows
from instanced_stream.settings import Settings

__all__ = ["run_units"]

log = logging.getLogger("stream.processor")


_FETCH_MS = 200
_FETCH_RECORDS = 2000
# Fetches queued for the intake before the input is held: a few, so the intake never
# waits for a fetch's round trip, and a hold (which drops what the client prefetched)
# happens only when the window really cannot take more (an LLM outage, a slow model).
_QUEUED_FETCHES = 4
_HELD_POLL_MS = 20  # while held: results and approvals still flow, heartbeats go on


class _Service:
    def __init__(
        self,
        settings: Settings,
        spec: AgentSpec,
        bootstrap: str,
        llm_url: str,
        overrides: tuple[Messages, dict[int, int]],
        probe: Probe,
    ) -> None:
        self.settings = settings
        topics = settings.topics
        self.metrics = Metrics(spec.model)
        self.limiter = limiter_for(spec, self.metrics)
        self.llm = build_llm(
            settings, spec, listener=self.metrics, limiter=self.limiter, base_url=llm_url
        )
        messages, ends = overrides
        merged, refused = apply_overrides(spec, messages)
        for key, reason in refused:
            log.error("context message %s refused: %s", key, reason)
        self.metrics.context_refused.set(len(refused))
        self.worker = secrets.token_hex(3)
        self.builder = RecordBuilder(merged, topics, self.llm.model)
        self.bootstrap = bootstrap
        self.flows: Flows | None = None
        # The seeds: no Plan message, one-shot and stateless. A plan-less spec gets no
        # store, no changelog and no workflow: nothing of an instance outlives its request.
        if merged.plan is not None:
            stores = Stores()
            workflow = Workflow(
                merged, stores, settings.pending_timeout_s, settings.state_retention_s, self.worker
            )
            self.flows = Flows(
                workflow,
                stores,
                self.builder,
                self.metrics,
                self.worker,
                state_changelog(settings),
                settings.max_output_bytes,
            )
        self.stager = Stager(
            settings,
            merged,
            self.llm,
            limiter=self.limiter,
            metrics=self.metrics,
            builder=self.builder,
            probe=probe,
            worker=self.worker,
            flows=self.flows,
        )
        self.turns: asyncio.Queue[tuple[Unit, Instance]] = asyncio.Queue()
        group = settings.topic_prefix + settings.app_id
        self.membership = Membership(
            bootstrap,
            group,
            [topics.input, topics.results, topics.approvals],
            transactional=settings.delivery == "exactly_once",
            transactional_prefix=f"{group}.{topics.input}",
            session_timeout_s=settings.session_timeout_s,
            client_id=f"{group}-{self.worker}",
            on_open=self._opened if self.flows is not None else None,
            on_close=self._closed if self.flows is not None else None,
            replace=self._refused,
        )
        self.follower = OverrideFollower(
            bootstrap, topics.context, spec, messages, ends, self._reconfigure
        )
        self.web = WebServer(
            self.metrics,
            lambda: self.started and not self.membership.rebalancing and self.metrics.endpoint_ok,
            settings.web_host,
            settings.web_port,
        )
        self.started = False
        self.queue: asyncio.Queue[list[Fetched]] = asyncio.Queue(maxsize=_QUEUED_FETCHES)
        self.stopping = asyncio.Event()

    async def _opened(self, unit: Unit) -> None:
        """A stateful unit: its store restored before it takes work; the workflows that
        wait for a turn resume."""
        assert self.flows is not None
        store = self.flows.store_for(unit.partition)
        states = await store.restore(self.bootstrap)
        ready = self.flows.ready(unit.partition)
        log.info(
            "partition %d: %d states restored, %d workflows resume their next turn",
            unit.partition,
            states,
            len(ready),
        )
        self._ready(unit, ready)

    def _refused(self, record: OutRecord, said: str) -> list[OutRecord]:
        """A record the broker refused for itself: its item's dead letter instead."""
        letters = refused([record], self.settings.max_output_bytes, self.builder, said)
        self.stager.count(letters)
        return letters.records

    def _closed(self, unit: Unit) -> None:
        assert self.flows is not None
        self.flows.stores.drop(unit.partition)

    def _ready(self, unit: Unit, ready: list[Instance]) -> None:
        for inst in ready:
            self.turns.put_nowait((unit, inst))

    def _reconfigure(self, spec: AgentSpec, refused: list[tuple[str, str]]) -> None:
        for key, reason in refused:
            log.error("context message %s refused: %s", key, reason)
        self.metrics.context_refused.set(len(refused))
        self.stager.reconfigure(spec)
        self.builder.spec = spec

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        await self.membership.start()
        self.stager.start()
        try:
            await self.web.start()
        except OSError as exc:  # a busy port costs the page and probes, never the stream
            log.warning("web server not started on port %d: %s", self.web.port, exc)
        await self.follower.start()
        self.started = True
        log.info("processor %s started (delivery %s)", self.worker, self.settings.delivery)
        intake = asyncio.create_task(self._intake(), name="intake")
        intake.add_done_callback(self._intake_ended)
        tasks = [
            intake,
            asyncio.create_task(self._next_turns(), name="turns"),
            asyncio.create_task(_every(5.0, self._lag), name="lag"),
            asyncio.create_task(_every(1.0, self._expire), name="expire"),
            asyncio.create_task(_every(30.0, self._report), name="report"),
        ]
        try:
            await self._fetch_loop()
        finally:
            self.started = False
            left = await self.stager.drain(self.settings.drain_s)
            if left:
                log.warning("drain: %d batches still in flight; redone by the next owner", left)
            else:
                log.info("drain: every batch in flight was delivered")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.stager.stop()
            await self.membership.stop()
            await self.follower.stop()
            await self.web.stop()
            await self.llm.close()

    async def _fetch_loop(self) -> None:
        while not self.stopping.is_set():
            await self.membership.heal()
            held = self.queue.full()
            self.membership.hold_input(held)
            fetched = await self.membership.fetch(
                _HELD_POLL_MS if held else _FETCH_MS, _FETCH_RECORDS
            )
            inputs: list[Fetched] = []
            for got in fetched:
                if got.record.topic == self.membership.input:
                    inputs.append(got)
                else:
                    self._other(got)
            if inputs:
                # The input was held before this fetch whenever the queue was full, and
                # only this loop fills it: the put does not wait, so the consumer keeps
                # polling (a member that stops polling is put out of the group).
                await self.queue.put(inputs)

    async def _intake(self) -> None:
        while True:
            chunk = await self.queue.get()
            for got in chunk:
                if not got.unit.alive or self.stager.draining:
                    continue  # its partition's next owner (or this one, reopened) redoes it
                rec = got.record
                source = source_of(rec.topic, rec.partition, rec.offset, rec.key, rec.timestamp)
                await self.stager.offer(got.unit, source, rec.key, rec.value, got.slot)

    def _intake_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.critical("the intake failed, stopping: %r", task.exception())
            self.stopping.set()

    async def _next_turns(self) -> None:
        while True:
            unit, inst = await self.turns.get()
            if unit.alive and not self.stager.draining:
                await self.stager.offer_turn(unit, inst)

    def _other(self, got: Fetched) -> None:
        """A result or an approval: its change staged on its slot. A stateless spec has
        nothing awaiting them: they are read and committed, never decided."""
        if self.flows is None:
            self.metrics.count({"results_ignored": 1})
            got.unit.finish(got.slot)
            return
        rec, topics = got.record, self.settings.topics
        if rec.topic == topics.results:
            change = self.flows.on_result(rec.value, rec.partition)
        else:
            change = self.flows.on_approval(rec.value, rec.partition)
        self._ready(got.unit, self.stager.staged(got.unit, got.slot, change))

    async def _expire(self) -> None:
        if self.flows is None or self.membership.rebalancing:
            return
        for partition, change in self.flows.expire().items():
            unit = self.membership.units.get(partition)
            if unit is not None and unit.alive:
                self._ready(unit, self.stager.staged(unit, None, change))

    async def _lag(self) -> None:
        self.metrics.set_lag(await self.membership.lag())

    async def _report(self) -> None:
        log.info(
            "stats %s open=%d in_flight=%d rebalances=%d",
            orjson.dumps(self.metrics.counts()).decode(),
            sum(u.open_slots() for u in self.membership.units.values()),
            len(self.stager.tasks),
            self.membership.rebalances,
        )


async def _every(seconds: float, step: Callable[[], Awaitable[Any]]) -> None:
    """A timer that survives its step's errors: logged, and tried again next time."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("timer %s failed; it runs again in %.0fs", step.__name__, seconds)


def run_units(
    settings: Settings,
    spec: AgentSpec,
    bootstrap: str,
    llm_url: str,
    overrides: tuple[Messages, dict[int, int]],
    probe: Probe = NO_PROBE,
) -> int:
    """`stream process` with `STREAM_DELIVERY=exactly_once`: runs until stopped."""

    async def main() -> None:
        service = _Service(settings, spec, bootstrap, llm_url, overrides, probe)
        with contextlib.suppress(asyncio.CancelledError):
            await service.run()

    asyncio.run(main())
    return 0
